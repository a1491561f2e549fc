"""The report's section for ``sinkscope stream`` (SPEC.md "Streaming"): perplexity through a bounded cache.

Figures, per run and position convention:

- log-perplexity (the mean NLL in nats) against position, one panel per cache size and one line
  per policy, the dense reading (``full``) dashed in every panel: StreamingLLM's Figure 3;
- perplexity against cache size, one line per policy, ``full`` as a horizontal line;
- with a quantised cache (``--kv-bits``), perplexity against bits, one line per protection
  (``stream_quant``); the two figures above then draw the 16-bit readings.

The table gives every condition's perplexity over the whole text (± its standard error over
documents where there are several), one column per run, and each run's ``p0_mass`` on the same
documents (their first max(cache) tokens, read densely) beside it.
"""

from __future__ import annotations

import matplotlib
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

from sinkscope.report import figures, stream_quant
from sinkscope.report.page import Page
from sinkscope.report.runs import RunData
from sinkscope.stats.paired import fmt_pm

NOTE = ("Each document is read once per condition through a key-value cache cut back to its budget after every chunk "
        "(SPEC.md \"Streaming\"). full is the dense reading; window keeps only the most recent keys; sinks keeps the "
        "first tokens too (StreamingLLM); h2o keeps heavy hitters by accumulated attention plus recent keys. With "
        "cache positions a query's position is the cache's length and cached keys are re-rotated to their slots; "
        "with original positions every token keeps its place in the document. A window-only perplexity far above "
        "full, brought back by a few sink tokens, is StreamingLLM's finding; p0 mass beside it says how much of each "
        "row the model parks on the first token.")
POLICY_ORDER = {"full": 0, "window": 1, "sinks": 2, "h2o": 3}


STREAM = "stream"


# ---- the section protocol (page.py) ------------------------------------------------------------------


def handles(probe: str, metric: str, runs: list[RunData]) -> bool:
    """Every metric of the stream probe: one entry for all of them (under ``stream_ppl``)."""
    return probe == STREAM


def entry(page: Page, metric: str) -> dict | None:
    """``stream_ppl``: the figures per run and convention, one table of every condition; the others: None."""
    return _entry(page) if metric == "stream_ppl" else None


def note(probe: str, metrics: list[str]) -> str | None:
    return NOTE if probe == STREAM else None


def tables(page: Page, probe: str) -> list[dict]:
    return []


# ---- rows and figures --------------------------------------------------------------------------------


def points(table: pd.DataFrame, metric: str = "stream_nll") -> pd.DataFrame:
    """A run's stream rows of ``metric``: policy, cache, sink_tokens, positions, position_bucket, value, se, n, label."""
    rows = table[(table["probe"] == STREAM) & (table["metric"] == metric)].copy()
    if rows.empty:
        return rows
    rows["sink_tokens"] = rows["sink_tokens"].fillna(0).astype(int)
    rows["label"] = [_label(p, c, n) for p, c, n in zip(rows["policy"], rows["cache"], rows["sink_tokens"])]
    return rows


def _label(policy: str, cache, sink_tokens: int) -> str:
    if policy == "full":
        return "full"
    if policy == "sinks":
        return f"sinks {sink_tokens}+{int(cache) - sink_tokens}"
    return policy


def _line_label(policy: str, sink_tokens: int) -> str:
    return f"sinks ({sink_tokens} tokens)" if policy == "sinks" else policy


def _kinds(rows: pd.DataFrame) -> list[tuple[str, int]]:
    kinds = {(p, int(n)) for p, n in zip(rows["policy"], rows["sink_tokens"]) if p != "full"}
    return sorted(kinds, key=lambda k: (POLICY_ORDER.get(k[0], 9), k[1]))


def _kind_colours(rows: pd.DataFrame) -> dict[tuple[str, int], str]:
    """One colour per policy (and sink-token count) over every panel of a figure, whichever a panel lacks."""
    return {kind: f"C{i % 10}" for i, kind in enumerate(_kinds(rows))}


def log_ppl_by_position(rows: pd.DataFrame, title: str) -> Figure:
    """Mean NLL (log perplexity) per position bucket: one panel per cache size, one line per policy.

    rows: one run's ``stream_nll`` rows of one position convention with a ``position_bucket``, and
    the ``full`` rows (drawn dashed in every panel). x is the middle of each bucket.
    """
    buckets = rows[rows["position_bucket"].notna()]
    caches = sorted({int(c) for c in buckets["cache"].dropna()})
    width = float(buckets["position_bucket"].drop_duplicates().sort_values().diff().min() or 1.0) \
        if buckets["position_bucket"].nunique() > 1 else 1.0
    full = buckets[buckets["policy"] == "full"].sort_values("position_bucket")
    colours = _kind_colours(buckets)
    with matplotlib.rc_context(figures._STYLE):
        n = max(1, len(caches))
        fig = Figure(figsize=(min(4.2 * n, 13.0), 3.6), layout="constrained")
        axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
        fig.suptitle(title)
        for ax, cache in zip(axes, caches or [None]):
            if not full.empty:
                ax.plot(full["position_bucket"] + width / 2, full["value"], color="black", linestyle="--",
                        linewidth=1.2, label="full (dense)")
            mine = buckets[buckets["cache"] == cache]
            for policy, sinks in _kinds(mine):
                line = mine[(mine["policy"] == policy) & (mine["sink_tokens"] == sinks)].sort_values("position_bucket")
                ax.plot(line["position_bucket"] + width / 2, line["value"], marker="o", markersize=2.5,
                        linewidth=1.3, color=colours[(policy, sinks)], label=_line_label(policy, sinks))
            if cache is not None:
                ax.axvline(cache, color="grey", linewidth=0.8, linestyle=":")
                ax.set_title(f"cache {cache}")
            ax.set_xlabel("position (tokens)")
            ax.grid(True, linewidth=0.4, alpha=0.4)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(loc="best", fontsize=7)  # every panel: each reads on its own
        axes[0].set_ylabel("log perplexity (mean NLL, nats)")
    return fig


def ppl_by_cache(rows: pd.DataFrame, title: str) -> Figure:
    """Perplexity over the whole text against cache size: one line per policy, full as a horizontal line."""
    overall = rows[rows["position_bucket"].isna()]
    with matplotlib.rc_context(figures._STYLE):
        fig = Figure(figsize=figures._LINE_FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        ax.set_title(title)
        full = overall[overall["policy"] == "full"]
        if not full.empty:
            ax.axhline(float(full["value"].iloc[0]), color="black", linestyle="--", linewidth=1.2, label="full (dense)")
        colours = _kind_colours(overall)
        for policy, sinks in _kinds(overall):
            line = overall[(overall["policy"] == policy) & (overall["sink_tokens"] == sinks)].sort_values("cache")
            style = dict(marker="o", markersize=3.5, linewidth=1.4, color=colours[(policy, sinks)],
                         label=_line_label(policy, sinks))
            if line["se"].notna().any():
                ax.errorbar(line["cache"], line["value"], yerr=line["se"].fillna(0.0).to_numpy(), capsize=2.5, **style)
            else:
                ax.plot(line["cache"], line["value"], **style)
        caches = sorted({int(c) for c in overall["cache"].dropna()})
        if len(caches) > 1:
            ax.set_xscale("log", base=2)
        ax.set_xticks(caches, [str(c) for c in caches])
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.set_xlabel("cache (past keys kept)")
        ax.set_ylabel("perplexity")
        ax.grid(True, which="both", linewidth=0.4, alpha=0.4)
        ax.legend(loc="best")
    return fig


def _pm(value: float, se: float) -> str:
    """``31.6 ± 1.2``: rounded where the se's second significant digit ends; the value alone without an se."""
    return fmt_pm(value, se, missing="—")


def _model_row(table: pd.DataFrame, metric: str) -> float | None:
    """The model value of ``metric`` (empty layer and head, no layer-type split), or None."""
    rows = table[(table["metric"] == metric) & table["layer"].isna() & table["head"].isna()]
    if "layer_type" in rows.columns:
        rows = rows[rows["layer_type"].isna()]
    return float(rows["value"].iloc[0]) if len(rows) else None


def _entry(page: Page) -> dict:
    """The stream entry: figures per run and convention, one table of every condition; the summary row."""
    runs, info = page.runs, page.info("stream_ppl")
    figs = []
    per_run = {}
    for k, run in enumerate(runs):
        nll, ppl = points(run.table, "stream_nll"), points(run.table, "stream_ppl")
        per_run[run.label] = ppl
        if nll.empty:
            continue
        suffix = f"_{k}" if len(runs) > 1 else ""
        name = f"{run.label}: " if len(runs) > 1 else ""
        if stream_quant.quantises(ppl):
            overall = ppl[ppl["position_bucket"].isna()]
            p0 = points(run.table, "stream_p0_mass")
            fig = stream_quant.ppl_by_bits(overall, f"{name}perplexity against bits of the cache", _condition,
                                           p0 if len(p0) else None)
            figs.append(page.keep(fig, f"stream_ppl_bits{suffix}", f"{name}perplexity against bits, one line per protection"))
            nll, ppl = stream_quant.unquantised(nll), stream_quant.unquantised(ppl)
        for where in dict.fromkeys(nll.loc[nll["policy"] != "full", "positions"]):
            mine = nll[(nll["positions"] == where) | (nll["policy"] == "full")]
            for stem, draw, what in (("stream_log_ppl_position", log_ppl_by_position, "log perplexity against position"),
                                     ("stream_ppl_cache", ppl_by_cache, "perplexity against cache size")):
                source = mine if draw is log_ppl_by_position else ppl[(ppl["positions"] == where) | (ppl["policy"] == "full")]
                fig = draw(source, f"{name}{what} ({where} positions)")
                figs.append(page.keep(fig, f"{stem}_{where}{suffix}", f"{name}{what}, {where} positions"))
    conditions = []
    for ppl in per_run.values():
        overall = ppl[ppl["position_bucket"].isna()]
        for _, row in overall.iterrows():
            p, c, n, w = row["policy"], row["cache"], row["sink_tokens"], row["positions"]
            key = (p, None if pd.isna(c) else int(c), int(n), w if p != "full" else "", stream_quant.key(row))
            if key not in conditions:
                conditions.append(key)
    quantised = any(stream_quant.quantises(ppl) for ppl in per_run.values())
    columns = ["condition", "cache", "positions"] + (["cache quantisation"] if quantised else []) + [r.label for r in runs]
    shares = {run.label: points(run.table, "stream_quantised_share") for run in runs} if quantised else {}

    def of_condition(rows: pd.DataFrame, p, c, n, w, kv) -> pd.DataFrame:
        rows = rows[rows["position_bucket"].isna() & (rows["policy"] == p) & (rows["sink_tokens"] == n)]
        if p != "full":
            rows = rows[(rows["cache"] == c) & (rows["positions"] == w)]
        return rows[[stream_quant.key(r) == kv for _, r in rows.iterrows()]] if len(rows) else rows

    rows = []
    for p, c, n, w, kv in conditions:
        cells, named = [], ""
        for run in runs:
            overall = of_condition(per_run[run.label], p, c, n, w, kv)
            if len(overall) and not named:
                named = stream_quant.setting(overall.iloc[0]) or "16-bit"
                share = of_condition(shares[run.label], p, c, n, w, kv) if kv != (16,) and len(shares[run.label]) else []
                if len(share):
                    named += f"; {stream_quant.share_text(float(share['value'].iloc[0]))}"
            cells.append(_pm(float(overall["value"].iloc[0]), float(overall["se"].iloc[0])) if len(overall) else "—")
        rows.append([_label(p, c, n) if p != "sinks" else f"sinks ({n} tokens)", "" if c is None else str(c), w,
                     *([named] if quantised else []), *cells])
    for metric, what in (("p0_mass", "p0 mass"), ("phantom_mass", "phantom mass")):
        values = [_model_row(run.table, metric) for run in runs]
        if any(v is not None for v in values):
            rows.append([f"{what} (first max(cache) tokens, dense)", "", "", *([""] if quantised else []),
                         *[figures_fmt(v) for v in values]])
    page.add_summary("stream_ppl", "perplexity, full (dense) reading", info.direction,
                     [figures_fmt(_full_ppl(per_run[r.label])) for r in runs])
    return {"metric": "stream_ppl", "info": info, "note": None, "figures": figs,
            "table": {"columns": columns, "rows": rows, "collapsed": False,
                      "caption": "Perplexity over every predicted token of every document (± standard error over "
                                 "documents where there are several)"}}


def _condition(row) -> str:
    """A policy condition's name in a figure's panel: ``full``, ``sinks 4+252, cache positions``."""
    if row["policy"] == "full":
        return "full"
    return f"{_label(row['policy'], row['cache'], int(row['sink_tokens']))} (cache {int(row['cache'])}), {row['positions']} positions"


def _full_ppl(ppl: pd.DataFrame):
    rows = stream_quant.unquantised(ppl)
    rows = rows[(rows["policy"] == "full") & rows["position_bucket"].isna()]
    return float(rows["value"].iloc[0]) if len(rows) else None


def figures_fmt(value) -> str:
    return "—" if value is None else f"{value:.4g}"
