"""The report's "lengths" section: a run measured at several lengths (``--seq-len 128,512,2048``).

Its metrics are drawn per layer against the length, with the fixed-gap leak model's prediction
dashed beside p0 and phantom mass (``leak_fit``, Qiu et al. 2025), and the fitted gap Delta as a layer x
head heatmap with a table of the fit per layer. Every other figure of such a run overlays its
lengths as separate runs (``runs.split_lengths``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sinkscope.report import curves, figures
from sinkscope.report.page import COLLAPSE_ROWS, _keeper, _metric_docs, fmt
from sinkscope.report.runs import RunData, _has_layers, _has_phantom, run_lengths, uniform_p0
from sinkscope.store.results import MetricInfo

#: metrics drawn against length (per layer) when a run has them.
LENGTH_METRICS = ("p0_mass", "phantom_mass", "implicit_gate", "leak_gap", "leak_phantom_gap")
#: the leak model's prediction drawn dashed beside a metric.
PREDICTED_BY = {"p0_mass": "leak_p0_predicted", "phantom_mass": "leak_phantom_predicted"}
LENGTHS_NOTE = ("Every length is measured on prefixes of the same windows (the same documents from the same "
                "starts; the longest length's windows are the ones saved in tokens.npy). The fixed-gap model of "
                "Qiu et al. 2025 gives a query that sees n keys the sink share 1/(1 + (n-1) e^{-Delta}); Delta is fitted "
                "per head so that the mean over queries i >= 1 reproduces p0_mass at the shortest length, and its "
                "prediction at the longer lengths is drawn dashed. Measured above the dashed line: the sink holds "
                "as context grows (its gap grows with n); below: it leaks more than a fixed gap would.")


def _per_layer(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    rows = table[(table.metric == metric) & table.layer.notna() & table["head"].isna()]
    return pd.DataFrame({"layer": rows.layer.astype(int).to_numpy(), "seq_len": rows["seq_len"].astype(int).to_numpy(),
                         "value": rows["value"].astype(float).to_numpy()})


def section(runs: list[RunData], fig_dir: Path, labels: figures.MetricLabels | None = None) -> dict:
    """Metrics against length per layer, the leak-model fit and its error, for each multi-length run."""
    docs = _metric_docs(runs)
    if labels is None:
        labels = figures.MetricLabels.from_docs(docs)
    keep = _keeper(fig_dir)
    entries = []
    for k, run in enumerate(runs):
        table, lengths = run.table, run_lengths(run)
        suffix = f" ({run.label})" if len(runs) > 1 else ""
        for metric in LENGTH_METRICS:
            if not _has_layers(table, metric) or (metric == "phantom_mass" and not _has_phantom(run)):
                continue
            points = _per_layer(table, metric)
            predicted = None
            fit = PREDICTED_BY.get(metric)
            if fit and _has_layers(table, fit):
                shortest = points[points.seq_len == lengths[0]]
                predicted = pd.concat([shortest, _per_layer(table, fit)])
            floor = {n: uniform_p0(n) for n in lengths} if metric == "p0_mass" else None
            fig = curves.metric_vs_length(points, metric, predicted=predicted, floor=floor, labels=labels)
            info = docs.get(metric, MetricInfo(metric, "", "", ""))
            entries.append({"metric": f"{metric}_vs_length{'_' + str(k) if k else ''}",
                            "info": MetricInfo(f"{info.label} against length{suffix}", info.unit, info.formula,
                                               info.source, info.direction),
                            "note": None, "figures": [keep(fig, f"length_{figures._file_stem(metric)}_run{k}",
                                                           "per layer against seq-len")],
                            "table": _length_table(table, metric, lengths)})
        if _has_layers(table, "leak_delta"):
            info = docs.get("leak_delta", MetricInfo("leak_delta", "", "", ""))
            delta = table[table.metric == "leak_delta"].drop(columns="seq_len")
            fig = figures.layer_head_heatmap(delta, "leak_delta", labels=labels)
            errors = table[(table.metric == "leak_p0_error") & table.layer.isna() & table["head"].isna()]
            if "layer_type" in errors.columns:
                errors = errors[errors["layer_type"].isna()]
            note = "Mean signed error of the prediction over layers: " + ", ".join(
                f"{fmt(v)} at seq-len {int(n)}" for n, v in zip(errors["seq_len"], errors["value"])) + "." \
                if len(errors) else ""
            note = (note + _leak_conditioning_note(run)).strip()
            entries.append({"metric": f"leak_delta{'_' + str(k) if k else ''}",
                            "info": MetricInfo(info.label + suffix, info.unit, info.formula, info.source,
                                               info.direction),
                            "note": note or None,
                            "figures": [keep(fig, f"length_leak_delta_run{k}", "layer x head")],
                            "table": _leak_table(table, lengths)})
    return {"probe": "lengths", "entries": entries, "note": LENGTHS_NOTE, "tables": []}


def _leak_conditioning_note(run: RunData) -> str:
    """Which heads' Delta is ill-conditioned, and on which layers the prediction error is not reported."""
    table, parts = run.table, []
    flags = table[(table.metric == "leak_delta_ill_conditioned") & table["head"].notna()]
    if len(flags):
        parts.append(f" Delta is ill-conditioned (|dDelta/dp0| > 1e3: a p0 error of 0.001 moves it by more than a "
                     f"nat; read it as minus the log of the leak) for {int(flags['value'].sum())} of {len(flags)} heads"
                     " (leak_delta_dp0 per head in the table).")
    skipped = (((run.manifest.get("probes") or {}).get("leak_fit") or {}).get("options") or {}).get(
        "p0_error_not_reported")
    if skipped:
        parts.append(f" The error is not reported on layers {', '.join(map(str, skipped['layers']))}: "
                     f"{skipped['reason']}.")
    return "".join(parts)


def _length_table(table: pd.DataFrame, metric: str, lengths: list[int]) -> dict:
    points = _per_layer(table, metric).pivot(index="layer", columns="seq_len", values="value")
    rows = [[str(layer)] + [fmt(points.loc[layer, n]) if n in points.columns else "—" for n in lengths]
            for layer in points.index]
    return {"columns": ["layer"] + [f"seq-len {n}" for n in lengths], "rows": rows,
            "collapsed": len(rows) > COLLAPSE_ROWS}


def _leak_table(table: pd.DataFrame, lengths: list[int]) -> dict:
    """Per layer: Delta, then per longer length the measured and predicted p0 (layer means over heads)."""
    delta = _per_layer(table, "leak_delta").set_index("layer")["value"]
    measured = _per_layer(table, "p0_mass").pivot(index="layer", columns="seq_len", values="value")
    predicted = _per_layer(table, "leak_p0_predicted").pivot(index="layer", columns="seq_len", values="value")
    flagged = _per_layer(table, "leak_delta_ill_conditioned").set_index("layer")["value"]
    columns = ["layer", "Delta", "Delta ill-conditioned (share of heads)"]
    for n in lengths[1:]:
        columns += [f"p0 @ {n}", f"predicted @ {n}"]
    rows = []
    for layer in delta.index:
        row = [str(layer), fmt(delta[layer]), fmt(flagged[layer]) if layer in flagged.index else "—"]
        for n in lengths[1:]:
            row += [fmt(measured.loc[layer, n]) if n in measured.columns else "—",
                    fmt(predicted.loc[layer, n]) if n in predicted.columns else "—"]
        rows.append(row)
    return {"columns": columns, "rows": rows, "collapsed": len(rows) > COLLAPSE_ROWS,
            "caption": f"Leak-model fit per layer ({len(rows)} layers; Delta in nats, fitted at seq-len {lengths[0]})"}
