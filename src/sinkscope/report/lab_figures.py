"""The lab's figures (``sinkscope sweep`` and ``sinkscope toy``), drawn here like every figure.

Each function takes the lab's tables and returns a ``matplotlib.figure.Figure`` (no pyplot state;
the caller saves it), or None when the table has nothing to draw:

- :func:`paired_improvement_bars`: Wang 2026's Table 1, paired improvements with standard errors;
- :func:`improvement_by_step`: the same against the training step, a band of one standard error;
- :func:`sink_columns_by_variant`: Table 15's sink columns per variant, seed means with errors;
- :func:`formation_by_variant`: the monitor's curves, one line per variant (``formation_<metric>.png``);
- :func:`toy_error_by_load`: the toy task's error and headroom closed against the load N / d.
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sinkscope.report.figures import _STYLE


def paired_improvement_bars(t1: pd.DataFrame) -> Figure | None:
    """Table 1 as bars with standard-error whiskers (positive = better)."""
    if not len(t1):
        return None
    labels = [f"{r.variant}\nvs {r.reference}" for r in t1.itertuples()]
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(max(4.0, 1.1 * len(labels)), 3.2))
        ax = fig.subplots()
        ax.bar(range(len(labels)), t1["improvement"], yerr=t1["se"].fillna(0.0), capsize=3,
               color=["#4c72b0" if b == "over baseline" else "#dd8452" for b in t1["block"]])
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylabel("paired improvement (nats)")
        ax.set_title("paired validation-loss improvement,\nmean ± se over seeds", fontsize=9)  # two lines: never clipped
        fig.tight_layout()
    return fig


def improvement_by_step(over_base: pd.DataFrame) -> Figure | None:
    """Paired improvement over the baseline against the training step, one line per variant with a band
    of one standard error (positive = better); None with fewer than two steps."""
    if over_base["step"].nunique() < 2:
        return None
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(5.0, 3.2))
        ax = fig.subplots()
        colours = variant_colours(over_base["variant"])
        for variant, group in over_base.groupby("variant", sort=False):
            group = group.sort_values("step")
            line, = ax.plot(group["step"], group["improvement"], marker="o", markersize=3, linewidth=1.2,
                            label=variant, color=colours[variant])
            se = group["se"].fillna(0.0)
            ax.fill_between(group["step"], group["improvement"] - se, group["improvement"] + se,
                            color=line.get_color(), alpha=0.15, linewidth=0)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xlabel("training step")
        ax.set_ylabel("improvement over baseline (nats)")
        ax.set_title("paired improvement during training, mean ± se", fontsize=9)
        ax.legend(fontsize=7, frameon=False)
        fig.tight_layout()
    return fig


def sink_columns_by_variant(sinks: pd.DataFrame) -> Figure | None:
    """Table 15's columns per variant: bars of the seed means with standard-error whiskers."""
    from sinkscope.stats.paired import mean_se

    panels = [(c, label) for c, label in (("p0_pct", "position-0 mass (%)"), ("phantom_pct", "phantom mass (%)"),
                                          ("value_norm_ratio", "position-0 value-norm ratio"),
                                          ("gate_selectivity", "gate selectivity"))
              if c in sinks and sinks[c].notna().any()]
    if not panels:
        return None
    variants = list(dict.fromkeys(sinks["variant"]))
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(3.2 * len(panels), 3.0))
        axes = fig.subplots(1, len(panels), squeeze=False)
        for ax, (column, label) in zip(axes[0], panels):
            stats = [mean_se(sinks.loc[sinks.variant == v, column].dropna()) for v in variants]
            ax.bar(range(len(variants)), [m for m, _ in stats],
                   yerr=[0.0 if math.isnan(e) else e for _, e in stats], capsize=3, color="#4c72b0")
            ax.set_xticks(range(len(variants)), variants, rotation=45, ha="right", fontsize=7)
            ax.set_title(label, fontsize=9)
        fig.tight_layout()
    return fig


def formation_by_variant(formation: pd.DataFrame) -> dict[str, Figure]:
    """Per metric: the monitor's model value against the step, one line per variant (mean over seeds at the
    steps every seed measured); a metric that is 0 for a variant (phantom mass without a phantom key) is
    not drawn for it."""
    import warnings

    from sinkscope.report.curves import metric_vs_step

    drawn = {}
    for metric, rows in formation.groupby("metric", sort=False):
        lines = {}
        for variant, part in rows.groupby("variant", sort=False):
            seeds = part["seed"].nunique()
            mean = part.groupby("step").agg(value=("value", "mean"), k=("seed", "nunique")).reset_index()
            mean = mean[mean["k"] == seeds][["step", "value"]]
            if (mean["value"].fillna(0) != 0).any():
                lines[variant] = mean
        if lines:
            what = "mean over seeds" if formation["seed"].nunique() > 1 else "model value"
            with warnings.catch_warnings():  # matplotlib's layout notes on very small models
                warnings.simplefilter("ignore", UserWarning)
                drawn[str(metric)] = metric_vs_step(lines, metric,
                                                    title=f"{metric} through training, one line per variant ({what})")
    return drawn


def variant_colours(variants) -> dict[str, str]:
    """One colour per variant, the same in every panel of a figure (matplotlib's default cycle, in order)."""
    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    return {variant: cycle[k % len(cycle)] for k, variant in enumerate(dict.fromkeys(variants))}


def toy_error_by_load(summary: pd.DataFrame, condition_labels: dict[str, str]) -> Figure:
    """The toy task: held-out error (top) and the share of headroom closed (bottom) against the load N / d,
    one column per condition, one line per variant in one colour across every panel (error bars:
    standard errors over seeds); every panel has its legend."""
    conditions = list(dict.fromkeys(summary["condition"]))
    colours = variant_colours(summary["variant"])
    with matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(4.2 * len(conditions), 6.0))
        axes = fig.subplots(2, len(conditions), squeeze=False)
        for col, condition in enumerate(conditions):
            part = summary[summary.condition == condition]
            for variant, group in part.groupby("variant", sort=False):
                x = np.log2(group["load"].to_numpy(dtype=float))  # loads 1, 2, 4, 8 evenly spaced
                axes[0, col].errorbar(x, group["error"], yerr=group["se"].fillna(0.0), marker="o", capsize=3,
                                      label=variant, color=colours[variant])
                if variant not in ("baseline", "oracle"):
                    axes[1, col].plot(x, 100 * group["headroom_closed"], marker="o", label=variant,
                                      color=colours[variant])
            axes[0, col].set_title(condition_labels.get(condition, condition), fontsize=9)
            axes[0, col].set_ylabel("held-out BCE per label (nats)")
            axes[1, col].set_ylabel("headroom closed (%)")
            axes[1, col].axhline(0.0, color="black", linewidth=0.8)
            loads = sorted(set(part["load"]))
            for ax in axes[:, col]:
                ax.set_xticks(np.log2(np.array(loads, dtype=float)), [str(load) for load in loads])
                ax.set_xlabel("load N / d")
            axes[0, col].legend(fontsize=7)
            if axes[1, col].get_lines():
                axes[1, col].legend(fontsize=7)
        fig.tight_layout()
    return fig
