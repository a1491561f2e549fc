"""The stream section's quantised-cache part (SPEC.md "Quantised KV caches"; ``stream --kv-bits``).

A run that quantises its cache has, beside each policy condition's 16-bit rows, rows per bits,
scheme, group and protection (columns ``kv_bits``, ``kv_group``, ``kv_scheme``, ``protect_sinks``,
``protect``). This module names those settings and draws perplexity against bits: one panel per
policy condition (policy, cache, sink tokens, positions), one line per scheme, group and
protection, every line starting from the condition's 16-bit perplexity; below it the position-0
share read through the same caches (``stream_p0_mass``): does the sink survive the quantisation?
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

from sinkscope.report import figures

KV_COLUMNS = ("kv_bits", "kv_group", "kv_scheme", "kv_residual", "protect_sinks", "protect", "kv_backend")


def quantises(rows: pd.DataFrame) -> bool:
    """Does this run read through a quantised cache (any ``kv_bits`` other than 16)?"""
    return "kv_bits" in rows.columns and bool((rows["kv_bits"].fillna(16) != 16).any())


def unquantised(rows: pd.DataFrame) -> pd.DataFrame:
    """The 16-bit rows (all rows of a run that does not quantise)."""
    return rows[rows["kv_bits"].fillna(16) == 16] if "kv_bits" in rows.columns else rows


def protection(row) -> str:
    """``none``, ``first 4 exact``, ``top-p0:4 exact``, ``random:4 exact``."""
    rule = row.get("protect")
    if isinstance(rule, str) and rule:
        return f"{rule} exact"
    first = row.get("protect_sinks")
    return f"first {int(first)} exact" if first is not None and not pd.isna(first) and int(first) else "none"


def setting(row) -> str:
    """The quantisation of one row: ``""`` at 16 bits, else ``4-bit kivi g64, first 4 exact``."""
    bits = row.get("kv_bits")
    if bits is None or pd.isna(bits) or int(bits) == 16:
        return ""
    guard = protection(row)
    backend = ", transformers QuantizedCache" if row.get("kv_backend") == "transformers" else ""
    return f"{int(bits)}-bit {row['kv_scheme']} g{int(row['kv_group'])}{_residual(row)}" + (
        "" if guard == "none" else f", {guard}") + backend


def _residual(row) -> str:
    """`` r128`` when kivi's residual length (``kv_residual``) is not the group size; else ``""``."""
    residual = row.get("kv_residual")
    if residual is None or pd.isna(residual) or int(residual) == int(row["kv_group"]):
        return ""
    return f" r{int(residual)}"


def share_text(share: float) -> str:
    """A condition's ``stream_quantised_share`` in the table: ``62% of the cache quantised``, or ``quantises nothing``."""
    if share == 0:
        return "quantises nothing (rows = 16-bit)"
    return f"{100 * share:.0f}% of the cache quantised" if share >= 0.01 else f"{100 * share:.2g}% of the cache quantised"


def key(row) -> tuple:
    """The quantisation part of a condition's identity (16-bit rows: ``(16,)``)."""
    bits = row.get("kv_bits")
    if bits is None or pd.isna(bits) or int(bits) == 16:
        return (16,)
    return tuple(row.get(c) if not (isinstance(row.get(c), float) and math.isnan(row.get(c))) else None
                 for c in KV_COLUMNS)


def ppl_by_bits(overall: pd.DataFrame, title: str, condition_label, p0: pd.DataFrame | None = None) -> Figure:
    """Perplexity against bits (16, 8, 4, 3, 2 left to right): a panel per policy condition, a line per
    scheme, group and protection, each from the condition's 16-bit perplexity (drawn as a dashed line);
    with ``p0`` (the ``stream_p0_mass`` rows), a second row of panels: p0 mass through the cache, the same lines.

    overall: one run's ``stream_ppl`` rows without a position bucket; ``condition_label(row)`` names a panel.
    """
    overall = overall.copy()
    overall["panel"] = [condition_label(r) for _, r in overall.iterrows()]
    panels = [p for p in dict.fromkeys(overall["panel"]) if (overall[overall["panel"] == p]["kv_bits"].fillna(16) != 16).any()]
    bits = sorted({int(b) for b in overall["kv_bits"].fillna(16)}, reverse=True)
    x = {b: i for i, b in enumerate(bits)}
    if p0 is not None and len(p0):
        p0 = p0.copy()
        p0["panel"] = [condition_label(r) for _, r in p0.iterrows()]
    else:
        p0 = None
    with matplotlib.rc_context(figures._STYLE):
        n = max(1, len(panels))
        fig = Figure(figsize=(min(4.2 * n, 13.0), 3.6 if p0 is None else 6.4), layout="constrained")
        grid = fig.subplots(1 if p0 is None else 2, n, sharey="row", squeeze=False)
        fig.suptitle(title)
        colours = _line_colours(overall)
        _draw(grid[0], panels, overall, x, bits, "perplexity", log=True, colours=colours)
        if p0 is not None:
            _draw(grid[1], panels, p0, x, bits, "p0 mass through the cache", log=False, colours=colours)
        for ax in grid[0] if p0 is None else grid[1]:
            ax.set_xlabel("bits per cached key and value")
        for ax in grid[0]:  # every panel: each reads on its own
            if ax.get_legend_handles_labels()[0]:
                ax.legend(loc="best", fontsize=7)
    return fig


def _lines(quantised: pd.DataFrame) -> list[tuple]:
    """The (scheme, group, protection) lines of quantised rows, in order of appearance."""
    return list(dict.fromkeys((r["kv_scheme"], int(r["kv_group"]), protection(r)) for _, r in quantised.iterrows()))


def _line_colours(rows: pd.DataFrame) -> dict[tuple, str]:
    """One colour per scheme, group and protection over every panel, whichever a panel lacks."""
    return {line: f"C{i % 10}" for i, line in enumerate(_lines(rows[rows["kv_bits"].fillna(16) != 16]))}


def _draw(axes, panels: list[str], rows: pd.DataFrame, x: dict, bits: list[int], what: str, log: bool,
          colours: dict[tuple, str] | None = None) -> None:
    """One row of :func:`ppl_by_bits`' panels: ``rows`` (one metric, a ``panel`` column) against bits."""
    for ax, panel in zip(axes, panels):
        mine = rows[rows["panel"] == panel]
        base = mine[mine["kv_bits"].fillna(16) == 16]
        reference = float(base["value"].iloc[0]) if len(base) else None
        if reference is not None:
            ax.axhline(reference, color="black", linestyle="--", linewidth=1.0, label="16-bit")
        quantised = mine[mine["kv_bits"].fillna(16) != 16]
        for i, (scheme, group, guard) in enumerate(_lines(quantised)):
            same = np.array([protection(r) == guard for _, r in quantised.iterrows()], dtype=bool)
            line = quantised[(quantised["kv_scheme"] == scheme).to_numpy() & (quantised["kv_group"] == group).to_numpy()
                             & same]
            line = line.sort_values("kv_bits", ascending=False)
            xs = [x[int(b)] for b in line["kv_bits"]]
            ys = list(line["value"])
            if reference is not None:
                xs, ys = [x[16], *xs], [reference, *ys]
            colour = (colours or {}).get((scheme, group, guard), f"C{i % 10}")
            ax.plot(xs, ys, marker="o", markersize=3.5, linewidth=1.4, color=colour, label=f"{scheme} g{group}, {guard}")
        ax.set_xticks(range(len(bits)), [str(b) for b in bits])
        ax.set_title(panel, fontsize=8)
        if log:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.grid(True, which="both", linewidth=0.4, alpha=0.4)
    axes[0].set_ylabel(what)
