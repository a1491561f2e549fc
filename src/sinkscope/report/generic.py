"""The report's generic entry: any metric no other section claims, drawn per layer and per head.

One run: its per-layer line (the uniform p0 floor or the dormancy threshold dashed where they
apply) and its layer x head heatmap; several: an overlay of the per-layer lines (one per run, in the
run's colour on the page) and heatmaps on one shared colour scale. Per-layer shares (``token_share``)
are bars instead, and an index (``massive_activation_channel``) markers on a categorical axis; the gate
metrics of a comparison get one plot of their model value per run, by tier with one line per
variant when the runs span tiers (Wang 2026 Fig. 1d). A table of the per-layer values follows, and
the model value goes into the summary.

A model without a learned phantom key gets no phantom-mass figures (the value is 0 by
construction), only a line saying so; the ``heads`` command's metrics get sentences on the
dormant heads and on what zeroing them did. The sliding / full layer-type means of a run get a
section of their own (:func:`layer_type_section`).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from sinkscope.report import figures
from sinkscope.report.page import COLLAPSE_ROWS, Page, _embed_png, fmt, fmt_se
from sinkscope.report.runs import (RunData, _has_heads, _has_layers, _has_phantom, _model_value, _probe_options,
                                   _seq_len, uniform_p0)
from sinkscope.store.results import NOT_CONDITIONS

#: metrics that only mean something for a model with a learned phantom key (gpt-oss sinks, sinklogit).
PHANTOM_METRICS = ("phantom_mass", "sink_logit", "exposure_phantom_mass")
#: per-layer shares drawn as bars (with their heatmap) rather than lines.
BAR_METRIC_PREFIXES = ("token_share",)
#: gate metrics whose model value gets one plot across the runs of a comparison (Wang 2026 Fig. 1d).
ACROSS_RUN_METRICS = ("gate_selectivity", "gate_mean", "token_share", "out_gate_mean", "out_gate_first")
#: tiers in size order, for the x axis of a comparison across tiers (the trainer's TIERS).
TIER_ORDER = ("micro", "tiny", "10M", "50M", "124M", "350M")
OUTPUT_GATE_NOTE = ("An output gate is query-controlled (one value per query position and channel or head), so "
                    "within-row selectivity, the spread of the gate over the keys one query reads, is not defined "
                    "for it; these are its mean, first-token and sparsity statistics.")
#: summary metrics whose model value is not the mean over layers, and what it is instead.
AGGREGATE_EXCEPTIONS = (("massive_activation", "massive activations: the largest over layers"),
                        ("token_share", ("token-identity shares: pooled over every head of every layer, sum of "
                                         "between SS / sum of total SS")))


# ---- the section protocol (page.py) ------------------------------------------------------------------


def handles(probe: str, metric: str, runs: list[RunData]) -> bool:
    """Every metric: the last section the page asks."""
    return True


def entry(page: Page, metric: str) -> dict:
    """The metric's summary row, figures, note and per-layer table."""
    runs, info = page.runs, page.info(metric)
    page.add_summary(metric, info.label, info.direction, [fmt(_model_value(r.table, metric)) for r in runs])
    no_phantom = [r for r in runs if not _has_phantom(r)] if metric in PHANTOM_METRICS else []
    note = _heads_note(runs, metric)
    if no_phantom:
        names = ", ".join(r.label for r in no_phantom)
        note = (f"{'The model' if len(runs) == 1 else names} has no learned phantom key, so its {metric} is 0 "
                f"by construction; no figures are drawn{' for it' if len(runs) > 1 else ''}.")
    replaced = _figures_replaced(runs, metric)
    return {
        "metric": metric, "info": info, "note": note,
        "figures": [] if replaced else _figures_for_metric(runs, metric, page.fig_dir, page.labels, page.colours),
        "table": _layer_table(runs, metric) if all(_has_layers(r.table, metric) for r in runs)
        and len(no_phantom) < len(runs) and not replaced else None,
    }


def note(probe: str, metrics: list[str]) -> str | None:
    return OUTPUT_GATE_NOTE if any(m.startswith("out_gate_") for m in metrics) else None


def tables(page: Page, probe: str) -> list[dict]:
    return []


def against_step(runs: list[RunData], metric: str) -> bool:
    """Whether a series of checkpoints draws this metric against the step (per-layer rows in every run)."""
    return (all(_has_layers(r.table, metric) for r in runs)
            and (metric not in PHANTOM_METRICS or all(_has_phantom(r) for r in runs)))


def aggregates_note(summary: list[dict]) -> str:
    """The sentence under the summary: how a model value aggregates, with the metrics that differ."""
    exceptions = [text for prefix, text in AGGREGATE_EXCEPTIONS if any(row["metric"].startswith(prefix)
                                                                       for row in summary)]
    return ("Model-level values: the mean over layers of per-layer means over heads"
            + (f" ({'; '.join(exceptions)})" if exceptions else "") + ".")


# ---- notes -------------------------------------------------------------------------------------------


def _dormant_below(run: RunData) -> float | None:
    value = _probe_options(run, "head_importance").get("dormant_below")
    return float(value) if isinstance(value, (int, float)) else None


def _heads_note(runs: list[RunData], metric: str) -> str | None:
    """The ``heads`` command's sentences under a metric: which heads are dormant, what zeroing them did."""
    def per_run(run: RunData, text: str) -> str:
        return text if len(runs) == 1 else f"{run.label}: {text}"

    if metric == "dormant":
        parts = []
        for run in runs:
            rows = run.table[(run.table.metric == "dormant") & run.table["head"].notna()]
            imp = run.table[(run.table.metric == "head_importance") & run.table["head"].notna()]
            imp = imp.set_index(["layer", "head"])["value"]
            hit = rows[rows["value"] > 0.5].sort_values(["layer", "head"])
            names = [f"{int(r.layer)}.{int(r['head'])} ({fmt(imp.get((r.layer, r['head'])))})" for _, r in hit.iterrows()]
            shown = ", ".join(names[:60]) + (f", ... ({len(names) - 60} more)" if len(names) > 60 else "")
            below = _dormant_below(run)
            parts.append(per_run(run, f"{len(names)} of {len(rows)} heads have importance below "
                                      f"{fmt(below)}" + (f": {shown} (layer.head (importance))" if names else "")))
        return "Dormant heads — " + "; ".join(parts) + "."
    if metric == "loss_delta":
        parts = []
        for run in runs:
            heads = _probe_options(run, "head_ablation").get("heads") or []
            value = {m: _model_value(run.table, m) for m in ("loss_clean", "loss_ablated", "loss_delta")}
            parts.append(per_run(run, f"zeroing {len(heads)} head(s) at hook_z "
                                      f"({', '.join(map(str, heads[:30]))}{', ...' if len(heads) > 30 else ''}) moves "
                                      f"the loss from {fmt(value['loss_clean'])} to {fmt(value['loss_ablated'])} nats "
                                      f"per token ({float(value['loss_delta']):+.4g})"))
        return "; ".join(parts) + "."
    if _figures_replaced(runs, metric):
        return ("Without output gates the head importance is this implicit gate, so its figures are drawn once, "
                "under head_importance.")
    return None


def _figures_replaced(runs: list[RunData], metric: str) -> bool:
    """Whether a note replaces the metric's figures: ``implicit_gate`` where it is the head importance."""
    return metric == "implicit_gate" and all(_probe_options(r, "head_importance").get("gate") == "implicit"
                                             for r in runs)


def _figures_for_metric(runs: list[RunData], metric: str, fig_dir: Path,
                        labels: figures.MetricLabels | None = None,
                        colours: dict[str, str] | None = None) -> list[dict]:
    """Draw and save this metric's figures; return [{title, src, files}] for the page.

    ``colours``: each run's colour on the page (``Page.colours``; default by these runs' order), so a run
    keeps its colour in every figure even where a figure leaves other runs out.
    """
    colours = colours or figures.run_colours(r.label for r in runs)
    stem = figures._file_stem(metric)
    out: list[dict] = []
    comparing, position = len(runs) > 1, {id(run): i for i, run in enumerate(runs)}
    # A dashed reference per run, keyed so runs sharing it draw it once: the uniform p0 floor per
    # seq-len, or the dormancy threshold of head importance.
    references: dict = {}
    key_of = _seq_len
    what = "uniform attention"
    if metric == "p0_mass":  # the uniform floor, per seq-len in the runs
        references = {t: uniform_p0(t) for t in sorted({_seq_len(r) for r in runs} - {None})}
    elif metric == "head_importance":  # heads below the line are dormant
        key_of, what = _dormant_below, "dormant below"
        references = {b: b for b in sorted({_dormant_below(r) for r in runs} - {None})}

    def reference_of(run: RunData) -> float | None:
        return references.get(key_of(run))

    def reference_label(key) -> str:
        if metric != "p0_mass":
            return f"{what} {key:g}"
        where = f", seq-len {key}" if len(references) > 1 else ""
        return f"uniform attention{where} ({references[key]:.3g})"

    def keep(fig, name: str, title: str) -> None:
        png, svg = figures.save_figure(fig, fig_dir / name)
        kind = "heatmap" if name.startswith("heatmap") else "line"
        out.append({"title": title, "src": _embed_png(png), "files": [png.name, svg.name], "kind": kind})

    if metric in PHANTOM_METRICS:
        runs = [r for r in runs if _has_phantom(r)]  # zeros by construction say nothing
        if not runs:
            return out
    if comparing and metric in ACROSS_RUN_METRICS:
        points, x_label = _across_runs(runs, metric)
        if len(points):
            series = colours if x_label == "run" else figures.run_colours(points["series"].astype(str))
            keep(figures.model_value_plot(points, metric, x_label=x_label, labels=labels, colours=series),
                 f"runs_{stem}", f"model value per {x_label} (bars: range over layers)")
    if labels is not None and metric in labels.categorical and all(_has_layers(r.table, metric) for r in runs):
        keep(figures.per_layer_categories({r.label: r.table for r in runs}, metric, labels=labels, colours=colours),
             f"layers_{stem}", "per layer, one marker per layer" + (" and run" if comparing else "")
             + " (the values are indices: categories, not quantities)")
    elif metric.startswith(BAR_METRIC_PREFIXES) and all(_has_layers(r.table, metric) for r in runs):
        keep(figures.per_layer_bars({r.label: r.table for r in runs}, metric, labels=labels, colours=colours),
             f"bars_{stem}",
             "per layer" + (", one bar per run" if comparing else "") + " (pooled over the layer's heads)")
    elif all(_has_layers(r.table, metric) for r in runs):
        drawn: set[int] = set()

        def reference_kwargs(run: RunData) -> dict:
            key = key_of(run)
            if key not in references or key in drawn:
                return {}
            drawn.add(key)
            return {"reference": references[key], "reference_label": reference_label(key)}

        if not comparing:
            keep(figures.per_layer_line(runs[0].table, metric, labels=labels, **reference_kwargs(runs[0])),
                 f"layers_{stem}", "per layer" + (f" (dashed: {what})" if drawn else ""))
        else:
            fig = None
            for run in runs:
                if fig is None:
                    fig = figures.per_layer_line(run.table, metric, label=run.label, labels=labels,
                                                 color=colours.get(run.label), **reference_kwargs(run))
                    ax = fig.axes[0]
                else:
                    figures.per_layer_line(run.table, metric, label=run.label, ax=ax, labels=labels,
                                           color=colours.get(run.label), **reference_kwargs(run))
            keep(fig, f"overlay_{stem}",
                 "per layer, one line per run" + (f" (dashed: {what})" if drawn else ""))
    heads = [r for r in runs if _has_heads(r.table, metric)]
    if heads and not (labels is not None and metric in labels.categorical):  # no colour scale of indices
        values = pd.concat([r.table[(r.table.metric == metric) & r.table["head"].notna()]["value"] for r in heads])
        vmin, vmax = (float(values.min()), float(values.max())) if comparing else (None, None)
        for run in heads:
            title = run.label if comparing else None
            fig = figures.layer_head_heatmap(run.table, metric, title=title, vmin=vmin, vmax=vmax,
                                             reference=reference_of(run), labels=labels)
            suffix = f"_run{position[id(run)]}" if comparing else ""
            mark = f" (dashed on the colour bar: {what})" if reference_of(run) is not None else ""
            keep(fig, f"heatmap_{stem}{suffix}", f"layer x head{': ' + run.label if comparing else ''}{mark}")
    return out



def _across_runs(runs: list[RunData], metric: str) -> tuple[pd.DataFrame, str]:
    """One point per run: its model value and the range of its layer values; by tier when the runs span tiers."""
    rows = []
    for run in runs:
        table = run.table[run.table.metric == metric]
        model = table[table.layer.isna() & table["head"].isna()]["value"]
        layers = table[table.layer.notna() & table["head"].isna()]["value"]
        if model.empty:
            continue
        rows.append({"run": run.label, "tier": _condition(run, "tier"), "variant": _condition(run, "variant"),
                     "value": float(model.iloc[0]), "lo": float(layers.min()) if len(layers) else float("nan"),
                     "hi": float(layers.max()) if len(layers) else float("nan")})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame, "run"
    tiers = [t for t in frame["tier"] if t is not None]
    if len(tiers) == len(frame) and len(set(tiers)) > 1 and frame["variant"].notna().all():
        order = {t: i for i, t in enumerate(TIER_ORDER)}
        frame = frame.assign(x=frame["tier"].astype(str), series=frame["variant"].astype(str))
        frame = frame.sort_values("x", key=lambda col: col.map(lambda t: (order.get(t, len(order)), t)), kind="stable")
        return frame, "tier"
    return frame.assign(x=frame["run"], series="runs"), "run"


def _condition(run: RunData, key: str):
    """A run's condition (variant, tier, ...) from its manifest, its grouping, or None."""
    conditions = run.manifest.get("conditions") or {}
    grouped = run.manifest.get("grouped") or {}
    if grouped.get("by") == key:
        return grouped.get("value")
    value = conditions.get(key)
    return None if value is None else str(value)



# ---- tables ------------------------------------------------------------------------------------------


def _layer_table(runs: list[RunData], metric: str) -> dict:
    """Per-layer rows: layer, then per run the layer value (and min/max over heads for one run).

    A layer value that is a mean over windows reads ``value ± se`` (one standard error over the
    windows, the ``se`` column).
    """
    single = len(runs) == 1
    columns = ["layer"] + ([f"{metric}", "min over heads", "max over heads", "n"] if single
                           else [run.label for run in runs])
    per_run = []
    for run in runs:
        rows = run.table[run.table.metric == metric]
        layer_rows = rows[rows.layer.notna() & rows["head"].isna()].set_index("layer")
        if "se" not in layer_rows.columns:
            layer_rows = layer_rows.assign(se=math.nan)
        heads = rows[rows.layer.notna() & rows["head"].notna()].groupby("layer")["value"].agg(["min", "max"])
        per_run.append((layer_rows, heads))
    layers = sorted(set().union(*[set(lr.index.astype(int)) for lr, _ in per_run]))
    body = []
    for layer in layers:
        if single:
            layer_rows, heads = per_run[0]
            row = layer_rows.loc[layer]
            lo, hi = (heads.loc[layer, "min"], heads.loc[layer, "max"]) if layer in heads.index else (None, None)
            body.append([str(layer), fmt_se(row["value"], row["se"]), fmt(lo), fmt(hi), str(int(row["n"]))])
        else:
            body.append([str(layer)] + [fmt_se(lr.loc[layer, "value"], lr.loc[layer, "se"]) if layer in lr.index
                                        else "—" for lr, _ in per_run])
    return {"columns": columns, "rows": body, "collapsed": len(body) > COLLAPSE_ROWS}




LAYER_TYPE_NOTE = ("Models with sliding-window layers: each metric's mean over the sliding layers and over the full "
                   "ones (per-layer means over heads, averaged over the layers of the type; Wang 2026 Table 14). On a "
                   "sliding layer queries i >= W cannot see key 0 and count as 0 in p0_mass; p0_mass_in_reach "
                   "averages over the queries that can see it and p0_out_of_reach is the share that cannot, so "
                   "'no sink' reads apart from 'sink out of reach'; sink_rate_in_reach and sink_alpha_in_reach do "
                   "the same for Gu et al.'s sink rate.")


def layer_type_section(runs: list[RunData]) -> dict | None:
    """One table per run: metric | sliding | full (the ``layer_type`` rows), or None without them."""
    tables = []
    for run in runs:
        table = run.table
        if "layer_type" not in table.columns or not table["layer_type"].notna().any():
            continue
        split = table[table["layer_type"].notna() & table.layer.isna() & table["head"].isna()]
        others = [c for c in split.columns if c not in (*NOT_CONDITIONS, "layer_type")
                  and split[c].notna().any()]
        rows = []
        for (metric, *rest), part in split.groupby(["metric", *others], sort=False, dropna=False):
            values = dict(zip(part["layer_type"], part["value"]))
            name = metric + "".join(f" ({c}={v})" for c, v in zip(others, rest) if not pd.isna(v))
            rows.append([name, fmt(values.get("sliding")), fmt(values.get("full"))])
        tables.append({"caption": f"{run.label}: mean over sliding and over full layers", "columns":
                       ["metric", "sliding layers", "full layers"], "rows": rows})
    return {"probe": "layer_types", "entries": [], "note": LAYER_TYPE_NOTE, "tables": tables} if tables else None


