"""The report sections of ``sinkscope circuit`` (probes/circuit.py): figures and tables per measurement.

Its rows carry condition columns (``position``, ``subtracted``, ``where``, ``rank``, ``bos``,
``repeat``, ``point``), so the generic per-layer line and heatmap do not fit them; every circuit
metric is drawn here instead, one entry per measurement, each run a line (several runs: one
comparison, e.g. trainer variants):

- ``p0_norm``: position-0 norm and the median other norm per layer (log scale), with the ratio;
- ``p0_cosine``: position-0 and later-position mean pairwise cosine per layer;
- ``attn_z_norm`` (the headline, the P0-sink study, Table 2's quantity): the first attention layer's norm of the
  weighted sum of values (``hook_z``, before W_O) against position, pooled over heads, each head a thin
  line (one run), position 0 marked; a table of per-head ratios and trends;
- ``attn_out_norm``: the same layer's output norm after W_O (``hook_attn_out``), beside it;
- ``pca_separation``: the scatter of the layer-0 MLP PCA (PC1 x PC2, position 0 in red), one
  panel per run and subtraction, with a table of separation scores and explained shares;
- ``p0_outlier_max_z``: the largest |z| per layer before and after the pre-norm, and a table of
  the top channels;
- ``bos_sink_rate``: Sink_0^eps per layer with and without BOS;
- ``bos_repeat_loss_delta``: the loss change against the number of repeats.

Metrics drawn as part of another (``other_norm``, ``later_cosine``, the scatter coordinates, the
outlier ranks, ``bos_repeat_loss``) get no entry of their own; their numbers stay in the tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from sinkscope.report import figures
from sinkscope.report.page import Page, fmt
from sinkscope.report.runs import RunData

#: metrics this module draws (an entry each).
DRAWN = ("p0_norm", "p0_cosine", "attn_z_norm", "attn_out_norm", "pca_separation", "p0_outlier_max_z",
         "bos_sink_rate", "bos_repeat_loss_delta")
#: metrics shown inside another's entry (no entry, no summary row of their own).
FOLDED = ("other_norm", "p0_norm_ratio", "p0_norm_separates", "later_cosine", "attn_z_norm_p0_ratio",
          "attn_z_norm_trend", "attn_out_norm_p0_ratio", "attn_out_norm_trend", "pca_explained_pc1",
          "pca_explained_pc2", "pca_separation_best", "pca_separation_best_pc", "pca_scatter_pc1", "pca_scatter_pc2",
          "pca_sketch_bound", "p0_outlier_z", "p0_outlier_channel", "bos_repeat_loss", "bos_sink_rate_from_layer")
#: the model-level value shown in the summary for a drawn metric (a function of one run's table).
MODEL_VALUE_NOTE = {
    "p0_norm": "first layer with ratio > threshold",
    "p0_cosine": "last layer",
}


# ---- the section protocol (page.py) ------------------------------------------------------------------


def handles(probe: str, metric: str, runs: list[RunData]) -> bool:
    """The circuit metrics, by name (rows with condition columns the generic figures do not fit)."""
    return metric in DRAWN or metric in FOLDED


def entry(page: Page, metric: str) -> dict | None:
    """A drawn metric's summary row and entry; None for a metric folded into another's."""
    if metric not in DRAWN:
        return None
    info = page.info(metric)
    page.add_summary(metric, SUMMARY_LABEL[metric], info.direction,
                     [fmt(summary_value(r.table, metric)) for r in page.runs])
    return {"metric": metric, "info": info, **draw(page.runs, metric, page.keep, page.colours)}


def note(probe: str, metrics: list[str]) -> str | None:
    return None


def tables(page: Page, probe: str) -> list[dict]:
    return []


# ---- the measurements --------------------------------------------------------------------------------


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return "—"
    return f"{float(value):.4g}"


def _rows(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    return table[table.metric == metric]


def _layer_series(table: pd.DataFrame, metric: str, **conditions) -> pd.Series:
    rows = _rows(table, metric)
    rows = rows[rows.layer.notna() & rows["head"].isna()]
    for key, value in conditions.items():
        rows = rows[rows[key].astype("string") == str(value)] if key in rows else rows.iloc[0:0]
    return pd.Series(rows["value"].to_numpy(float), index=rows["layer"].astype(int).to_numpy()).sort_index()


def _new(figsize=(6.0, 3.8)) -> tuple[Figure, object]:
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _table(columns: list[str], body: list[list[str]], caption: str) -> dict:
    return {"columns": columns, "rows": body, "collapsed": len(body) > 16, "caption": caption}


def summary_value(table: pd.DataFrame, metric: str):
    """The number the summary shows for a drawn metric (None: no summary row)."""
    if metric == "p0_norm":
        rows = _rows(table, "p0_norm_separates")
        return rows["value"].iloc[0] if len(rows) else None
    if metric == "p0_cosine":
        series = _layer_series(table, "p0_cosine")
        return series.iloc[-1] if len(series) else None
    if metric in ("attn_z_norm", "attn_out_norm"):
        rows = _rows(table, f"{metric}_p0_ratio")
        rows = rows[rows["head"].isna()]
        return rows["value"].iloc[0] if len(rows) else None
    if metric == "pca_separation":
        rows = _rows(table, "pca_separation")
        rows = rows[rows["subtracted"].astype("string") == "none"] if "subtracted" in rows else rows
        return rows["value"].iloc[0] if len(rows) else None
    if metric == "p0_outlier_max_z":
        rows = _rows(table, metric)
        return rows["value"].max() if len(rows) else None
    if metric == "bos_sink_rate":
        rows = _rows(table, metric)
        rows = rows[rows.layer.isna() & (rows["bos"].astype("string") == "without")] if "bos" in rows else rows.iloc[0:0]
        return rows["value"].iloc[0] if len(rows) else None
    if metric == "bos_repeat_loss_delta":
        rows = _rows(table, metric)
        if "repeat" not in rows or rows.empty:
            return None
        rows = rows[rows["bos"].astype("string") == "without"]
        rows = rows[rows["repeat"] == rows["repeat"].max()]
        return rows["value"].iloc[0] if len(rows) else None
    return None


SUMMARY_LABEL = {
    "p0_norm": "first layer where ||h_0|| > 2 x median other norm",
    "p0_cosine": "position-0 cosine across windows, last layer",
    "attn_z_norm": "layer-0 norm of the weighted value sum (hook_z, before W_O), position 0 / others",
    "attn_out_norm": "layer-0 attention-output norm after W_O (hook_attn_out), position 0 / others",
    "pca_separation": "PC1 separation of position 0 (no heads subtracted)",
    "p0_outlier_max_z": "largest position-0 |z| over layers and places",
    "bos_sink_rate": "Sink_0^eps without BOS (model mean)",
    "bos_repeat_loss_delta": "loss change, first token repeated r_max times, without BOS",
}


def draw(runs: list, metric: str, keep: Callable[[Figure, str, str], dict],
         colours: dict[str, str] | None = None) -> dict:
    """{figures, table, note} for a drawn metric (``keep(fig, file stem, title)`` saves a figure).

    ``colours``: each run's colour on the page (``Page.colours``; default by these runs' order): a run is
    one colour in every figure, what it draws (position 0 or the others, with or without BOS) the line style.
    """
    draw = {"p0_norm": _norms, "p0_cosine": _cosines, "attn_z_norm": _attn_z, "attn_out_norm": _attn_out,
            "pca_separation": _pca,
            "p0_outlier_max_z": _outliers, "bos_sink_rate": _bos_sink, "bos_repeat_loss_delta": _bos_loss}[metric]
    colours = colours or figures.run_colours(r.label for r in runs)
    with matplotlib.rc_context(figures._STYLE):
        return draw(runs, keep, colours)


def _legend(ax) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2, borderaxespad=0.0)


def _norms(runs, keep, colours) -> dict:
    fig, ax = _new()
    for run in runs:
        p0, other = _layer_series(run.table, "p0_norm"), _layer_series(run.table, "other_norm")
        prefix = f"{run.label}: " if len(runs) > 1 else ""
        (line,) = ax.plot(p0.index, p0.values, marker="o", markersize=3, label=f"{prefix}position 0",
                          color=colours.get(run.label))
        ax.plot(other.index, other.values, marker="o", markersize=3, linestyle="--", color=line.get_color(),
                label=f"{prefix}median of the others")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("||hook_resid_post|| (L2)")
    ax.set_title("Residual norm at position 0 vs the other positions")
    ax.grid(True, linewidth=0.4, alpha=0.4)
    _legend(ax)
    out = [keep(fig, "circuit_norms", "norm per layer (solid: position 0; dashed: median over positions >= 1)")]
    fig, ax = _new()
    for run in runs:
        ratio = _layer_series(run.table, "p0_norm_ratio")
        ax.plot(ratio.index, ratio.values, marker="o", markersize=3, label=run.label if len(runs) > 1 else None,
                color=colours.get(run.label))
    ax.axhline(2.0, color="0.35", linestyle="--", linewidth=1.0)
    ax.set_xlabel("layer")
    ax.set_ylabel("position-0 norm / median other norm")
    ax.set_title("Norm ratio (dashed: 2)")
    ax.grid(True, linewidth=0.4, alpha=0.4)
    if len(runs) > 1:
        _legend(ax)
    out.append(keep(fig, "circuit_norm_ratio", "norm ratio per layer (dashed: 2)"))
    layers = sorted(set().union(*[set(_layer_series(r.table, "p0_norm").index) for r in runs]))
    columns, body = ["layer"], []
    for run in runs:
        name = f" ({run.label})" if len(runs) > 1 else ""
        columns += [f"p0 norm{name}", f"median other{name}", f"ratio{name}"]
    series = [(_layer_series(r.table, "p0_norm"), _layer_series(r.table, "other_norm"),
               _layer_series(r.table, "p0_norm_ratio")) for r in runs]
    for layer in layers:
        row = [str(layer)]
        for parts in series:
            row += [_fmt(s.get(layer)) for s in parts]
        body.append(row)
    separates = [f"{r.label}: layer {_fmt(summary_value(r.table, 'p0_norm'))}" for r in runs]
    note = "First layer whose ratio exceeds the threshold — " + "; ".join(separates) + " (— = none)."
    return {"figures": out, "table": _table(columns, body, f"Per-layer norms ({len(body)} layers)"), "note": note}


def _cosines(runs, keep, colours) -> dict:
    fig, ax = _new()
    for run in runs:
        p0 = _layer_series(run.table, "p0_cosine")
        later = _rows(run.table, "later_cosine")
        position = int(later["position"].dropna().iloc[0]) if "position" in later and later["position"].notna().any() \
            else None
        later = _layer_series(run.table, "later_cosine")
        prefix = f"{run.label}: " if len(runs) > 1 else ""
        (line,) = ax.plot(p0.index, p0.values, marker="o", markersize=3, label=f"{prefix}position 0",
                          color=colours.get(run.label))
        ax.plot(later.index, later.values, marker="o", markersize=3, linestyle="--", color=line.get_color(),
                label=f"{prefix}position {position}")
    ax.set_ylim(min(0.0, ax.get_ylim()[0]), 1.02)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean pairwise cosine across windows")
    ax.set_title("Directional convergence")
    ax.grid(True, linewidth=0.4, alpha=0.4)
    _legend(ax)
    out = [keep(fig, "circuit_cosine", "mean pairwise cosine of the state across windows (solid: position 0)")]
    layers = sorted(set().union(*[set(_layer_series(r.table, "p0_cosine").index) for r in runs]))
    columns = ["layer"]
    for run in runs:
        name = f" ({run.label})" if len(runs) > 1 else ""
        columns += [f"position 0{name}", f"later{name}"]
    body = []
    for layer in layers:
        row = [str(layer)]
        for run in runs:
            row += [_fmt(_layer_series(run.table, m).get(layer)) for m in ("p0_cosine", "later_cosine")]
        body.append(row)
    note = None
    if any(_bos_at_zero(r) for r in runs):
        note = ("These windows start with BOS, so position 0 holds the same token in every window and its cosine "
                "is 1 by construction; the P0-sink study, Fig. 2(c) reads it without BOS (--bos none).")
    return {"figures": out, "table": _table(columns, body, f"Per-layer cosines ({len(body)} layers)"), "note": note}


def _bos_at_zero(run) -> bool:
    windows = run.manifest.get("windows") or {}
    return windows.get("bos_id") is not None


def _curve(table: pd.DataFrame, metric: str, head=None) -> dict[int, float]:
    """{position: value} of one norm curve (head None: the pooled, head-less rows)."""
    rows = _rows(table, metric)
    if "position" not in rows:
        return {}
    rows = rows[rows["head"].isna()] if head is None else rows[rows["head"] == head]
    rows = rows.dropna(subset=["position"]).sort_values("position")
    return dict(zip(rows["position"].astype(int).tolist(), rows["value"].astype(float).tolist()))


def _one(table: pd.DataFrame, metric: str, head=None):
    rows = _rows(table, metric)
    rows = rows[rows["head"].isna()] if head is None else rows[rows["head"] == head]
    return rows["value"].iloc[0] if len(rows) else None


def _shown(positions: list[int]) -> list[int]:
    return [p for p in positions if p < 8 or (p & (p - 1)) == 0 or p == positions[-1]]


def _relative(curve: dict[int, float]) -> dict[int, float]:
    """The curve over its mean at positions t >= 1 (position 0 then reads as the p0 ratio)."""
    rest = [v for t, v in curve.items() if t >= 1]
    mean = sum(rest) / len(rest) if rest else math.nan
    return {t: v / mean for t, v in curve.items()} if mean and not math.isnan(mean) else curve


def _norm_figure(runs, keep, colours, metric: str, ylabel: str, title: str, stem: str, caption: str,
                 relative: bool = False) -> dict:
    fig, ax = _new()
    scale = _relative if relative else (lambda c: c)
    for run in runs:
        if len(runs) == 1 and relative:
            for head in sorted(_rows(run.table, metric)["head"].dropna().astype(int).unique()):
                c = scale(_curve(run.table, metric, head))
                ax.plot(list(c), list(c.values()), linewidth=0.6, color="0.7", zorder=1)
        c = scale(_curve(run.table, metric))
        x, y = list(c), list(c.values())
        (line,) = ax.plot(x, y, linewidth=1.4, label=run.label if len(runs) > 1 else None, zorder=3,
                          color=colours.get(run.label))
        if x:
            ax.plot([x[0]], [y[0]], marker="o", markersize=6, color=line.get_color(), zorder=4)
    if relative:
        ax.axhline(1.0, color="0.35", linestyle="--", linewidth=0.8)
    ax.set_xscale("symlog", linthresh=8)
    ax.set_xlim(left=-0.5)  # position 0 (its dot) inside the frame
    ax.set_xlabel("position (symlog)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, linewidth=0.4, alpha=0.4)
    if len(runs) > 1:
        _legend(ax)
    return keep(fig, stem, caption)


def _layer_of(runs, metric: str) -> int:
    layer = _rows(runs[0].table, metric)["layer"].dropna()
    return int(layer.iloc[0]) if len(layer) else 0


def _attn_z(runs, keep, colours) -> dict:
    """The headline: ||sum_j a_tj v_j|| (hook_z) against position, pooled and per head."""
    layer = _layer_of(runs, "attn_z_norm")
    one = len(runs) == 1
    out = [_norm_figure(runs, keep, colours, "attn_z_norm", f"||hook_z|| of layer {layer} / its mean over t >= 1",
                        "Weighted value sum norm before W_O (dot: position 0)", "circuit_attn_z_norm",
                        f"layer {layer}: norm of sum_j a_tj v_j per position before W_O, all heads side by side"
                        f"{' (grey: each head)' if one else ''}, averaged over windows, over its mean at positions "
                        "t >= 1 (the P0-sink study, Table 2)", relative=True)]
    columns, body = ["run", "head", "position 0 / others", "change per doubling of position (t >= 1)"], []
    for run in runs:
        heads = sorted(_rows(run.table, "attn_z_norm_p0_ratio")["head"].dropna().astype(int).unique())
        for head in [None, *heads]:
            body.append([run.label, "pooled" if head is None else str(head),
                         _fmt(_one(run.table, "attn_z_norm_p0_ratio", head)),
                         _fmt(_one(run.table, "attn_z_norm_trend", head))])
    parts = []
    for run in runs:
        ratios = _rows(run.table, "attn_z_norm_p0_ratio")
        ratios = ratios[ratios["head"].notna()]["value"]
        above = f"; {int((ratios > 1).sum())} of {len(ratios)} heads above 1" if len(ratios) else ""
        parts.append(f"{run.label}: {_fmt(_one(run.table, 'attn_z_norm_p0_ratio'))} (pooled), after W_O "
                     f"{_fmt(_one(run.table, 'attn_out_norm_p0_ratio'))}{above}")
    note = ("The P0-sink study models attention as a weighted sum of value vectors: position 0 reads only its own value "
            "(sum_j a_0j^2 = 1), so its norm is the largest, and the norm falls as the weights spread. This is "
            "that sum (hook_z, before the output projection); the attention output after W_O is the next entry. "
            "Position 0 over the mean of the other positions — " + "; ".join(parts) + ".")
    return {"figures": out, "table": _table(columns, body, f"Per head ({len(body)} rows)"), "note": note}


def _attn_out(runs, keep, colours) -> dict:
    """Beside the headline: ||hook_attn_out|| against position (after W_O), with the hook_z curve in the table."""
    layer = _layer_of(runs, "attn_out_norm")
    out = [_norm_figure(runs, keep, colours, "attn_out_norm", f"||hook_attn_out|| of layer {layer}",
                        "Attention-output norm after W_O (dot: position 0)", "circuit_attn_out_norm",
                        f"layer {layer}: attention-output norm per position after W_O, averaged over windows")]
    curves = [(_curve(r.table, "attn_z_norm"), _curve(r.table, "attn_out_norm")) for r in runs]
    positions = sorted(set().union(*[set(z) | set(o) for z, o in curves]))
    columns = ["position"]
    for run in runs:
        name = f" ({run.label})" if len(runs) > 1 else ""
        columns += [f"before W_O (hook_z, all heads){name}", f"after W_O{name}"]
    body = [[str(p)] + [_fmt(c.get(p)) for pair in curves for c in pair] for p in _shown(positions)]
    parts = [f"{r.label}: {_fmt(_one(r.table, 'attn_out_norm_p0_ratio'))} (change per doubling of position "
             f"{_fmt(_one(r.table, 'attn_out_norm_trend'))})" for r in runs]
    note = ("After W_O the heads are mixed by the output projection, which need not keep the order of the "
            "weighted value sums; the P0-sink study's argument is about the sum before it (previous entry). Position 0 "
            "over the mean of the others — " + "; ".join(parts) + ".")
    return {"figures": out, "table": _table(columns, body, f"Positions 0-7 and powers of two ({len(body)} rows)"),
            "note": note}


def _pca(runs, keep, colours) -> dict:
    panels = []
    for run in runs:
        x = _rows(run.table, "pca_scatter_pc1")
        y = _rows(run.table, "pca_scatter_pc2")
        if x.empty:  # no PCA in this run (no pre-activation point): the note below names it
            continue
        sep_rows = _rows(run.table, "pca_separation")

        def under(frame, cond):  # the rows of one subtraction condition (all rows where there is none)
            return frame[frame["subtracted"].astype(str) == cond] if "subtracted" in frame else frame

        conditions = list(dict.fromkeys(x["subtracted"].astype(str))) if "subtracted" in x else ["none"]
        for cond in conditions:
            px = under(x, cond).set_index("point")
            py = under(y, cond).set_index("point")
            sep = under(sep_rows, cond)["value"]
            panels.append((run.label, cond, px, py, float(sep.iloc[0]) if len(sep) else math.nan))
    out = []
    if panels:
        n = len(panels)
        cols = min(n, 3)
        rows_n = math.ceil(n / cols)
        fig = Figure(figsize=(3.4 * cols, 3.1 * rows_n), layout="constrained")
        for i, (label, cond, px, py, sep) in enumerate(panels):
            ax = fig.add_subplot(rows_n, cols, i + 1)
            pos = px["position"].to_numpy()
            xs, ys = px["value"].to_numpy(float), py.loc[px.index, "value"].to_numpy(float)
            ax.scatter(xs[pos != 0], ys[pos != 0], s=5, c="0.55", alpha=0.6, label="positions >= 1", linewidths=0)
            ax.scatter(xs[pos == 0], ys[pos == 0], s=14, c="tab:red", label="position 0", linewidths=0)
            who = f"{label}, " if len(runs) > 1 else ""
            ax.set_title(f"{who}subtracted: {cond}\nseparation {sep:.3g}", fontsize=9)
            ax.set_xlabel("PC1")
            ax.set_ylabel("PC2")
            ax.legend(loc="best", fontsize=7)  # every panel: each reads on its own
        out.append(keep(fig, "circuit_pca_scatter", "layer-0 MLP pre-activation, PC1 x PC2 (red: position 0; "
                                                    "sample: every position 0, evenly spaced others)"))
    columns = ["run", "subtracted", "separation (PC1)", "best of 10 PCs (which)", "PC1 share", "PC2 share",
               "n positions", "covariance"]
    body = []
    for run in runs:
        sep = _rows(run.table, "pca_separation")
        for _, row in sep.iterrows():
            cond = str(row.get("subtracted", "none"))

            def share(metric, cond=cond):
                r = _rows(run.table, metric)
                r = r[r["subtracted"].astype(str) == cond]["value"]
                return _fmt(r.iloc[0]) if len(r) else "—"
            best = f"{share('pca_separation_best')} (PC{share('pca_separation_best_pc')})"
            bound = share("pca_sketch_bound")  # a run from before the sketch has no such row: exact
            way = "exact" if bound in ("—", _fmt(0.0)) else f"sketch, bound {bound} of PC1's variance"
            body.append([run.label, cond, _fmt(row["value"]), best, share("pca_explained_pc1"),
                         share("pca_explained_pc2"), str(int(row["n"])), way])
    note = None
    missing = [r.label for r in runs if _rows(r.table, "pca_separation").empty]
    if missing:
        note = f"No PCA for {', '.join(missing)} (a mixture-of-experts MLP has no pre-activation point)."
    return {"figures": out, "table": _table(columns, body, "Separation scores"), "note": note}


def _outliers(runs, keep, colours) -> dict:
    fig, ax = _new()
    for run in runs:
        for where, style in (("resid_pre", "-"), ("normed", "--")):
            series = _layer_series(run.table, "p0_outlier_max_z", where=where)
            prefix = f"{run.label}: " if len(runs) > 1 else ""
            ax.plot(series.index, series.values, marker="o", markersize=3, linestyle=style,
                    color=colours.get(run.label),
                    label=f"{prefix}{'before' if where == 'resid_pre' else 'after'} the pre-norm")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("max over channels of |z| at position 0")
    ax.set_title("Position-0 outlier channels")
    ax.grid(True, linewidth=0.4, alpha=0.4)
    _legend(ax)
    out = [keep(fig, "circuit_outliers", "largest |z| per layer, before (solid) and after (dashed) the first pre-norm")]
    columns = ["run", "layer", "where", "top channels (z)"]
    body = []
    for run in runs:
        z, ch = _rows(run.table, "p0_outlier_z"), _rows(run.table, "p0_outlier_channel")
        if z.empty:
            continue
        merged = z.merge(ch, on=["layer", "where", "rank"], suffixes=("", "_channel"))
        for (layer, where), part in merged.sort_values("rank").groupby(["layer", "where"], sort=True):
            text = ", ".join(f"{int(c)} ({v:+.3g})" for c, v in zip(part["value_channel"], part["value"]))
            body.append([run.label, str(int(layer)), str(where), text])
    return {"figures": out, "table": _table(columns, body, f"Top channels ({len(body)} rows)"), "note": None}


def _bos_sink(runs, keep, colours) -> dict:
    fig, ax = _new()
    columns, body = ["run", "BOS", "Sink_0^eps (all layers)", "Sink_0^eps[2:]"], []
    for run in runs:
        rows = _rows(run.table, "bos_sink_rate")
        if "bos" not in rows:
            continue
        for setting, style in (("with", "-"), ("without", "--")):
            series = _layer_series(run.table, "bos_sink_rate", bos=setting)
            if series.empty:
                continue
            prefix = f"{run.label}: " if len(runs) > 1 else ""
            ax.plot(series.index, series.values, marker="o", markersize=3, linestyle=style,
                    color=colours.get(run.label), label=f"{prefix}{setting} BOS")
            model = rows[rows.layer.isna() & (rows["bos"].astype(str) == setting)]["value"]
            late = _rows(run.table, "bos_sink_rate_from_layer")  # whatever its layer_start
            late = late[late["bos"].astype(str) == setting]["value"] if "bos" in late else late["value"].iloc[0:0]
            body.append([run.label, setting, _fmt(model.iloc[0]) if len(model) else "—",
                         _fmt(late.iloc[0]) if len(late) else "—"])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("layer")
    ax.set_ylabel("Sink_0^eps (share of heads)")
    ax.set_title("Sink rate with and without BOS")
    ax.grid(True, linewidth=0.4, alpha=0.4)
    _legend(ax)
    out = [keep(fig, "circuit_bos_sink_rate", "Sink_0^eps per layer on [BOS] + K (solid) and on K (dashed)")]
    return {"figures": out, "table": _table(columns, body, "Sink rate per setting"), "note": None}


def _bos_loss(runs, keep, colours) -> dict:
    fig, ax = _new()
    columns, body = ["run", "BOS", "r", "loss", "loss change vs r = 1"], []
    for run in runs:
        loss, delta = _rows(run.table, "bos_repeat_loss"), _rows(run.table, "bos_repeat_loss_delta")
        if "repeat" not in delta:
            continue
        for setting, style in (("with", "-"), ("without", "--")):
            d = delta[delta["bos"].astype(str) == setting].sort_values("repeat")
            if d.empty:
                continue
            prefix = f"{run.label}: " if len(runs) > 1 else ""
            ax.plot(d["repeat"].astype(int), d["value"], marker="o", markersize=3, linestyle=style,
                    color=colours.get(run.label), label=f"{prefix}{setting} BOS ({'BOS' if setting == 'with' else 'first token'} repeated)")
            for _, row in d.iterrows():
                l = loss[(loss["bos"].astype(str) == setting) & (loss["repeat"] == row["repeat"])]["value"]
                body.append([run.label, setting, str(int(row["repeat"])), _fmt(l.iloc[0]) if len(l) else "—",
                             _fmt(row["value"])])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("r (times the first token appears)")
    ax.set_ylabel("loss change vs r = 1 (nats / token)")
    ax.set_title("Repeating the first token")
    ax.axhline(0, color="0.35", linewidth=0.8)
    ax.grid(True, linewidth=0.4, alpha=0.4)
    _legend(ax)
    out = [keep(fig, "circuit_bos_repeat", "loss on the same targets K[1:] when the first token is repeated r times")]
    return {"figures": out, "table": _table(columns, body, "Loss per setting and r"),
            "note": "Losses on the repeated positions and at BOS are excluded: every pass scores the same tokens."}


__all__ = ["DRAWN", "FOLDED", "SUMMARY_LABEL", "entry", "handles", "summary_value"]
