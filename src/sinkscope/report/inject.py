"""The report sections of ``sinkscope inject``: the injection probe's dose response, the exposure probe's table.

- ``injection``: the clean loss in the summary; ``inject_loss_delta`` as one dose-response figure
  per junk type (one line per cutoff, and run) and one table of every condition (± one standard
  error over windows); the probe's other rows (``inject_loss``, the draws) stay in the tables;
- ``exposure``: its metrics are drawn per layer like any other (``generic.py``); its section adds
  Wang 2026 Table 11's layout (quiet mass at each cutoff and phantom mass, per run) and a note on
  the averaging convention.
"""

from __future__ import annotations

import pandas as pd

from sinkscope.report import curves, figures
from sinkscope.report.page import Page, _pm, fmt
from sinkscope.report.runs import RunData, _model_value

#: the exposure section's note: the averaging convention beside p0_mass's.
EXPOSURE_NOTE = ("Quiet and phantom mass are averaged over every query, row 0 included, as Wang 2026's Tables 3 and 11 "
                 "are (p0_mass and phantom_mass average over queries i >= 1); the quiet set is the reads of a value "
                 "head with norm strictly below the median or 25th percentile of that window's read norms.")
INJECTION_NOTE = ("Each condition adds junk of norm eps x the head's median read norm to every quiet read (norm "
                  "strictly below the cutoff) of every value head in every layer, before any gate; the quiet set, "
                  "m_h and transplanted junk come from the clean pass of the same batch (junk source clean; "
                  "'corrupted': from the reads each layer receives under corruption). The loss increase is the mean "
                  "next-token loss under corruption, over the seeded draws of the junk, minus the clean loss on the "
                  "same windows; error bars and ± are one standard error over windows (sd with n - 1, over sqrt n; "
                  "each window's increase averaged over its draws). The y axis is logarithmic: increases <= 0 are "
                  "not drawn (the table has them).")
INJECTION, EXPOSURE = "injection", "exposure"


# ---- the section protocol (page.py) ------------------------------------------------------------------


def handles(probe: str, metric: str, runs: list[RunData]) -> bool:
    """Every metric of the injection probe (exposure's are drawn per layer, by ``generic.py``)."""
    return probe == INJECTION


def entry(page: Page, metric: str) -> dict | None:
    """The clean loss: a summary row; the loss increase: figures and the table of every condition."""
    if metric == "inject_loss_clean":
        info = page.info(metric)
        page.add_summary(metric, info.label, info.direction, [fmt(_model_value(r.table, metric)) for r in page.runs])
        return None
    if metric == "inject_loss_delta":
        return _dose_entry(page)
    return None


def note(probe: str, metrics: list[str]) -> str | None:
    return {INJECTION: INJECTION_NOTE, EXPOSURE: EXPOSURE_NOTE}.get(probe)


def tables(page: Page, probe: str) -> list[dict]:
    return [_exposure_table(page.runs)] if probe == EXPOSURE else []


# ---- injection ---------------------------------------------------------------------------------------


def _injection_points(run: RunData, metric: str = "inject_loss_delta") -> pd.DataFrame:
    """The run's rows of one injection metric: columns junk, cutoff, dose, value, se (the row's ``se``; the
    ``_se`` row of a run made in 2026-12 before the column; NaN where the run has none: one window, or a
    run made before standard errors)."""
    table = run.table
    if "junk" not in table.columns:
        return pd.DataFrame(columns=["junk", "cutoff", "dose", "value", "se"])

    def rows_of(name: str, column: str = "value") -> pd.DataFrame:
        rows = table[(table.metric == name) & table["junk"].notna()]
        values = rows[column].astype(float) if column in rows.columns else float("nan")
        return pd.DataFrame({"junk": rows["junk"].astype(str), "cutoff": rows["cutoff"].astype(str),
                             "dose": rows["dose"].astype(float), column: values})

    points = rows_of(metric).merge(rows_of(metric, "se"), on=["junk", "cutoff", "dose"], how="left")
    if (table.metric == f"{metric}_se").any() and points["se"].isna().all():  # the separate rows of early 2026-12
        legacy = rows_of(f"{metric}_se").rename(columns={"value": "se"})
        points = points.drop(columns="se").merge(legacy, on=["junk", "cutoff", "dose"], how="left")
    return points


def _injection_caption(runs: list[RunData]) -> str:
    """The table's caption: what the ± is, with the windows (the manifest's n_seqs) and draws of the runs."""
    windows, draws, sources = set(), set(), set()
    for run in runs:
        if _injection_points(run)["se"].notna().any():
            n = (run.manifest.get("windows") or {}).get("n_seqs")
            if n is None:
                n = (run.manifest.get("options") or {}).get("n_seqs")
            if n is not None:
                windows.add(int(n))
        options = ((run.manifest.get("probes") or {}).get(INJECTION) or {}).get("options") or {}
        draws.add(int(options.get("draws", 1)))
        sources.add(str(options.get("junk_source", "clean")))
    caption = "Loss increase (nats / token) per junk type, cutoff and dose"
    if windows:
        over = f"the {windows.pop()} windows" if len(windows) == 1 else "each run's windows"
        k = draws.pop() if len(draws) == 1 else None
        its = "its draws" if k is None else f"its {k} draws" if k > 1 else "its one draw"
        caption += f"; mean ± one standard error over {over} (each window's increase averaged over {its} of the junk)"
    if sources != {"clean"}:
        caption += f"; junk source {', '.join(sorted(sources))}"
    return caption


def _dose_entry(page: Page) -> dict | None:
    """One dose-response figure per junk type and one table of every condition (None without points)."""
    runs = page.runs
    points = pd.concat([_injection_points(r).assign(run=r.label) for r in runs], ignore_index=True)
    if points.empty:
        return None
    figs = []
    for junk in dict.fromkeys(points["junk"]):
        fig = curves.dose_response(points[points["junk"] == junk], junk, page.colours)
        figs.append(page.keep(fig, f"dose_response_{figures._file_stem(junk)}",
                              f"loss increase against dose, {junk} junk (one line per cutoff"
                              + (" and run" if len(runs) > 1 else "") + ")"))
    doses = sorted(set(points["dose"]))
    columns = (["run"] if len(runs) > 1 else []) + ["junk", "cutoff"] + [f"eps={d:g}" for d in doses]
    rows = []
    for run in runs:
        mine = points[points["run"] == run.label]
        for (junk, cutoff), part in mine.groupby(["junk", "cutoff"], sort=False):
            by_dose = {d: (v, e) for d, v, e in zip(part["dose"], part["value"], part["se"])}
            rows.append(([run.label] if len(runs) > 1 else []) + [junk, cutoff]
                        + [_pm(*by_dose[d]) if d in by_dose else "—" for d in doses])
    return {"metric": "inject_loss_delta", "info": page.info("inject_loss_delta"), "note": None, "figures": figs,
            "table": {"columns": columns, "rows": rows, "collapsed": False, "caption": _injection_caption(runs)}}


# ---- exposure ----------------------------------------------------------------------------------------


def _exposure_table(runs: list[RunData]) -> dict:
    """Wang 2026 Table 11's layout: per run, quiet mass at each cutoff and phantom mass (model values)."""
    metrics = [m for m in ("quiet_mass_median", "quiet_mass_q25", "exposure_phantom_mass")
               if any((r.table.metric == m).any() for r in runs)]
    columns = ["run"] + [{"quiet_mass_median": "quiet (median)", "quiet_mass_q25": "quiet (q25)",
                          "exposure_phantom_mass": "phantom"}[m] for m in metrics]
    rows = [[run.label] + [fmt(_model_value(run.table, m)) for m in metrics] for run in runs]
    return {"caption": "Exposure: share of each row's mass on quiet reads and on the phantom (mean over every query, "
                       "head and layer)", "columns": columns, "rows": rows}
