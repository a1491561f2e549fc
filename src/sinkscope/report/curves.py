"""Curves against something other than the layer: training loss and imbalance, dose, context length, step.

The figure library's second half (``report/figures.py`` holds the grids, heatmaps, per-layer
plots and saving), in the same style: the object-oriented matplotlib API only, figures never
registered with pyplot, style applied through :func:`matplotlib.rc_context` while a figure is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from sinkscope.report.figures import (_LINE_FIGSIZE, _STYLE, MetricLabels, _colour_of, metric_axis_label, metric_title,
                                      run_colours)

__all__ = ["MODEL_LINE", "dose_response", "imbalance_curves", "loss_curves", "metric_vs_length", "metric_vs_step"]


def loss_curves(logs: Mapping[str, pd.DataFrame], colours: Mapping[str, str] | None = None) -> Figure:
    """Training curves of one or more checkpoints: validation loss (solid, markers) and
    training loss (thin, same colour) against optimizer step, one colour per checkpoint.

    Args:
        logs: ``label -> log.csv`` table with columns ``step``, ``train_loss``, ``val_loss``
            (empty cells where a row has no evaluation).
        colours: ``label -> colour`` of every checkpoint of the page (``figures.run_colours``);
            default by the order of ``logs``.

    Returns:
        The figure.
    """
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=_LINE_FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title("Training curves")
        colours = colours or run_colours(logs)
        for k, (label, log) in enumerate(logs.items()):
            log = log.sort_values("step")
            val = log.dropna(subset=["val_loss"])
            (line,) = ax.plot(val["step"], val["val_loss"], marker="o", markersize=3, linewidth=1.4,
                              label=f"{label}: validation", zorder=3, color=_colour_of(colours, label, k))
            train = log.dropna(subset=["train_loss"])
            ax.plot(train["step"], train["train_loss"], linewidth=0.8, alpha=0.6, color=line.get_color(),
                    linestyle="--", label=f"{label}: training", zorder=2)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("cross-entropy (nats / token)")
        ax.grid(True, linewidth=0.4, alpha=0.4)
        ax.legend(loc="upper right")
    return fig


def imbalance_curves(logs: Mapping[str, pd.DataFrame], colours: Mapping[str, str] | None = None) -> Figure:
    """Head load imbalance against optimizer step (Fu et al. 2026 Fig. 5), one colour per checkpoint:
    the model's imbalance (mean over layers of the CV of head importance; solid, markers) and
    each layer's CV (thin, same colour).

    Args:
        logs: ``label -> log.csv`` table with ``step``, ``load_imbalance`` and
            ``load_imbalance_l{l}`` columns (empty cells where a row has no evaluation).
        colours: ``label -> colour`` of every checkpoint of the page, so a checkpoint keeps the colour
            of the loss curves when others have no imbalance; default by the order of ``logs``.

    Returns:
        The figure.
    """
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=_LINE_FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title("Head load imbalance")
        colours = colours or run_colours(logs)
        for k, (label, log) in enumerate(logs.items()):
            log = log.sort_values("step")
            rows = log.dropna(subset=["load_imbalance"])
            (line,) = ax.plot(rows["step"], rows["load_imbalance"], marker="o", markersize=3, linewidth=1.4,
                              label=f"{label}: mean over layers", zorder=3, color=_colour_of(colours, label, k))
            layers = sorted((c for c in log.columns if re.fullmatch(r"load_imbalance_l\d+", str(c))),
                            key=lambda c: int(str(c).rsplit("_l", 1)[1]))
            for i, column in enumerate(layers):
                ax.plot(rows["step"], rows[column], linewidth=0.7, alpha=0.45, color=line.get_color(),
                        label=f"{label}: per layer" if i == 0 else None, zorder=2)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("CV of head importance")
        ax.grid(True, linewidth=0.4, alpha=0.4)
        ax.legend(loc="upper left")
    return fig


def dose_response(points: pd.DataFrame, junk: str, colours: Mapping[str, str] | None = None) -> Figure:
    """Loss increase against dose for one junk type (Wang 2026 §5.1): one line per cutoff (and run).

    Args:
        points: columns ``run``, ``cutoff``, ``dose``, ``value`` (the loss increase in nats) and
            optionally ``se`` (its standard error over windows; NaN or absent: no error bar).
        junk: the junk type, for the title.
        colours: ``run -> colour`` of the page's runs (``figures.run_colours``): a run is one colour,
            its cutoffs line styles; default by the runs' order in ``points``.

    The y axis is logarithmic; increases <= 0 (junk that did not hurt) cannot be drawn on it and
    are left out (the table beside the figure has every number). Error bars span value ± se (a
    lower end <= 0 is clipped by the log axis).

    Returns:
        The figure.
    """
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=_LINE_FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title(f"Injected junk: {junk}")
        runs = list(dict.fromkeys(points["run"]))
        styles = {c: s for c, s in zip(("median", "q25"), ("-", "--"))}
        drawn = False
        for i, run in enumerate(runs):
            color = _colour_of(colours, run, i)
            for cutoff in dict.fromkeys(points[points["run"] == run]["cutoff"]):
                rows = points[(points["run"] == run) & (points["cutoff"] == cutoff)].sort_values("dose")
                rows = rows[rows["value"] > 0]
                if rows.empty:
                    continue
                label = f"{run}: {cutoff}" if len(runs) > 1 else f"cutoff {cutoff}"
                style = dict(marker="o", markersize=3.5, linewidth=1.4, color=color, linestyle=styles.get(cutoff, ":"),
                             label=label)
                if "se" in rows.columns and rows["se"].notna().any():
                    ax.errorbar(rows["dose"], rows["value"], yerr=rows["se"].fillna(0.0).to_numpy(), capsize=2.5,
                                elinewidth=0.9, **style)
                else:
                    ax.plot(rows["dose"], rows["value"], **style)
                drawn = True
        if drawn:
            ax.set_yscale("log")
            ax.legend(loc="upper left")
        else:
            ax.text(0.5, 0.5, "no positive loss increase to draw", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("dose eps (junk norm / the head's median read norm)")
        ax.set_ylabel("loss increase (nats / token)")
        ax.grid(True, which="both", linewidth=0.4, alpha=0.4)
    return fig


def metric_vs_length(points: pd.DataFrame, metric: str, *, predicted: pd.DataFrame | None = None,
                     floor: Mapping[int, float] | None = None, labels: MetricLabels | None = None) -> Figure:
    """A metric's per-layer value against context length, one line per layer (``--seq-len A,B,C``).

    Args:
        points: rows ``layer, seq_len, value`` (the per-layer aggregates at each length).
        metric: the metric drawn (axis label).
        predicted: optional rows ``layer, seq_len, value`` drawn dashed in the layer's colour
            (the fixed-gap leak model's prediction, fitted at the shortest length).
        floor: optional ``seq_len -> value`` drawn as a grey dotted line (p0's uniform floor).
        labels: the page's metric labels (title, y axis); default the metric's name.

    Returns:
        The figure; x is the length on a log2 axis, colours run through the layers (viridis).
    """
    from matplotlib import cm, colors, ticker

    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=_LINE_FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        layers = sorted(int(v) for v in points["layer"].unique())
        cmap = matplotlib.colormaps["viridis"]
        for k, layer in enumerate(layers):
            color = cmap(k / max(len(layers) - 1, 1))
            rows = points[points["layer"] == layer].sort_values("seq_len")
            ax.plot(rows["seq_len"], rows["value"], marker="o", markersize=3, linewidth=1.2, color=color,
                    label=f"layer {layer}" if len(layers) <= 12 else None)
            if predicted is not None:
                pred = predicted[predicted["layer"] == layer].sort_values("seq_len")
                if len(pred):
                    ax.plot(pred["seq_len"], pred["value"], linestyle="--", linewidth=0.9, color=color, alpha=0.8)
        if floor:
            xs = sorted(floor)
            ax.plot(xs, [floor[x] for x in xs], linestyle=":", color="0.4", linewidth=1.0, label="uniform attention")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(int(v) for v in points["seq_len"].unique()))
        ax.get_xaxis().set_major_formatter(ticker.ScalarFormatter())
        ax.set_xlabel("context length (tokens per window)")
        ax.set_ylabel(metric_axis_label(metric, labels))
        title = f"{metric_title(metric, labels)} against length, per layer"
        if predicted is not None:
            title += " (dashed: fixed-gap fit)"
        ax.set_title(title, fontsize=9)
        ax.grid(True, linewidth=0.4, alpha=0.4)
        if len(layers) > 12:
            norm = colors.Normalize(vmin=layers[0], vmax=layers[-1])
            fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="layer")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=7)
    return fig


#: the label of the model-level line of :func:`metric_vs_step` (drawn black, on top of the layers').
MODEL_LINE = "mean over layers"


def metric_vs_step(lines: Mapping[str, pd.DataFrame], metric: str, *, floor: float | None = None,
                   x_labels: Mapping[int, str] | None = None, title: str | None = None,
                   labels: MetricLabels | None = None, colours: Mapping[str, str] | None = None) -> Figure:
    """A metric against the training step, one line per series (sink formation, issue 29).

    Args:
        lines: ``label -> rows with columns step, value``, drawn in order: labels ``layer k`` get
            viridis colours through the layers, :data:`MODEL_LINE` is drawn black and thicker, any
            other label (a checkpoint, a variant) its colour in ``colours``, else the default colour cycle.
        metric: the metric drawn (axis label).
        floor: a value drawn as a grey dotted line (p0's uniform floor at the windows' length).
        x_labels: ``x -> text`` tick labels, for a series whose x is the revisions' position
            because their names give no step (then x is 0, 1, 2, ...).
        title: the title (default ``<the metric's label> against the training step``).
        labels: the page's metric labels (the y axis, the default title); default the metric's name.
        colours: ``label -> colour`` of the checkpoints (or variants) of the page, the same in every figure.

    Returns:
        The figure; x is the step (or the position), linear.
    """
    from matplotlib import cm, colors

    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=_LINE_FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        layers = [label for label in lines if re.fullmatch(r"layer \d+", label)]
        cmap = matplotlib.colormaps["viridis"]
        others = 0
        for label, rows in lines.items():
            rows = rows.sort_values("step")
            style: dict = {"marker": "o", "markersize": 2.5, "linewidth": 1.1}
            if label in layers:
                k = layers.index(label)
                style["color"] = cmap(k / max(len(layers) - 1, 1))
                style["label"] = label if len(layers) <= 12 else None
            elif label == MODEL_LINE:
                style.update(color="black", linewidth=1.8, label=label, zorder=3)
            else:
                style.update(color=_colour_of(colours, label, others), label=label)
                others += 1
            ax.plot(rows["step"].to_numpy(dtype=float), rows["value"].to_numpy(dtype=float), **style)
        if floor is not None and np.isfinite(floor):
            ax.axhline(floor, linestyle=":", color="0.4", linewidth=1.0, label=f"uniform attention ({floor:.3g})")
        if x_labels:
            ax.set_xticks(sorted(x_labels), [x_labels[x] for x in sorted(x_labels)], rotation=30, ha="right")
            ax.set_xlabel("revision")
        else:
            ax.set_xlabel("training step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric_axis_label(metric, labels))
        ax.set_title(title or f"{metric_title(metric, labels)} against the training step", fontsize=9)
        ax.grid(True, linewidth=0.4, alpha=0.4)
        if len(layers) > 12:
            numbers = [int(label.split()[1]) for label in layers]
            norm = colors.Normalize(vmin=min(numbers), vmax=max(numbers))
            fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="layer")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=7)
    return fig
