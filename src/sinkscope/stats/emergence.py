"""The emergence step of a metric along a series of checkpoints, with a bootstrap interval over windows (issue 58).

Given K checkpoints ordered by step (or tokens seen) ``x_1 < ... < x_K`` that were measured on the
same n windows, and each checkpoint's value per window ``v_k,w`` (a model or layer value: the mean
over its heads, SPEC.md "Averages"), the curve is ``c_k = mean_w v_k,w`` and (SPEC.md "The
emergence step"):

    threshold   t = (c_1 + c_K) / 2 unless given (half-way between the first and last value)
    direction   rising when c_K >= c_1, else falling
    step        the first crossing: the first k with c_k past t (>= t rising, <= t falling); the
                step is interpolated linearly between x_{k-1} and x_k,
                x_{k-1} + (t - c_{k-1}) / (c_k - c_{k-1}) * (x_k - x_{k-1}), or x_1 when c_1 is past t

The interval resamples the windows (the same resample for every checkpoint: the checkpoints are
paired by window), recomputes the curve, its threshold when it was not given, and the step, B
times (default 2,000, seeded), and gives the 2.5th and 97.5th percentiles of the steps found; the
replicates whose curve never crosses are counted (``no_crossing``) and left out of the
percentiles. A decision of this project: the interpolated crossing, not the first checkpoint
past the threshold, so the estimate does not jump from one checkpoint to the next with noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: bootstrap replicates and their seed (fixed: the same series gives the same interval).
REPLICATES = 2000
SEED = 0


@dataclass(frozen=True)
class Emergence:
    """One metric's emergence along a series.

    Attributes:
        step: the interpolated first crossing (NaN when the curve never crosses).
        low, high: the 95% bootstrap interval of the step over windows (NaN with fewer than 2 windows).
        threshold: the threshold crossed (given, or half-way between the first and last value).
        rising: whether the metric rises along the series.
        no_crossing: the share of bootstrap replicates whose curve never crossed.
        n_windows: the windows resampled.
    """

    step: float
    low: float
    high: float
    threshold: float
    rising: bool
    no_crossing: float
    n_windows: int


def first_crossing(x: np.ndarray, curve: np.ndarray, threshold: float, rising: bool) -> float:
    """The interpolated first crossing of ``threshold`` by ``curve`` (K,) over ``x`` (K,), or NaN (module docstring)."""
    past = curve >= threshold if rising else curve <= threshold  # (K,)
    if not past.any():
        return float("nan")
    k = int(np.argmax(past))
    if k == 0:
        return float(x[0])
    before, after = curve[k - 1], curve[k]
    share = 0.0 if after == before else (threshold - before) / (after - before)
    return float(x[k - 1] + share * (x[k] - x[k - 1]))


def emergence(x, values, threshold: float | None = None, *, replicates: int = REPLICATES,
              seed: int = SEED) -> Emergence:
    """The emergence step of ``values`` (K checkpoints, n windows) along ``x`` (K,), with its interval.

    ``x`` must increase; NaN windows (a checkpoint that did not see a window) are not allowed.
    """
    x = np.asarray(x, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)  # (K, n)
    if values.ndim != 2 or values.shape[0] != x.shape[0] or x.shape[0] < 2:
        raise ValueError("emergence needs values of shape (K, n) for K >= 2 checkpoints along x (K,)")
    if np.any(np.diff(x) <= 0):
        raise ValueError("the checkpoints' steps must increase")
    curve = values.mean(axis=1)  # (K,)
    rising = bool(curve[-1] >= curve[0])
    level = (curve[0] + curve[-1]) / 2 if threshold is None else float(threshold)
    step = first_crossing(x, curve, level, rising)
    n = values.shape[1]
    if n < 2:
        return Emergence(step, float("nan"), float("nan"), level, rising, float("nan"), n)
    rng = np.random.default_rng(seed)
    found = np.full(replicates, np.nan)
    for b in range(replicates):
        resampled = values[:, rng.integers(0, n, n)].mean(axis=1)  # (K,): the same windows for every checkpoint
        level_b = (resampled[0] + resampled[-1]) / 2 if threshold is None else level
        found[b] = first_crossing(x, resampled, level_b, bool(resampled[-1] >= resampled[0]) if threshold is None
                                  else rising)
    crossed = found[~np.isnan(found)]
    low, high = (np.percentile(crossed, [2.5, 97.5]) if crossed.size else (np.nan, np.nan))
    return Emergence(step, float(low), float(high), level, rising, float(1 - crossed.size / replicates), n)
