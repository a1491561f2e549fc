"""Paired-seed comparisons of trained variants (SPEC.md "Trainer variants", last paragraphs).

Variants trained with one seed share their initialisation and batch order, so a comparison is
made per seed and then averaged:

    improvement of A over B = mean over seeds s of (loss_B(s) - loss_A(s))     positive = A is better
    standard error          = sd over seeds (n - 1 in the denominator) / sqrt(n)

Only seeds where both variants have a loss count (``n`` says how many); one seed gives a mean
and no standard error (NaN).

Wang 2026 Table 1: every variant's improvement over the baseline, and each combined variant's
(``sink+norm``, ``sink+proj``) over the sink logit, the "filtering increment".
Wang 2026 Table 2 (the 2x2 decomposition of each gate form, improvements over the baseline):
``sink`` (sinklogit), ``gate`` (normgate or projgate), ``both`` (sink+norm or sink+proj),
``overlap = sink + gate - both``, ``filter = both - sink``, ``share = filter / both``. Each
column but ``share`` is a mean of per-seed paired quantities with its standard error (the
per-seed quantities are linear in the losses, so the means satisfy the same identities);
``share`` is the ratio of the means, as the seed reports it.

Pure pandas/numpy: the report and the sweep's tables import this without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sinkscope.errors import SinkscopeError

#: the abstention reference of the lower block of Table 1.
SINK = "sinklogit"
BASELINE = "baseline"
#: Table 2's gate forms: label -> (gate alone, gate with the sink logit).
GATE_PAIRS: dict[str, tuple[str, str]] = {"norm gate": ("normgate", "sink+norm"),
                                          "projection gate": ("projgate", "sink+proj")}


@dataclass(frozen=True)
class Paired:
    """A paired mean over seeds: ``mean`` of ``per_seed`` values, its standard error, the seeds used."""

    mean: float
    se: float
    n: int
    seeds: tuple[int, ...]
    per_seed: tuple[float, ...]


def mean_se(values) -> tuple[float, float]:
    """Mean and standard error (sd with n - 1, over sqrt n); NaN where undefined."""
    x = np.asarray(list(values), dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1:
        return float(x[0]), math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))


def loss_table(losses) -> dict[str, dict[int, float]]:
    """{variant: {seed: loss}} from a frame with columns variant, seed, loss (or such a dict).

    One loss per (variant, seed); a duplicate is refused (it would make the pairing ambiguous).
    """
    if isinstance(losses, dict):
        return {str(v): {int(s): float(x) for s, x in seeds.items()} for v, seeds in losses.items()}
    frame = pd.DataFrame(losses)
    missing = {"variant", "seed", "loss"} - set(frame.columns)
    if missing:
        raise SinkscopeError(f"the losses need the columns variant, seed and loss (missing: {', '.join(sorted(missing))}).")
    if frame.duplicated(["variant", "seed"]).any():
        dup = frame[frame.duplicated(["variant", "seed"], keep=False)].iloc[0]
        raise SinkscopeError(f"two losses for variant {dup['variant']} and seed {dup['seed']}; pairing needs one each.")
    out: dict[str, dict[int, float]] = {}
    for row in frame.itertuples(index=False):
        out.setdefault(str(row.variant), {})[int(row.seed)] = float(row.loss)
    return out


def paired_improvement(losses, a: str, b: str) -> Paired:
    """Improvement of ``a`` over ``b``: mean over shared seeds of (loss_b - loss_a), positive = ``a`` better."""
    table = loss_table(losses)
    la, lb = table.get(a, {}), table.get(b, {})
    seeds = tuple(sorted(set(la) & set(lb)))
    diffs = tuple(lb[s] - la[s] for s in seeds)
    mean, se = mean_se(diffs)
    return Paired(mean, se, len(seeds), seeds, diffs)


def table1(losses, variants=None) -> pd.DataFrame:
    """Wang 2026 Table 1: rows ``block, variant, reference, improvement, se, n``.

    Block ``over baseline``: every variant but the baseline, against the baseline. Block
    ``over sinklogit``: every other variant with a learned phantom (``sink+*``) against the sink
    logit (the filtering increment). Variants without a shared seed are left out.
    """
    table = loss_table(losses)
    names = list(variants) if variants is not None else list(table)
    rows = []
    for block, reference, chosen in (
        ("over baseline", BASELINE, [v for v in names if v != BASELINE]),
        ("over sinklogit", SINK, [v for v in names if v.startswith("sink+")]),
    ):
        if reference not in table:
            continue
        for variant in chosen:
            result = paired_improvement(table, variant, reference)
            if result.n:
                rows.append({"block": block, "variant": variant, "reference": reference,
                             "improvement": result.mean, "se": result.se, "n": result.n})
    return pd.DataFrame(rows, columns=["block", "variant", "reference", "improvement", "se", "n"])


def table2(losses) -> pd.DataFrame:
    """Wang 2026 Table 2, one row per gate form whose three variants and the baseline were trained.

    Columns: ``gate, sink, gate_alone, both, overlap, filter, share`` and the standard error of
    each of the five paired columns (``*_se``), with ``n`` the seeds shared by all four variants.
    """
    table = loss_table(losses)
    rows = []
    for label, (gate, both) in GATE_PAIRS.items():
        needed = (BASELINE, SINK, gate, both)
        if not all(v in table for v in needed):
            continue
        seeds = sorted(set.intersection(*(set(table[v]) for v in needed)))
        if not seeds:
            continue
        base = np.array([table[BASELINE][s] for s in seeds])
        imp = {key: base - np.array([table[v][s] for s in seeds]) for key, v in
               (("sink", SINK), ("gate_alone", gate), ("both", both))}
        imp["overlap"] = imp["sink"] + imp["gate_alone"] - imp["both"]
        imp["filter"] = imp["both"] - imp["sink"]
        row = {"gate": label}
        for key, values in imp.items():
            row[key], row[f"{key}_se"] = mean_se(values)
        row["share"] = row["filter"] / row["both"] if row["both"] != 0 else math.nan
        row["n"] = len(seeds)
        rows.append(row)
    keys = ("sink", "gate_alone", "both", "overlap", "filter")
    return pd.DataFrame(rows, columns=["gate", *keys, "share", *(f"{k}_se" for k in keys), "n"])


def _undefined(x) -> bool:
    """None, NaN or pandas' NA: a number that is not there."""
    return x is None or bool(pd.isna(x))


def _four_figures(value: float, plus: str) -> str:
    """A value alone: four significant digits, never an exponent for a large one (``12346``, not ``1.235e+04``)."""
    if 1e4 <= abs(value) < 1e16:
        return f"{value:{plus}.0f}"
    return f"{value:{plus}.4g}"


def fmt_pm(mean, se=None, *, sign: bool = False, missing: str = "–") -> str:
    """``value ± se`` rounded where the standard error's second significant digit ends; how every table prints one.

        fmt_pm(0.0348732, 2.02109e-05)  ->  "0.034873 ± 0.000020"
        fmt_pm(3.18234, 0.2149)         ->  "3.18 ± 0.21"
        fmt_pm(1234.5, 567.0)           ->  "1230 ± 570"

    The se is rounded to two significant digits first (0.0999 -> 0.10), and the value to the same
    decimal place. Without a standard error (None, NaN, infinite or negative) the value alone with four
    significant digits (``0.0185``); a zero one (every window agrees) reads ``0.3333 ± 0``. ``sign``:
    ``+`` on positive values (differences); ``missing``: what a missing value prints as (the report's
    pages use an em dash).
    """
    if _undefined(mean):
        return missing
    value = float(mean)
    plus = "+" if sign else ""
    if _undefined(se) or not math.isfinite(float(se)) or float(se) < 0 or not math.isfinite(value):
        return _four_figures(value, plus)
    if float(se) == 0:
        return f"{_four_figures(value, plus)} ± 0"
    rounded_se = float(f"{float(se):.2g}")
    decimals = 1 - math.floor(math.log10(rounded_se))  # the place of the se's second significant digit
    if decimals > 0:
        shown = round(value, decimals) or 0.0  # no "-0.00"
        return f"{shown:{plus}.{decimals}f} ± {rounded_se:.{decimals}f}"
    step = 10.0 ** (-decimals)
    shown = round(value / step) * step or 0.0
    return f"{shown:{plus}.0f} ± {rounded_se:.0f}"


# ---- differences between two runs (the comparison's ``compare.csv``; SPEC.md "Comparisons of runs") ----


def paired_difference(a, b) -> tuple[float, float, int]:
    """``b - a`` window by window: (mean difference, its standard error, windows); the windows must match.

    ``a`` and ``b`` hold one value per window of two runs that measured the same windows, in the same
    order; the standard error is the sd of the per-window differences (n - 1) over sqrt(n), so what
    the two runs share (the windows' difficulty) cancels. NaN for fewer than 2 windows.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired values need one value per window in both runs, not shapes {x.shape} and {y.shape}")
    mean, se = mean_se(y - x)
    return mean, se, int(x.size)


def unpaired_se(se_a: float, se_b: float) -> float:
    """The standard error of a difference of two independent means: sqrt(se_a^2 + se_b^2) (NaN if either is)."""
    if se_a is None or se_b is None or pd.isna(se_a) or pd.isna(se_b):
        return math.nan
    return math.hypot(float(se_a), float(se_b))
