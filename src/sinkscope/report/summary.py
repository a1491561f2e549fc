"""The numbers a measuring command ends with: each run's headline metrics as a short table for the terminal
(``value ± se``, as lm-evaluation-harness ends a run), the same as JSON for scripts (``--json``), one row
per run for a comparison with the differences from its first run, and the runs of a folder listed
(``sinkscope ls runs``).

    summarise(path)        -> dict      a run folder, a comparison's folder or its report.html
    format_summary(dict)   -> str       the terminal's table
    list_runs(folder)      -> [dict]    every run under a folder, newest last
    format_listing([dict]) -> str

What a command's headline is (:data:`HEADLINES`): the model-level rows of its metrics (``layer`` and
``head`` empty in results.csv; the sliding / full layer-type means and stream's position buckets left out),
and the top heads by its headline metric. The values are results.csv's, unrounded in the JSON; the
terminal rounds ``value ± se`` to the se's first two significant digits (:func:`fmt_value_se`).

Tables in, text out: reads run folders (results.csv or .parquet, manifest.json), never a model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sinkscope.errors import SinkscopeError
from sinkscope.report.compare import condition_text, differences, model_rows, run_condition_columns
from sinkscope.report.runs import RunData, group_runs, read_run
from sinkscope.stats.paired import fmt_pm
from sinkscope.store.results import NOT_CONDITIONS

#: heads listed under a run's table.
TOP_HEADS = 5
#: model-level rows a command without a headline of its own shows (``measure``: the probes asked).
MAX_ROWS = 12
#: the metrics whose value is a position, a channel or a layer: not a number to compare.
INDEX_METRICS = ("massive_activation_channel", "massive_activation_position", "massive_activation_layer")


@dataclass(frozen=True)
class Headline:
    """What a command's summary shows.

    Attributes:
        metrics: the metrics whose model-level rows are shown, in this order (a metric the run does not
            have is left out; ``phantom_mass`` only for a model with a learned phantom key).
        top: the per-head metric whose top heads are listed, or None.
        lowest: list the lowest heads of ``top`` (``heads``: the dormant candidates) instead of the highest.
    """

    metrics: tuple[str, ...]
    top: str | None = None
    lowest: bool = False


#: each measuring command's headline (docs/commands/*.md); ``measure`` and anything else: every model-level row.
HEADLINES: dict[str, Headline] = {
    "sinks": Headline(("p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio", "massive_loss_delta"), "p0_mass"),
    "heads": Headline(("head_importance", "dormant", "load_imbalance", "loss_delta"), "head_importance", lowest=True),
    "selectivity": Headline(("gate_selectivity", "gate_mean", "token_share", "token_share_excess", "out_gate_mean",
                             "out_gate_first", "out_gate_sparsity"), "gate_selectivity"),
    "inject": Headline(("inject_loss_clean", "inject_loss_delta")),
    "circuit": Headline(("p0_norm_separates", "bos_sink_rate", "bos_repeat_loss_delta")),
    "stream": Headline(("stream_ppl", "p0_mass")),
    "explore": Headline(("p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio"), "p0_mass"),
}


# ---- numbers as the terminal prints them -------------------------------------------------------------


def _missing(x) -> bool:
    return x is None or (not isinstance(x, str) and pd.isna(x))


def fmt_value_se(value, se=None, sign: bool = False) -> str:
    """``0.09874 ± 0.00029``: the value rounded where its standard error's first two significant digits end
    (``0.0348732``, se ``2.02109e-05`` -> ``0.034873 ± 0.000020``); a zero se is shown (``± 0``: every window
    agrees); without an se four significant digits; ``—`` for no value; ``sign``: ``+`` on positives. The rule every table of sinkscope
    prints a value with (:func:`~sinkscope.stats.paired.fmt_pm`), the report's pages too."""
    return fmt_pm(value, se, sign=sign, missing="—")


def _number(x) -> float | None:
    """A JSON number (None for NaN and the infinities, which JSON has no number for)."""
    if _missing(x):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# ---- one run ---------------------------------------------------------------------------------------


def read_summary_run(path: Path, label: str | None = None) -> RunData:
    """A run folder's manifest and table, checked as the report reads them (no explorer data)."""
    return read_run(path, label, explorer=False)


def _has_phantom(run: RunData) -> bool:
    model = run.manifest.get("model")
    spec = model.get("spec") if isinstance(model, dict) else None
    if isinstance(spec, dict) and "has_phantom" in spec:
        return bool(spec["has_phantom"])
    values = run.table[run.table.metric == "phantom_mass"]["value"]
    return bool((values.fillna(0) != 0).any())


def _row_conditions(table: pd.DataFrame, skip: set[str]) -> list[dict]:
    """Each row's own condition columns that are set ({column: value}), run conditions left out."""
    columns = [c for c in table.columns if c not in NOT_CONDITIONS and c not in skip]
    out = []
    for values in table[columns].itertuples(index=False, name=None):
        out.append({c: _json_value(v) for c, v in zip(columns, values) if condition_text(v) is not None})
    return out


def _json_value(value):
    """A condition's value as JSON (whole numbers as ints)."""
    if isinstance(value, str):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return int(number) if number.is_integer() else number


def _model_rows(run: RunData, skip: set[str]) -> pd.DataFrame:
    """The run's model-level rows (no layer-type split, no position bucket), with a ``conditions`` column."""
    table = run.table
    keep = table["layer"].isna() & table["head"].isna()
    for column in ("layer_type", "position_bucket"):
        if column in table.columns:
            keep &= table[column].isna()
    rows = table[keep].copy()
    rows["conditions"] = _row_conditions(rows, skip)
    return rows


def _largest(rows: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per setting of the other conditions, the rows at the largest ``column`` (a dose, a repeat count)."""
    if column not in rows.columns or rows[column].isna().all():
        return rows
    values = pd.to_numeric(rows[column], errors="coerce")
    others = rows["conditions"].map(lambda c: tuple(sorted((k, str(v)) for k, v in c.items() if k != column)))
    top = values.groupby(others).transform("max")
    return rows[values == top]


def headline_rows(run: RunData, command: str | None, skip: set[str] | None = None) -> pd.DataFrame:
    """The model-level rows a run's summary shows (columns of results.csv plus ``conditions``)."""
    skip = run_condition_columns([run]) if skip is None else skip
    rows = _model_rows(run, skip)
    rows = rows[~rows["metric"].isin(INDEX_METRICS)]
    headline = HEADLINES.get(command or "")
    if headline is None:
        return rows.head(MAX_ROWS)
    parts = []
    for metric in headline.metrics:
        chosen = rows[rows["metric"] == metric]
        if chosen.empty or (metric == "phantom_mass" and not _has_phantom(run)):
            continue
        if metric == "inject_loss_delta" and len(chosen) > MAX_ROWS:
            chosen = _largest(chosen, "dose")
        if metric == "bos_repeat_loss_delta":
            chosen = _largest(chosen, "repeat")
        parts.append(chosen)
    return pd.concat(parts) if parts else rows.iloc[:0]


def top_heads(run: RunData, command: str | None) -> dict | None:
    """The top heads by the command's headline metric: {metric, order, heads: [{layer, head, value, se}]}."""
    headline = HEADLINES.get(command or "")
    table = run.table
    heads = table[table["layer"].notna() & table["head"].notna()]
    metric = headline.top if headline is not None else next(iter(dict.fromkeys(heads["metric"].astype(str))), None)
    if metric is None:
        return None
    rows = heads[heads["metric"] == metric]
    extra = [c for c in rows.columns if c not in NOT_CONDITIONS]
    if extra:  # a probe's conditions (lengths, thresholds): the heads of its first setting
        first = rows[extra].astype("string").fillna("").iloc[:1]
        if len(first):
            rows = rows[(rows[extra].astype("string").fillna("") == first.iloc[0]).all(axis=1)]
    if rows.empty:
        return None
    lowest = headline.lowest if headline is not None else False
    rows = rows.sort_values("value", ascending=lowest, kind="stable").head(TOP_HEADS)
    return {"metric": metric, "order": "lowest" if lowest else "highest",
            "heads": [{"layer": int(r.layer), "head": int(r.head), "value": _number(r.value),
                       "se": _number(getattr(r, "se", None))} for r in rows.itertuples(index=False)]}


def _metric_docs(run: RunData) -> dict[str, dict]:
    docs = {}
    for probe in (run.manifest.get("probes") or {}).values():
        if isinstance(probe, dict) and isinstance(probe.get("metrics"), dict):
            for metric, info in probe["metrics"].items():
                if isinstance(info, dict):
                    docs.setdefault(metric, info)
    return docs


def _get(node, *keys):
    for key in keys:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def run_summary(run: RunData, command: str | None = None) -> dict:
    """A run's headline as JSON-able data: command, folder, model, date, windows, metrics and top heads."""
    command = command or run.manifest.get("command")
    docs = _metric_docs(run)
    metrics = []
    for row in headline_rows(run, command).itertuples(index=False):
        info = docs.get(str(row.metric), {})
        metrics.append({"metric": str(row.metric), "conditions": row.conditions, "value": _number(row.value),
                        "se": _number(getattr(row, "se", None)), "n": int(row.n),
                        "label": info.get("label", ""), "direction": info.get("direction", "")})
    model = _get(run.manifest, "model", "source", "label") or _get(run.manifest, "model", "source", "location")
    return {"command": command, "path": str(run.path), "label": run.label, "model": model,
            "created": run.manifest.get("created"),
            "windows": {"n_seqs": _get(run.manifest, "windows", "n_seqs"),
                        "seq_len": _get(run.manifest, "windows", "seq_len"),
                        "seed": _get(run.manifest, "windows", "seed"),
                        "tokens_sha256": _get(run.manifest, "windows", "tokens_sha256")},
            "metrics": metrics, "top_heads": top_heads(run, command)}


# ---- a comparison --------------------------------------------------------------------------------------


def comparison_summary(folder: Path, record: dict, page: Path | None = None) -> dict:
    """A comparison's summary: one run summary per finished run, in order, and the differences of their
    headline rows from the first (``report.compare``: paired where the runs share windows and store them)."""
    names = [name for name in record["runs"] if (folder / name / "manifest.json").is_file()]
    labels = record.get("labels")
    label_of = dict(zip(record["runs"], labels)) if labels else {}
    runs = [read_summary_run(folder / name, label_of.get(name)) for name in names]
    command = next((r.manifest.get("command") for r in runs if r.manifest.get("command")), None)
    summaries = [run_summary(run, command) for run in runs]
    compared = group_runs(runs, record["group_by"]) if record.get("group_by") and runs else runs
    frame = model_rows(differences(compared))
    shown = {(m["metric"], _setting(m["conditions"])): m["conditions"] for s in summaries for m in s["metrics"]}
    diffs = []
    columns = [c for c in frame.columns if c not in ("run", "reference", "probe", "metric", "layer", "head", "value",
                                                     "reference_value", "difference", "se", "pairing", "n_windows")]
    for row in frame.to_dict("records"):
        conditions = shown.get((row["metric"], _setting({c: row[c] for c in columns if not _missing(row[c])})))
        if conditions is None:
            continue
        diffs.append({"run": row["run"], "reference": row["reference"], "metric": row["metric"],
                      "conditions": conditions, "difference": _number(row["difference"]), "se": _number(row["se"]),
                      "pairing": row["pairing"],
                      "n_windows": None if _missing(row["n_windows"]) else int(row["n_windows"])})
    return {"command": command, "comparison": str(folder), "page": None if page is None else str(page),
            "group_by": record.get("group_by"), "runs": summaries, "differences": diffs}


def _setting(conditions: dict) -> tuple:
    """Conditions as a key that reads 16, 16.0 and "16" alike."""
    return tuple(sorted((k, condition_text(_json_value(v))) for k, v in conditions.items()))


def summarise(path: str | Path) -> dict:
    """The summary of what a command wrote: a run folder, or a comparison's folder (or its report.html)."""
    from sinkscope.store.comparison_record import read_comparison_record

    path = Path(path)
    page = path if path.name == "report.html" else None
    folder = path.parent if page is not None else path
    record = read_comparison_record(folder)
    if record is not None:
        return comparison_summary(folder, record, page if page is not None and page.is_file() else None)
    return run_summary(read_summary_run(folder))


# ---- text -------------------------------------------------------------------------------------------


def _name(metric: dict) -> str:
    """``stream_ppl (policy=window, cache=256)``: a metric with its conditions."""
    conditions = ", ".join(f"{k}={v}" for k, v in metric["conditions"].items())
    return metric["metric"] + (f" ({conditions})" if conditions else "")


def _table(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return [indent + "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]]


def _windows(summary: dict) -> str:
    windows = summary.get("windows") or {}
    n, length = windows.get("n_seqs"), windows.get("seq_len")
    if n is None or length is None:
        return ""
    length = "/".join(map(str, length)) if isinstance(length, list) else length
    return f"{n} windows of {length} tokens" + (f", seed {windows['seed']}" if windows.get("seed") is not None else "")


def format_run(summary: dict) -> list[str]:
    """A run's lines: what was run, its headline metrics, its top heads."""
    title = " · ".join(x for x in (summary.get("command") or "run", summary.get("model") or summary["label"],
                                   _windows(summary)) if x)
    lines = [title]
    if summary["metrics"]:
        lines += _table(["metric", "value"],
                        [[_name(m), fmt_value_se(m["value"], m["se"])] for m in summary["metrics"]])
    else:
        lines.append("  (no model-level rows)")
    top = summary.get("top_heads")
    if top:
        lines.append("")
        lines += _table([f"{top['order']} heads", top["metric"]],
                        [[f"{h['layer']}.{h['head']}", fmt_value_se(h["value"], h["se"])] for h in top["heads"]])
    return lines


def format_comparison(summary: dict) -> list[str]:
    """A comparison's lines: one row per run, then each later run's difference from the first."""
    runs = summary["runs"]
    title = f"{summary.get('command') or 'runs'} · {len(runs)} runs" + (
        f", grouped by {summary['group_by']}" if summary.get("group_by") else "")
    lines = [title]
    names: list[str] = []
    for run in runs:
        names += [_name(m) for m in run["metrics"] if _name(m) not in names]
    if not runs:
        return lines + ["  (no run finished)"]
    cells = []
    for run in runs:
        values = {_name(m): fmt_value_se(m["value"], m["se"]) for m in run["metrics"]}
        cells.append([run["label"], *[values.get(name, "—") for name in names]])
    lines += _table(["run", *names], cells)
    if summary["differences"]:
        reference = summary["differences"][0]["reference"]
        lines += ["", f"  difference from {reference} (± se)"]
        rows, pairing = [], {}
        for run in dict.fromkeys(d["run"] for d in summary["differences"]):
            mine = {_name(d): d for d in summary["differences"] if d["run"] == run}
            rows.append([run, *[fmt_value_se(mine[n]["difference"], mine[n]["se"], sign=True) if n in mine else "—"
                                for n in names]])
            for name, d in mine.items():
                pairing.setdefault(d["pairing"] + (f" over {d['n_windows']} windows" if d["n_windows"] else ""),
                                   []).append(name)
        lines += _table(["run", *names], rows)
        for how, which in pairing.items():
            lines.append(f"  se {how}: {', '.join(dict.fromkeys(which))}")
    return lines


def format_summary(summary: dict) -> str:
    """The terminal's table of a run's or a comparison's summary (without the folder line)."""
    return "\n".join(format_comparison(summary) if "runs" in summary else format_run(summary))


# ---- ls runs ----------------------------------------------------------------------------------------


def list_runs(folder: str | Path) -> list[dict]:
    """Every run under ``folder``: the folder itself if it is a run, its run folders, and the runs inside
    its comparisons' folders; each {path, command, model, created, headline, error}, oldest first."""
    from sinkscope.store.comparison_record import read_comparison_record
    from sinkscope.store.results import is_run_folder

    folder = Path(folder)
    if not folder.is_dir():
        raise SinkscopeError(f"no folder {folder} to list runs in.")
    candidates: list[Path] = []
    if is_run_folder(folder):
        candidates.append(folder)
    else:
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir() or entry.is_symlink():
                continue
            record = read_comparison_record(entry) if (entry / "comparison.json").is_file() else None
            if record is not None:
                candidates += [entry / name for name in record["runs"] if (entry / name).is_dir()]
            elif (entry / "manifest.json").is_file():
                candidates.append(entry)
    listed = []
    for path in candidates:
        try:
            run = read_summary_run(path, label=str(path))
            summary = run_summary(run)
            listed.append({"path": str(path), "command": summary["command"], "model": summary["model"],
                           "created": summary["created"], "metrics": summary["metrics"], "error": None})
        except SinkscopeError as error:
            listed.append({"path": str(path), "command": None, "model": None, "created": None, "metrics": [],
                           "error": str(error)})
    return sorted(listed, key=lambda r: (r["created"] or "", r["path"]))


def format_listing(listed: list[dict], shown: int = 3) -> str:
    """One line per run: folder, command, model, date, its first headline numbers."""
    rows = []
    for run in listed:
        if run["error"]:
            rows.append([run["path"], "?", "?", "?", f"unreadable: {run['error']}"])
            continue
        numbers = "  ".join(f"{_name(m)} {fmt_value_se(m['value'], m['se'])}" for m in run["metrics"][:shown])
        date = (run["created"] or "—").replace("T", " ")[:16]
        rows.append([run["path"], run["command"] or "—", run["model"] or "—", date, numbers])
    return "\n".join(_table(["run", "command", "model", "date", "headline"], rows, indent=""))
