"""The comparison page's "Differences from <first run>" section: each later run's model-level values minus
the first run's, ``difference ± se``, and how each se was made (SPEC.md "Comparisons of runs").

    section(runs) -> {reference, notes, columns, rows} | None     (None for fewer than two runs)

The rows are those of ``report.compare.differences`` with no layer, no head, no layer-type or
position-bucket split (the comparison's ``compare.csv`` has every row), less the metrics whose value
is a position or a channel (``report.summary.INDEX_METRICS``). Tables in, a table out.
"""

from __future__ import annotations

import pandas as pd

from sinkscope.report.compare import (DIFFERENT_WINDOWS, GROUPS, NOT_STORED, PAIRED, differences, model_rows,
                                      same_windows)
from sinkscope.report.runs import RunData
from sinkscope.report.summary import INDEX_METRICS, fmt_value_se

#: what each pairing says on the page.
PAIRING_TEXT = {
    PAIRED: "paired over {n} windows",
    NOT_STORED: "unpaired: per-window values not stored (same windows)",
    DIFFERENT_WINDOWS: "unpaired: different windows",
    GROUPS: "none: averaged groups",
}


def pairing_text(pairing: str, n_windows) -> str:
    """``paired over 8 windows``, ``unpaired: different windows``, ...: how a difference's se was made."""
    text = PAIRING_TEXT.get(pairing, pairing)
    return text.format(n=n_windows if not pd.isna(n_windows) else "?")


def metric_name(row: dict, columns: list[str]) -> str:
    """``stream_ppl (policy=window, cache=16)``: a difference's metric with its row's conditions."""
    conditions = [f"{c}={_plain(row[c])}" for c in columns if not pd.isna(row[c])]
    return row["metric"] + (f" ({', '.join(conditions)})" if conditions else "")


def _plain(value) -> str:
    """A condition's value as the page prints it (16, not 16.0)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def window_notes(runs: list[RunData]) -> list[str]:
    """One sentence per later run that did not measure the first run's windows, and one for grouped runs."""
    reference = runs[0]
    if any(run.manifest.get("grouped") for run in runs):
        return ["The runs are averaged in groups: a group's mean carries no standard error, so neither do the "
                "differences."]
    other = [run.label for run in runs[1:] if not same_windows(reference, run)]
    if not other:
        return []
    return [f"{', '.join(other)} did not measure the same token windows as {reference.label} (another tokenizer, "
            "corpus, seed or length): their differences are unpaired, se = sqrt(se_a² + se_b²), and include the "
            "difference between the windows."]


def section(runs: list[RunData]) -> dict | None:
    """The section's content for a page comparing ``runs`` (the first is the reference), or None."""
    if len(runs) < 2:
        return None
    frame = model_rows(differences(runs))
    frame = frame[~frame["metric"].isin(INDEX_METRICS)]
    fixed = {"run", "reference", "probe", "metric", "layer", "head", "value", "reference_value", "difference", "se",
             "pairing", "n_windows"}
    conditions = [c for c in frame.columns if c not in fixed]
    rows = []
    for row in frame.to_dict("records"):
        rows.append([row["run"], metric_name(row, conditions), fmt_value_se(row["value"]),
                     fmt_value_se(row["reference_value"]), fmt_value_se(row["difference"], row["se"], sign=True),
                     pairing_text(row["pairing"], row["n_windows"])])
    columns = ["run", "metric", "value", f"value of {runs[0].label}", "difference ± se", "se"]
    return {"reference": runs[0].label, "notes": window_notes(runs), "columns": columns, "rows": rows}
