"""The fixed-gap leak model of seed 001, fitted per head across context lengths (numpy only).

Seed 001 models a sink as a fixed logit gap Delta between the sink key and an average other key.
A query that sees n keys (the sink and n - 1 others) then puts

    sink(n) = 1 / (1 + (n - 1) e^{-Delta})        on the sink, and leaks
    leak(n) = 1 - sink(n)                          onto the real tokens.

sinkscope's ``p0_mass`` is the mean over queries i = 1 .. T-1 of the sink share w_i0, and
query i sees i + 1 keys, so under the model

    p0(T; Delta) = mean_{i=1}^{T-1} 1 / (1 + i e^{-Delta}),

increasing in Delta (Delta = 0 is the uniform floor of SPEC.md). Per (layer, head), Delta is
the root of p0(T0; Delta) = measured p0 at the shortest length T0 of a multi-length run
(bisection; clamped to [DELTA_MIN, DELTA_MAX] when the measurement lies outside what the model
can produce), and the model predicts p0 at every longer length. A head whose measured p0 stays
above the prediction holds its sink as context grows (its gap grows with n); one below it leaks
more than a fixed gap would.

Rows (probe ``leak_fit``; every row carries a ``seq_len``):

    leak_delta         Delta per head, at the shortest length
    leak_p0_predicted  p0(T; Delta) per head at each longer length T
    leak_p0_error      predicted minus measured p0 at each longer length (signed)
    leak               1 - sink(T): the leak of the last query of a window of T tokens

with the usual per-layer means over heads and model means over layers (``leak_p0_error``'s
aggregates are means of the signed errors; its per-head rows keep every sign).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from sinkscope.results import MetricInfo, Row

#: the bracket of the fit (nats): a head with p0 at or above sink(DELTA_MAX) is a perfect sink.
DELTA_MIN, DELTA_MAX = -30.0, 60.0

LEAK_METRICS = {
    "leak_delta": MetricInfo(
        "Fitted sink gap Delta", "nats",
        "Delta of seed 001's fixed-gap model fitted per head to p0_mass at the shortest length: "
        "mean_{i=1}^{T-1} 1/(1 + i e^{-Delta}) = p0",
        "seed 001 'A minimal model'; sinkscope.leak", "higher = a stronger sink"),
    "leak_p0_predicted": MetricInfo(
        "p0 predicted by the fixed gap", "share of real-key mass",
        "p0(T; Delta) = mean_{i=1}^{T-1} 1/(1 + i e^{-Delta}) at each longer length T, Delta fitted at the shortest",
        "seed 001; sinkscope.leak", "compare with the measured p0_mass at the same seq_len"),
    "leak_p0_error": MetricInfo(
        "Fixed-gap prediction error", "share of real-key mass",
        "predicted minus measured p0_mass at each longer length (negative: the sink holds better than a fixed gap)",
        "seed 001; sinkscope.leak", "closer to 0 = the fixed-gap model explains the length dependence"),
    "leak": MetricInfo(
        "Leak at the window's end", "share of mass",
        "leak(T) = 1 - 1/(1 + (T-1) e^{-Delta}): the mass a query seeing all T keys leaks off the sink",
        "seed 001", "higher = the sink lets more mass through"),
}


def p0_under_gap(delta, seq_len: int) -> np.ndarray:
    """p0(T; Delta) = mean_{i=1}^{T-1} 1 / (1 + i e^{-Delta}), elementwise over ``delta``."""
    delta = np.asarray(delta, dtype=np.float64)
    i = np.arange(1, seq_len, dtype=np.float64)  # (T-1,)
    return (1.0 / (1.0 + i * np.exp(-delta[..., None]))).mean(-1)


def leak(delta, n: int) -> np.ndarray:
    """leak(n) = 1 - 1 / (1 + (n - 1) e^{-Delta}) (seed 001)."""
    delta = np.asarray(delta, dtype=np.float64)
    return 1.0 - 1.0 / (1.0 + (n - 1) * np.exp(-delta))


def fit_delta(p0, seq_len: int, iterations: int = 80) -> np.ndarray:
    """Delta with p0(seq_len; Delta) = ``p0``, elementwise (bisection on [DELTA_MIN, DELTA_MAX])."""
    target = np.asarray(p0, dtype=np.float64)
    lo = np.full(target.shape, DELTA_MIN)
    hi = np.full(target.shape, DELTA_MAX)
    for _ in range(iterations):  # 90 nats / 2^80: far below float resolution
        mid = (lo + hi) / 2
        above = p0_under_gap(mid, seq_len) > target
        hi = np.where(above, mid, hi)
        lo = np.where(above, lo, mid)
    return (lo + hi) / 2


def _aggregate(per_head: dict[tuple[int, int], tuple[float, int]], metric: str, seq_len: int) -> list[Row]:
    """Per-head rows, per-layer means over heads, the model mean over layers (SPEC 'Averages')."""
    cond = (("seq_len", seq_len),)
    rows, by_layer = [], defaultdict(list)
    for (layer, head), (value, n) in sorted(per_head.items()):
        rows.append(Row("leak_fit", metric, layer, head, float(value), n, cond))
        by_layer[layer].append((value, n))
    layer_means = []
    for layer, items in sorted(by_layer.items()):
        layer_means.append(float(np.mean([v for v, _ in items])))
        rows.append(Row("leak_fit", metric, layer, None, layer_means[-1], sum(n for _, n in items), cond))
    if layer_means:
        rows.append(Row("leak_fit", metric, None, None, float(np.mean(layer_means)),
                        sum(n for _, n in per_head.values()), cond))
    return rows


def leak_rows(rows: list[Row]) -> list[Row]:
    """The ``leak_fit`` rows for a multi-length table's per-head ``p0_mass`` rows (none without them)."""
    p0: dict[int, dict[tuple[int, int], tuple[float, int]]] = defaultdict(dict)
    for row in rows:
        if row.metric == "p0_mass" and row.layer is not None and row.head is not None:
            conditions = dict(row.conditions)
            if set(conditions) == {"seq_len"}:
                p0[int(conditions["seq_len"])][(row.layer, row.head)] = (row.value, row.n)
    lengths = sorted(p0)
    if len(lengths) < 2:
        return []
    shortest = lengths[0]
    heads = sorted(p0[shortest])
    delta = fit_delta([p0[shortest][h][0] for h in heads], shortest)
    out = _aggregate({h: (d, p0[shortest][h][1]) for h, d in zip(heads, delta)}, "leak_delta", shortest)
    for n in lengths:
        out += _aggregate({h: (v, p0[shortest][h][1]) for h, v in zip(heads, leak(delta, n))}, "leak", n)
    for n in lengths[1:]:
        predicted = p0_under_gap(delta, n)
        out += _aggregate({h: (v, p0[n][h][1]) for h, v in zip(heads, predicted) if h in p0[n]},
                          "leak_p0_predicted", n)
        out += _aggregate({h: (v - p0[n][h][0], p0[n][h][1]) for h, v in zip(heads, predicted) if h in p0[n]},
                          "leak_p0_error", n)
    return out
