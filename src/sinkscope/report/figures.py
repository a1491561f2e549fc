"""Publication-style figures for sinkscope results.

All functions take the *tidy* results table used throughout sinkscope: a
:class:`pandas.DataFrame` with columns

* ``probe`` (str) -- name of the probe that produced the row,
* ``metric`` (str) -- metric name, e.g. ``p0_mass``,
* ``layer`` (nullable ``Int64``) -- layer index, ``<NA>`` for model aggregates,
* ``head`` (nullable ``Int64``) -- head index, ``<NA>`` for layer/model
  aggregates,
* ``value`` (float64) -- the measurement, possibly NaN,
* ``n`` (int64) -- number of observations behind ``value``.

Only the object-oriented matplotlib API is used: figures are created as
:class:`matplotlib.figure.Figure` instances that are never registered with
pyplot, so nothing leaks between calls and no figure has to be closed. No
backend is selected (``Figure.savefig`` renders PNG/SVG without one), so
importing this module does not disturb an interactive session. Style
settings are applied through :func:`matplotlib.rc_context` while a figure is
built, so the global rcParams are left untouched.

Metric names become human labels only through a :class:`MetricLabels` handed in (one per
page, from the runs' metric documentation); there is no module-level state. A title is the
metric's label alone (the metric's name shows only where no label is known); the axis or colour
bar adds the unit. Curves against anything but the layer (training loss, dose, length, step) live
in ``report/curves.py``.

A metric whose value is an index (a channel, a token position: :attr:`MetricLabels.categorical`)
is drawn as categories, one marker per layer on a categorical axis (:func:`per_layer_categories`),
never as a line through the indices. In a comparison every run keeps one colour on every figure
of the page (:func:`run_colours`, handed to each figure that draws runs), with a legend on each.

Colour maps default to ``viridis_r`` (perceptually uniform, monotone in
lightness, so heatmaps stay readable in greyscale print), light = low and
dark = high, as the explorer's heads grid and pattern draw them
(``static/explorer/00-util.js``, ``scaleCss``): one scale on the whole page.
Missing (NaN) cells are drawn as hatched light grey, which the hatching keeps
apart from every colour of the map in greyscale too.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

from sinkscope.errors import SinkscopeError
from sinkscope.store.files import atomic_write_bytes

__all__ = [
    "MetricLabels",
    "is_index_unit",
    "layer_head_grid",
    "layer_head_heatmap",
    "metric_axis_label",
    "metric_title",
    "model_value_plot",
    "per_layer_bars",
    "per_layer_categories",
    "per_layer_line",
    "run_colours",
    "save_figure",
    "write_run_figures",
]


@dataclass(frozen=True)
class MetricLabels:
    """Human-readable label and unit of each metric, the metrics whose head axis indexes KV heads, and
    the metrics whose value is an index (a category, not a quantity).

    Made from the metric documentation the runs' manifests carry (:meth:`from_docs`; the report
    never imports the probes, or torch), once per page, and handed to each figure that names a
    metric. Unknown metrics fall back to the raw metric name, without a unit, over query heads,
    as quantities.
    """

    #: ``metric -> (label, unit)``.
    names: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    #: metrics whose head axis indexes key/value heads (GQA) rather than query heads.
    kv_heads: frozenset[str] = frozenset()
    #: metrics whose value is an index (``massive_activation_channel``: a channel; a token position).
    categorical: frozenset[str] = frozenset()

    @classmethod
    def from_docs(cls, docs: Mapping[str, object]) -> MetricLabels:
        """From ``MetricInfo``-like documentation by metric name (``label``, ``unit``, ``per``)."""
        return cls({metric: (info.label, info.unit) for metric, info in docs.items()},
                   frozenset(metric for metric, info in docs.items() if info.per == "layer x KV head"),
                   frozenset(metric for metric, info in docs.items() if is_index_unit(info.unit)))


def is_index_unit(unit: str) -> bool:
    """Whether a metric's unit names an index (``channel index``, ``layer index``, ``token position``):
    its values are categories, and a line through them or a mean of them means nothing."""
    return bool(re.search(r"\b(index|position)$", str(unit).strip()))


def _names(labels: MetricLabels | Mapping[str, tuple[str, str]] | None) -> Mapping[str, tuple[str, str]]:
    if labels is None:
        return {}
    return labels.names if isinstance(labels, MetricLabels) else labels


REQUIRED_COLUMNS: tuple[str, ...] = ("metric", "layer", "head", "value")

#: Colour (and hatch) used for NaN / missing cells in heatmaps.
MISSING_COLOR = "0.86"
MISSING_HATCH_COLOR = "0.55"
MISSING_HATCH = "////"

PNG_DPI = 150
SVG_HASHSALT = "sinkscope"

# Heatmap sizing: inches per cell, plus fixed room for labels and colourbar,
# clipped to a range that fits a paper page / slide.
_CELL_IN = 0.17
_HEATMAP_PAD_W = 2.0
_HEATMAP_PAD_H = 1.3
_HEATMAP_W_RANGE = (4.5, 12.0)
_HEATMAP_H_RANGE = (3.2, 9.0)
_WRAP_BELOW_IN = 5.0
_CBAR_W_IN = 0.15
_LINE_FIGSIZE = (6.0, 3.8)

_STYLE: dict[str, object] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "hatch.linewidth": 0.5,
    "svg.hashsalt": SVG_HASHSALT,
}


def metric_axis_label(
    metric: str,
    labels: MetricLabels | Mapping[str, tuple[str, str]] | None = None,
    *,
    wrap: bool = False,
) -> str:
    """Return an axis/colourbar label "Human label (unit)" for a metric.

    Args:
        metric: Metric name as it appears in the ``metric`` column.
        labels: The page's :class:`MetricLabels`, or a mapping ``metric -> (label, unit)``;
            none: every metric is unknown.
        wrap: Put the unit on a second line (for short axes).

    Returns:
        ``"label (unit)"`` for known metrics, the bare label when the unit is
        empty, and the metric name itself for unknown metrics.
    """
    table = _names(labels)
    if metric not in table:
        return metric
    label, unit = table[metric]
    if not unit:
        return label
    return f"{label}\n({unit})" if wrap else f"{label} ({unit})"


def metric_title(metric: str, labels: MetricLabels | Mapping[str, tuple[str, str]] | None = None) -> str:
    """A figure's title for a metric: its human label alone (``Position-0 mass``), the metric's name
    where no label is known. The unit goes on the axis (:func:`metric_axis_label`)."""
    return _names(labels).get(metric, (metric, ""))[0] or metric


#: the colours of the runs of a comparison, in the page's run order (matplotlib's ``tab10``; ``tab20`` past 10 runs).
_RUN_PALETTES = ("tab10", "tab20")
#: the markers of the runs of a categorical figure, so runs stay apart in greyscale too.
_RUN_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")


def run_colours(names) -> dict[str, str]:
    """One colour per run, by the runs' order on the page: the same run has the same colour in every
    figure of the page, whichever runs a figure leaves out (a run without the metric, one without a
    phantom key). Up to 10 runs get ``tab10``, more ``tab20`` (a colour each up to 20, then repeated)."""
    names = list(dict.fromkeys(str(n) for n in names))
    palette = matplotlib.colormaps[_RUN_PALETTES[0] if len(names) <= 10 else _RUN_PALETTES[1]].colors
    return {name: to_hex(palette[k % len(palette)]) for k, name in enumerate(names)}


def _colour_of(colours: Mapping[str, str] | None, name: str, k: int) -> str:
    """``name``'s colour from the page's mapping, else matplotlib's k-th default colour."""
    return colours[name] if colours and name in colours else f"C{k % 10}"


def _check_columns(df: pd.DataFrame) -> None:
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise SinkscopeError(
            f"the results table lacks the column(s) {', '.join(missing)} needed for figures; "
            f"it has {', '.join(map(str, df.columns))}."
        )


def _per_head_rows(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    sel = (df["metric"] == metric) & df["layer"].notna() & df["head"].notna()
    return df.loc[sel.fillna(False).astype(bool)]


def _per_layer_rows(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    sel = (df["metric"] == metric) & df["layer"].notna() & df["head"].isna()
    return df.loc[sel.fillna(False).astype(bool)]


def _raise_on_duplicates(rows: pd.DataFrame, keys: list[str], metric: str) -> None:
    dup = rows.duplicated(subset=keys, keep=False)
    if dup.any():
        example = rows.loc[dup, keys].iloc[0].tolist()
        probes = sorted(rows.loc[dup, "probe"].astype(str).unique()) if "probe" in rows else []
        where = ", ".join(f"{k} {v}" for k, v in zip(keys, example))
        raise SinkscopeError(
            f"metric {metric!r} has several rows for {where}"
            + (f" (probes {', '.join(probes)})" if probes else "")
            + "; plot one run and probe at a time."
        )


def layer_head_grid(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Pivot the per-(layer, head) rows of one metric into a layer x head grid.

    The grid covers every integer layer and head between the smallest and the
    largest index present; cells without a row are NaN.

    Args:
        df: Tidy results table.
        metric: Metric to extract.

    Returns:
        Float DataFrame indexed by layer (rows) with heads as columns.

    Raises:
        SinkscopeError: If the metric has no per-(layer, head) rows or has several
            rows for the same (layer, head).
    """
    _check_columns(df)
    rows = _per_head_rows(df, metric)
    if rows.empty:
        raise SinkscopeError(f"metric {metric!r} has no per-(layer, head) rows to draw a heatmap from.")
    rows = pd.DataFrame(
        {
            "layer": rows["layer"].astype("int64").to_numpy(),
            "head": rows["head"].astype("int64").to_numpy(),
            "value": rows["value"].astype("float64").to_numpy(),
            **({"probe": rows["probe"].to_numpy()} if "probe" in rows else {}),
        }
    )
    _raise_on_duplicates(rows, ["layer", "head"], metric)
    grid = rows.pivot(index="layer", columns="head", values="value")
    layers = np.arange(grid.index.min(), grid.index.max() + 1)
    heads = np.arange(grid.columns.min(), grid.columns.max() + 1)
    grid = grid.reindex(index=layers, columns=heads).astype("float64")
    grid.index.name, grid.columns.name = "layer", "head"
    return grid


def _heatmap_figsize(n_layers: int, n_heads: int) -> tuple[float, float]:
    w = float(np.clip(n_heads * _CELL_IN + _HEATMAP_PAD_W, *_HEATMAP_W_RANGE))
    h = float(np.clip(n_layers * _CELL_IN + _HEATMAP_PAD_H, *_HEATMAP_H_RANGE))
    return w, h


def layer_head_heatmap(
    df: pd.DataFrame,
    metric: str,
    *,
    title: str | None = None,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str = "viridis_r",
    reference: float | None = None,
    labels: MetricLabels | None = None,
) -> Figure:
    """Draw a layer x head heatmap of one metric.

    Rows are layers (layer 0 at the top), columns are heads. Only rows where
    both ``layer`` and ``head`` are present are used. NaN or absent cells are
    drawn hatched light grey. Tick labels are thinned automatically and the
    figure size grows with the grid but stays within page-friendly bounds, so
    a 36-layer x 64-head grid stays readable.

    Args:
        df: Tidy results table.
        metric: Metric to plot.
        title: Axes title; defaults to the metric's human label.
        vmin: Lower end of the colour scale; data minimum if None.
        vmax: Upper end of the colour scale; data maximum if None.
        cmap: Name of a registered matplotlib colour map; default ``viridis_r``
            (dark = high, as the explorer). Prefer perceptually uniform maps
            (``viridis``, ``cividis``) so the figure survives greyscale printing.
        reference: A value to mark on the colourbar (e.g. the p0 mass of
            uniform attention), drawn as a dashed line when inside the scale.
        labels: The page's metric labels (title, colourbar, a KV-head axis); default the
            metric's name over query heads.

    Returns:
        The figure. The image is ``fig.axes[0].images[0]``; its array is the
        masked layer x head grid (see :func:`layer_head_grid`).

    Raises:
        SinkscopeError: If the metric has no per-(layer, head) rows or duplicates.
    """
    grid = layer_head_grid(df, metric)
    data = np.ma.masked_invalid(grid.to_numpy(dtype="float64"))
    layers = grid.index.to_numpy()
    heads = grid.columns.to_numpy()

    if data.mask.all() and vmin is None and vmax is None:
        vmin, vmax = 0.0, 1.0  # nothing to scale; avoid a degenerate norm

    colormap = matplotlib.colormaps[cmap].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))
    head_label = "KV head" if labels is not None and metric in labels.kv_heads else "head"
    # Cell (layer l, head h) is centred on data coordinates (h, l).
    extent = (heads[0] - 0.5, heads[-1] + 0.5, layers[-1] + 0.5, layers[0] - 0.5)

    fig_w, fig_h = _heatmap_figsize(len(layers), len(heads))
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(fig_w, fig_h), layout="constrained")
        ax = fig.add_subplot()
        # Hatched background shows through transparent (masked) cells.
        ax.add_patch(
            Rectangle(
                (extent[0], extent[3]),
                extent[1] - extent[0],
                extent[2] - extent[3],
                facecolor=MISSING_COLOR,
                edgecolor=MISSING_HATCH_COLOR,
                hatch=MISSING_HATCH,
                linewidth=0.0,
                zorder=-1,
            )
        )
        im = ax.imshow(
            data,
            cmap=colormap,
            vmin=vmin,
            vmax=vmax,
            origin="upper",
            extent=extent,
            aspect="auto",
            interpolation="nearest",
        )
        ax.set_xlim(extent[0], extent[1])
        ax.set_ylim(extent[2], extent[3])  # inverted: layer 0 at the top
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(nbins="auto", integer=True, min_n_ticks=2))
        ax.tick_params(length=2.5)
        for spine in ax.spines.values():
            spine.set_visible(True)
        ax.set_xlabel(head_label)
        ax.set_ylabel("layer")
        ax.set_title(title if title is not None else metric_title(metric, labels))

        # Fixed physical colourbar width; aspect chosen so it spans the axes height.
        cbar = fig.colorbar(
            im,
            ax=ax,
            fraction=_CBAR_W_IN / max(fig_w - _HEATMAP_PAD_W, 1.0),
            pad=0.01,
            aspect=max(10.0, (fig_h - _HEATMAP_PAD_H) / _CBAR_W_IN),
        )
        # A long label does not fit along a short colourbar: unit on a second line.
        cbar.set_label(metric_axis_label(metric, labels, wrap=fig_h < _WRAP_BELOW_IN))
        cbar.outline.set_linewidth(0.5)
        if reference is not None and np.isfinite(reference):
            lo, hi = im.norm.vmin, im.norm.vmax
            if lo is not None and hi is not None and lo <= reference <= hi:
                cbar.ax.axhline(reference, color="white", linewidth=1.4, zorder=3)
                cbar.ax.axhline(reference, color="black", linewidth=0.8, linestyle="--", zorder=4)

        if data.mask.any():
            fig.legend(
                handles=[
                    Patch(
                        facecolor=MISSING_COLOR,
                        edgecolor=MISSING_HATCH_COLOR,
                        hatch=MISSING_HATCH,
                        linewidth=0.0,
                        label="no data (NaN)",
                    )
                ],
                loc="outside lower right",
                handlelength=1.2,
            )
    return fig


def per_layer_line(
    df: pd.DataFrame,
    metric: str,
    *,
    label: str | None = None,
    ax: Axes | None = None,
    reference: float | None = None,
    reference_label: str | None = None,
    labels: MetricLabels | None = None,
    color: str | None = None,
) -> Figure:
    """Plot a metric's per-layer aggregate against layer.

    Uses rows with a layer and no head. If the metric also has per-(layer,
    head) rows, a light band spans the min-max across heads of each layer.
    Where the layer rows carry a standard error over windows (the ``se``
    column, SPEC.md "Averages"), a darker band spans value ± 1 se (gid
    ``"se"``, in the legend as "± 1 s.e. over windows"); layers whose se is
    NaN get none. Pass ``ax`` to overlay further runs on an existing plot.

    Args:
        df: Tidy results table (one run; filter first when the table mixes runs).
        metric: Metric to plot.
        label: Legend entry for the line (e.g. a model or run name). A legend
            is drawn whenever a label is given.
        ax: Axes to draw into; a new figure is created when None.
        reference: A horizontal reference line (e.g. the p0 mass of uniform
            attention, so a reader sees at once whether there is a sink);
            dashed grey, in the legend as ``reference_label``.
        reference_label: Legend entry of the reference line.
        labels: The page's metric labels (title, y axis); default the metric's name.
        color: The line's (and its bands') colour: the run's colour on the page
            (:func:`run_colours`); default the axes' next colour.

    Returns:
        The (root) figure holding the axes. The aggregate line is the first
        line drawn by this call, with x = layers and y = aggregate values.

    Raises:
        SinkscopeError: If the metric has no per-layer aggregate rows, or several
            rows for the same layer.
    """
    _check_columns(df)
    agg = _per_layer_rows(df, metric)
    if agg.empty:
        raise SinkscopeError(
            f"metric {metric!r} has no per-layer rows (layer set, head empty) to draw a line from."
        )
    agg = pd.DataFrame(
        {
            "layer": agg["layer"].astype("int64").to_numpy(),
            "value": agg["value"].astype("float64").to_numpy(),
            "se": agg["se"].astype("float64").to_numpy() if "se" in agg else np.full(len(agg), np.nan),
            **({"probe": agg["probe"].to_numpy()} if "probe" in agg else {}),
        }
    )
    _raise_on_duplicates(agg, ["layer"], metric)
    agg = agg.sort_values("layer")
    x = agg["layer"].to_numpy()
    y = agg["value"].to_numpy()
    se = agg["se"].to_numpy()
    has_se = bool(np.isfinite(se).any())

    heads = _per_head_rows(df, metric)
    band = None
    if not heads.empty:
        hv = pd.DataFrame(
            {
                "layer": heads["layer"].astype("int64").to_numpy(),
                "value": heads["value"].astype("float64").to_numpy(),
            }
        )
        band = hv.groupby("layer")["value"].agg(["min", "max"]).sort_index()

    with matplotlib.rc_context(_STYLE):
        if ax is None:
            fig = Figure(figsize=_LINE_FIGSIZE, layout="constrained")
            ax = fig.add_subplot()
            ax.set_title(metric_title(metric, labels))
        else:
            fig = _root_figure(ax)

        (line,) = ax.plot(
            x, y, marker="o", markersize=3, linewidth=1.4, label=label, zorder=3, color=color
        )
        if band is not None:
            ax.fill_between(
                band.index.to_numpy(),
                band["min"].to_numpy(),
                band["max"].to_numpy(),
                color=line.get_color(),
                alpha=0.18,
                linewidth=0.0,
                label=f"{label}: min–max over heads" if label else "min–max over heads",
                zorder=2,
            )
        if has_se:
            known = np.isfinite(se)
            ax.fill_between(
                x,
                np.where(known, y - se, np.nan),
                np.where(known, y + se, np.nan),
                color=line.get_color(),
                alpha=0.4,
                linewidth=0.0,
                label=f"{label}: ± 1 s.e. over windows" if label else "± 1 s.e. over windows",
                zorder=2.5,
                gid="se",
            )
        if reference is not None and np.isfinite(reference):
            ax.axhline(reference, color="0.35", linewidth=1.0, linestyle="--", label=reference_label, zorder=1,
                       gid="reference")
        ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", integer=True))
        ax.set_xlabel("layer")
        ax.set_ylabel(metric_axis_label(metric, labels))
        ax.grid(True, linewidth=0.4, alpha=0.4)
        if label is not None or band is not None or has_se or reference_label is not None:
            # Below the axes: the band would hide an inside legend, and
            # overlaid runs append entries (one column per run).
            handles, texts = ax.get_legend_handles_labels()
            n_entries = sum(1 for h in handles if h.get_gid() != "reference")  # one column per run
            per_run = 1 + (band is not None) + has_se
            # as many columns as fit the figure's width (~90 characters of legend text per row)
            fits = max(1, 90 // max(12, max((len(t) for t in texts), default=12) + 6))
            ncols = max(1, min(4, fits, n_entries // per_run))
            # a long legend below the axes gets its own room (else the axes collapse)
            legend_rows = -(-len(texts) // ncols)
            fig.set_size_inches(_LINE_FIGSIZE[0], max(_LINE_FIGSIZE[1], 2.6 + 0.19 * legend_rows))
            ax.legend(
                loc="upper center",
                bbox_to_anchor=(0.5, -0.16),
                ncols=ncols,
                borderaxespad=0.0,
            )
    return fig


def per_layer_bars(tables: Mapping[str, pd.DataFrame], metric: str, *, labels: MetricLabels | None = None,
                   colours: Mapping[str, str] | None = None) -> Figure:
    """Bars of a metric's per-layer rows, one bar per layer and run (grouped, one colour per run).

    Made for per-layer shares (the token-identity share of gate variance): the bar height is
    the layer row (``head`` empty); a legend names the runs when there are several.

    Args:
        tables: ``label -> tidy table`` of each run (one run: a single entry).
        metric: the metric to draw.
        labels: the page's metric labels (title, y axis); default the metric's name.
        colours: ``label -> colour`` of the page's runs (:func:`run_colours`); default matplotlib's cycle.

    Returns:
        The figure; bars of run k are ``fig.axes[0].containers[k]``, in layer order.

    Raises:
        SinkscopeError: If no run has per-layer rows of the metric.
    """
    series: dict[str, pd.Series] = {}
    for label, df in tables.items():
        _check_columns(df)
        rows = _per_layer_rows(df, metric)
        if not rows.empty:
            _raise_on_duplicates(rows, ["layer"], metric)
            series[label] = pd.Series(rows["value"].astype("float64").to_numpy(),
                                      index=rows["layer"].astype("int64").to_numpy()).sort_index()
    if not series:
        raise SinkscopeError(f"metric {metric!r} has no per-layer rows (layer set, head empty) to draw bars from.")
    layers = sorted(set().union(*[set(s.index) for s in series.values()]))
    width = 0.8 / len(series)
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=_LINE_FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title(metric_title(metric, labels))
        for k, (label, values) in enumerate(series.items()):
            x = np.array([layers.index(layer) for layer in values.index], dtype=float)
            ax.bar(x + (k - (len(series) - 1) / 2) * width, values.to_numpy(), width=width * 0.95,
                   label=label if len(series) > 1 else None, zorder=3, color=_colour_of(colours, label, k))
        ax.set_xticks(range(len(layers)), [str(layer) for layer in layers])
        ax.set_xlabel("layer")
        ax.set_ylabel(metric_axis_label(metric, labels, wrap=True))
        ax.grid(True, axis="y", linewidth=0.4, alpha=0.4)
        if len(series) > 1:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=min(4, len(series)), borderaxespad=0.0)
    return fig


def model_value_plot(points: pd.DataFrame, metric: str, *, x_label: str = "run",
                     labels: MetricLabels | None = None, colours: Mapping[str, str] | None = None) -> Figure:
    """Model-level values of one metric across runs (Wang 2026 Fig. 1d: selectivity by tier and variant).

    Args:
        points: one row per run with columns ``x`` (category on the x axis, in order of first
            appearance), ``series`` (one line per value; a single series draws points only),
            ``value`` (the model row) and ``lo``/``hi`` (the range of the layer rows, drawn as
            an error bar; NaN for none).
        metric: the metric (axis label, title).
        x_label: the x axis's name (``tier``, ``run``, ...).
        labels: the page's metric labels (title, y axis); default the metric's name.
        colours: ``name -> colour``: of each series (several), or of each x category (a single
            series: the runs of a comparison, each point in its run's colour from :func:`run_colours`).

    Returns:
        The figure; series k is ``fig.axes[0].lines[k]`` (x positions 0, 1, ...).
    """
    xs = list(dict.fromkeys(points["x"].astype(str)))
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=_LINE_FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title(metric_title(metric, labels))
        groups = list(dict.fromkeys(points["series"].astype(str)))
        bars = []
        for k, name in enumerate(groups):
            rows = points[points["series"].astype(str) == name]
            x = np.array([xs.index(v) for v in rows["x"].astype(str)], dtype=float)
            order = np.argsort(x)
            y = rows["value"].to_numpy(dtype=float)[order]
            (line,) = ax.plot(x[order], y, marker="o", markersize=4, linewidth=1.4 if len(groups) > 1 else 0.0,
                              label=name if len(groups) > 1 else None, zorder=3, color=_colour_of(colours, name, k))
            # a single series is the runs themselves on the x axis: each point (and its bar) in its run's colour
            names = rows["x"].astype(str).to_numpy()[order]
            point_colours = ([_colour_of(colours, n, i) for i, n in enumerate(names)] if len(groups) == 1 and colours
                             else [line.get_color()] * len(names))
            if len(groups) == 1 and colours:
                line.set_visible(False)
                ax.scatter(x[order], y, s=24, c=point_colours, zorder=3)
            lo, hi = rows["lo"].to_numpy(dtype=float)[order], rows["hi"].to_numpy(dtype=float)[order]
            bars += [(x[order][i], y[i], lo[i], hi[i], point_colours[i])
                     for i in np.flatnonzero(np.isfinite(lo) & np.isfinite(hi))]
        for at, value, lo, hi, colour in bars:  # after every series' line: series k stays ax.lines[k]
            ax.errorbar([at], [value], yerr=[[value - lo], [hi - value]], fmt="none", ecolor=colour, elinewidth=0.8,
                        capsize=2.5, zorder=2)
        ax.set_xticks(range(len(xs)), xs, rotation=20 if max(map(len, xs)) > 10 else 0, ha="right"
                      if max(map(len, xs)) > 10 else "center")
        ax.set_xlim(-0.5, len(xs) - 0.5)
        ax.set_xlabel(x_label)
        ax.set_ylabel(metric_axis_label(metric, labels, wrap=True))
        ax.grid(True, axis="y", linewidth=0.4, alpha=0.4)
        if len(groups) > 1:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=min(4, len(groups)), borderaxespad=0.0)
    return fig


def per_layer_categories(tables: Mapping[str, pd.DataFrame], metric: str, *, labels: MetricLabels | None = None,
                         colours: Mapping[str, str] | None = None) -> Figure:
    """A per-layer index (a channel, a token position) as categories: one marker per layer and run.

    The y axis is categorical: one row per value that occurs, in increasing order, labelled with the
    value itself (channel 1234 and channel 1235 are neighbours only as rows, not as numbers); x is
    the layer. Nothing joins the markers: a line through channel indices would draw a trend that
    does not exist. Runs sit side by side within a layer, each in its colour and marker.

    Args:
        tables: ``label -> tidy table`` of each run (one run: a single entry).
        metric: the metric to draw (its per-layer rows: ``layer`` set, ``head`` empty).
        labels: the page's metric labels (title, y axis); default the metric's name.
        colours: ``label -> colour`` of the page's runs (:func:`run_colours`); default matplotlib's cycle.

    Returns:
        The figure; run k's markers are ``fig.axes[0].collections[k]`` (offsets: layer, category row),
        the y tick labels the values.

    Raises:
        SinkscopeError: If no run has per-layer rows of the metric.
    """
    series: dict[str, pd.Series] = {}
    for label, df in tables.items():
        _check_columns(df)
        rows = _per_layer_rows(df, metric)
        rows = rows[rows["value"].notna()]
        if not rows.empty:
            _raise_on_duplicates(rows, ["layer"], metric)
            series[label] = pd.Series(rows["value"].astype("float64").to_numpy(),
                                      index=rows["layer"].astype("int64").to_numpy()).sort_index()
    if not series:
        raise SinkscopeError(f"metric {metric!r} has no per-layer rows (layer set, head empty) to draw.")
    categories = sorted(set().union(*[set(s.to_numpy()) for s in series.values()]))
    row_of = {value: k for k, value in enumerate(categories)}
    height = float(np.clip(1.6 + 0.2 * len(categories), _LINE_FIGSIZE[1], _HEATMAP_H_RANGE[1]))
    width = 0.6 / len(series)
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(_LINE_FIGSIZE[0], height), layout="constrained")
        ax = fig.add_subplot()
        ax.set_title(metric_title(metric, labels))
        for k, (label, values) in enumerate(series.items()):
            x = values.index.to_numpy(dtype=float) + (k - (len(series) - 1) / 2) * width
            ax.scatter(x, [row_of[v] for v in values.to_numpy()], s=22, marker=_RUN_MARKERS[k % len(_RUN_MARKERS)],
                       color=_colour_of(colours, label, k), label=label if len(series) > 1 else None, zorder=3)
        shown = max(1, -(-len(categories) // 30))  # at most 30 tick labels
        ax.set_yticks(range(len(categories)))
        ax.set_yticklabels([_category_text(v) if k % shown == 0 else "" for k, v in enumerate(categories)])
        ax.set_ylim(-0.6, len(categories) - 0.4)
        ax.xaxis.set_major_locator(MaxNLocator(nbins="auto", integer=True))
        ax.set_xlabel("layer")
        unit = _names(labels).get(metric, ("", ""))[1]
        ax.set_ylabel(unit or metric_axis_label(metric, labels, wrap=True))  # the title names the metric
        ax.grid(True, axis="y", linewidth=0.4, alpha=0.4)
        if len(series) > 1:
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=min(4, len(series)), borderaxespad=0.0)
    return fig


def _category_text(value: float) -> str:
    """An index as its tick label: ``1234`` (a whole number without ``.0``)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _root_figure(ax: Axes) -> Figure:
    try:
        return ax.get_figure(root=True)
    except TypeError:  # matplotlib < 3.10: ax.figure is already the root figure
        fig = ax.figure
        return getattr(fig, "figure", fig)


def _atomic_savefig(fig: Figure, path: Path, fmt: str, **kwargs: object) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, **kwargs)
    atomic_write_bytes(path, buffer.getvalue())


def save_figure(fig: Figure, stem: Path) -> list[Path]:
    """Write a figure as ``<stem>.png`` (150 dpi) and ``<stem>.svg``, atomically.

    Each file is rendered in memory and written with
    :func:`sinkscope.store.files.atomic_write_bytes` (temporary file in the
    destination directory, then :func:`os.replace`), so readers never see a
    half-written figure. The SVG carries no date and uses a fixed hash
    salt, so re-rendering the same figure gives byte-identical output (for a
    given matplotlib version). The layout is computed once, for the PNG, and kept
    for the SVG: after this call the figure's layout engine is "none".

    Args:
        fig: Figure to write.
        stem: Output path without suffix; its parent is created if needed.
            Any suffix already on ``stem`` is kept (``a.b`` -> ``a.b.png``).

    Returns:
        ``[png_path, svg_path]``.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    png = stem.with_name(stem.name + ".png")
    svg = stem.with_name(stem.name + ".svg")
    with matplotlib.rc_context({"svg.hashsalt": SVG_HASHSALT}):
        _atomic_savefig(fig, png, "png", dpi=PNG_DPI, metadata={"Software": None})
        # The layout the PNG computed serves the SVG too: a constrained layout costs as much as
        # the drawing, and the axes' positions (fractions of the figure) do not depend on the dpi.
        fig.set_layout_engine("none")
        _atomic_savefig(fig, svg, "svg", metadata={"Date": None})
    return [png, svg]


def _file_stem(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("._") or "metric"


def write_run_figures(df: pd.DataFrame, out_dir: Path, labels: MetricLabels | None = None) -> list[Path]:
    """Write the standard figure set for one run.

    For every metric with per-(layer, head) rows, writes a heatmap
    ``out_dir/figures/heatmap_<metric>.{png,svg}``; for every metric with
    per-layer aggregate rows, a line plot ``out_dir/figures/layers_<metric>.{png,svg}``
    (with the min-max band over heads where per-head rows exist; an index metric of
    ``labels.categorical``: markers on a categorical axis instead). Model
    aggregates (layer NA) are not plotted.

    Args:
        df: Tidy results table of a single run.
        out_dir: Run output directory; ``figures/`` is created inside it.
        labels: Metric labels for titles and axes; default the metrics' names.

    Returns:
        Paths of all written files, heatmaps first, metrics in sorted order.

    Raises:
        SinkscopeError: If required columns are missing or a metric has duplicate
            rows for the same (layer, head).
    """
    _check_columns(df)
    fig_dir = Path(out_dir) / "figures"
    layer_set = df["layer"].notna()
    head_set = df["head"].notna()
    metric = df["metric"].astype(str)
    heat_metrics = sorted(metric[layer_set & head_set].unique())
    line_metrics = sorted(metric[layer_set & ~head_set].unique())

    written: list[Path] = []
    for m in heat_metrics:
        written += save_figure(layer_head_heatmap(df, m, labels=labels), fig_dir / f"heatmap_{_file_stem(m)}")
    for m in line_metrics:
        if labels is not None and m in labels.categorical:
            fig = per_layer_categories({"": df}, m, labels=labels)
        else:
            fig = per_layer_line(df, m, labels=labels)
        written += save_figure(fig, fig_dir / f"layers_{_file_stem(m)}")
    return written
