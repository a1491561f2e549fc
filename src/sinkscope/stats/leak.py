"""The fixed-gap leak model of Qiu et al. 2025, fitted per head across context lengths (numpy only).

Qiu et al. 2025 models a sink as a fixed logit gap Delta between the sink key and an average other key.
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
    leak_delta_dp0     |dDelta/dp0| at the fitted Delta: the fit's conditioning (below)
    leak_delta_ill_conditioned  1 where |dDelta/dp0| > ILL_CONDITIONED_DP0 (1e3), else 0
    leak_p0_predicted  p0(T; Delta) per head at each longer length T
    leak_p0_error      predicted minus measured p0 at each longer length (signed); not on sliding
                       layers whose window W <= the shortest length (below)
    leak               1 - sink(T): the leak of the last query of a window of T tokens
    leak_gap           Delta fitted per head at each length on its own (how the gap moves with T)

with the usual per-layer means over heads and model means over layers (``leak_p0_error``'s
aggregates are means of the signed errors; its per-head rows keep every sign).

**Conditioning of Delta.** With s_i = 1 / (1 + r_i e^{-Delta}) the sink share of query i (r_i its
rival keys) and m_i = [i < W] on a sliding layer (1 otherwise), ds_i/dDelta = s_i (1 - s_i), so

    dp0/dDelta = mean_{i=1}^{T-1} m_i s_i (1 - s_i),      |dDelta/dp0| = 1 / mean_i m_i s_i (1 - s_i)

(computed as r_i e^{-Delta} / (1 + r_i e^{-Delta})^2, finite on the whole bracket). It is smallest
in mid-range (about 5 nats per unit p0 at T = 128) and grows without bound as p0 -> 1 (about
1 / (1 - p0): p0 = 0.999997 at 128 tokens, as SmolLM2's head 18.8, gives 3.3e5, so the fifth decimal of
p0 moves Delta by nats) and as p0 -> 0 (about 1 / p0). Delta is then a well-defined function of
logit(p0) (dDelta/dlogit p0 = p0 (1 - p0) |dDelta/dp0| stays between 1.0 and 1.2 at T = 128:
Delta ~ log mean_i r_i - log(1 - p0) near 1) but not a number to compare to a tenth of a nat.
``leak_delta_ill_conditioned`` flags |dDelta/dp0| > 1e3: a p0 error of 0.001 moves Delta by
more than a nat. The layer row of ``leak_delta_dp0`` is the mean over heads (the bound on the
layer-mean Delta's change when every head's p0 moves by one unit); of the flag, the share of
flagged heads.

**The error on sliding layers.** Where the shortest length T0 >= W, every query that sees key 0
(i < W) lies in the shortest window, and a causal model gives those queries the same weights at
every length (the windows are prefixes): the measured p0 at T is p0(T0) (T0 - 1) / (T - 1), and so
is the prediction. ``leak_p0_error`` would be 0 by construction there, so it has no rows on such
layers (its layer and model means are over the other layers; :func:`error_not_reported` names the
layers and ``P0_ERROR_NOT_REPORTED`` the reason; a multi-length run records both in its manifest
under ``probes.leak_fit.options.p0_error_not_reported``). ``leak_gap`` is, for the same reason, the
same at every length there.

Two extensions of the same model, so it applies where Qiu et al. 2025 and the learned-sinks note meet:

- **Sliding layers** (window W): query i sees min(i + 1, W) keys and key 0 only while i < W, so
  p0(T; Delta) = mean_i [i < W] / (1 + i e^{-Delta}) (the queries past the window count as 0,
  as in ``p0_mass``) and the leak stops growing at n = W: a windowed sink cannot leak further.
- **A learned phantom** (gpt-oss, ``sinklogit``): the phantom competes with all the real keys a
  query sees, phi_i = 1 / (1 + min(i + 1, W) e^{-Delta}). Models whose ``phantom_mass`` is not
  zero get the same rows for it: ``leak_phantom_delta``, ``leak_phantom_predicted``,
  ``leak_phantom_error``, ``leak_phantom`` (1 - phi of a query seeing n real keys), ``leak_phantom_gap``,
  ``leak_phantom_delta_dp0``, ``leak_phantom_delta_ill_conditioned``. The phantom sees every query,
  so its error is reported on every layer.

Every ``leak_fit`` row has ``n`` = the windows of the measured rows it is fitted to (SPEC.md
"Tables") and no ``se``: a fit (or a function of one) of means over windows is not a mean over them.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from sinkscope.store.results import MetricInfo, Row

#: the bracket of the fit (nats): a head with p0 at or above sink(DELTA_MAX) is a perfect sink.
DELTA_MIN, DELTA_MAX = -30.0, 60.0
#: |dDelta/dp0| above which Delta is flagged ill-conditioned (nats per unit of p0): a p0 error of
#: 0.001 would move Delta by more than a nat.
ILL_CONDITIONED_DP0 = 1e3
#: why leak_p0_error has no rows on a sliding layer with W <= the shortest length.
P0_ERROR_NOT_REPORTED = ("sliding window W <= the shortest length: every query that sees key 0 is inside the "
                         "shortest window, so the measured and predicted p0 at a longer length T are both the "
                         "shortest one's times (T0 - 1) / (T - 1) and the error is 0 by construction")

LEAK_METRICS = {
    "leak_delta": MetricInfo(
        "Fitted sink gap Delta", "nats",
        "Delta of Qiu et al. 2025's fixed-gap model fitted per head to p0_mass at the shortest length: "
        "mean_{i=1}^{T-1} 1/(1 + i e^{-Delta}) = p0",
        "Qiu et al. 2025 'A minimal model'; sinkscope.stats.leak", "higher = a stronger sink"),
    "leak_p0_predicted": MetricInfo(
        "p0 predicted by the fixed gap", "share of real-key mass",
        "p0(T; Delta) = mean_{i=1}^{T-1} 1/(1 + i e^{-Delta}) at each longer length T, Delta fitted at the shortest",
        "Qiu et al. 2025; sinkscope.stats.leak", "compare with the measured p0_mass at the same seq_len"),
    "leak_delta_dp0": MetricInfo(
        "Sensitivity of the fitted gap to p0", "nats per unit of p0",
        "|dDelta/dp0| = 1 / mean_{i=1}^{T-1} m_i s_i (1 - s_i), s_i = 1/(1 + i e^{-Delta}), m_i = [i < W] on a "
        "sliding layer; at the fitted Delta and the shortest length (layer row: mean over heads)",
        "sinkscope.stats.leak (the derivative of Qiu et al. 2025's model)",
        "higher = Delta less determined by p0 (about 5 in mid-range; ~1/(1 - p0) as p0 -> 1)"),
    "leak_delta_ill_conditioned": MetricInfo(
        "Fitted gap ill-conditioned", "flag (layer row: share of heads)",
        f"1 where leak_delta_dp0 > {ILL_CONDITIONED_DP0:g} (a p0 error of 0.001 moves Delta by more than a nat), "
        "else 0", "sinkscope.stats.leak", "1 = read Delta as -log of the leak, not to a tenth of a nat"),
    "leak_p0_error": MetricInfo(
        "Fixed-gap prediction error", "share of real-key mass",
        "predicted minus measured p0_mass at each longer length (negative: the sink holds better than a fixed gap); "
        "no rows on sliding layers whose window W <= the shortest length, where it is 0 by construction",
        "Qiu et al. 2025; sinkscope.stats.leak", "closer to 0 = the fixed-gap model explains the length dependence"),
    "leak": MetricInfo(
        "Leak at the window's end", "share of mass",
        "leak(T) = 1 - 1/(1 + (T-1) e^{-Delta}): the mass a query seeing all T keys leaks off the sink "
        "(on a sliding layer T is capped at the window W)",
        "Qiu et al. 2025", "higher = the sink lets more mass through"),
    "leak_gap": MetricInfo(
        "Gap implied at each length", "nats",
        "Delta fitted per head to p0_mass at this length alone (leak_delta is the one at the shortest); a gap that "
        "grows by log 4 = 1.39 nats per 4x of context holds the sink's share constant",
        "Qiu et al. 2025; sinkscope.stats.leak", "flat = a fixed gap (the sink leaks as context grows); rising = it holds"),
    "leak_phantom_gap": MetricInfo(
        "Phantom gap implied at each length", "nats",
        "Delta fitted per head to phantom_mass at this length alone", "Qiu et al. 2025; sinkscope.stats.leak",
        "flat = a fixed gap; rising = the phantom holds its share as context grows"),
    "leak_phantom_delta": MetricInfo(
        "Fitted phantom gap Delta", "nats",
        "Delta fitted per head to phantom_mass at the shortest length: mean_{i=1}^{T-1} 1/(1 + min(i+1, W) e^{-Delta})"
        " = phi", "Qiu et al. 2025 applied to the learned-sinks note's learned sink; sinkscope.stats.leak", "higher = a stronger phantom"),
    "leak_phantom_delta_dp0": MetricInfo(
        "Sensitivity of the fitted phantom gap", "nats per unit of phantom mass",
        "|dDelta/dphi| = 1 / mean_{i=1}^{T-1} s_i (1 - s_i), s_i = 1/(1 + min(i+1, W) e^{-Delta})",
        "sinkscope.stats.leak", "higher = Delta less determined by the phantom mass"),
    "leak_phantom_delta_ill_conditioned": MetricInfo(
        "Fitted phantom gap ill-conditioned", "flag (layer row: share of heads)",
        f"1 where leak_phantom_delta_dp0 > {ILL_CONDITIONED_DP0:g}, else 0", "sinkscope.stats.leak", ""),
    "leak_phantom_predicted": MetricInfo(
        "Phantom mass predicted by the fixed gap", "share of row mass",
        "the same mean at each longer length T, Delta fitted at the shortest", "Qiu et al. 2025; sinkscope.stats.leak",
        "compare with the measured phantom_mass at the same seq_len"),
    "leak_phantom_error": MetricInfo(
        "Fixed-gap phantom prediction error", "share of row mass",
        "predicted minus measured phantom_mass at each longer length", "Qiu et al. 2025; sinkscope.stats.leak",
        "closer to 0 = the fixed-gap model explains the length dependence"),
    "leak_phantom": MetricInfo(
        "Phantom leak at the window's end", "share of mass",
        "1 - 1/(1 + T e^{-Delta}): the mass on real keys of a query seeing T real keys (capped at W)",
        "Qiu et al. 2025; the learned-sinks note", "higher = the phantom lets more mass through"),
}


def p0_under_gap(delta, seq_len: int, *, window: int | None = None, phantom: bool = False) -> np.ndarray:
    """The sink's mean share over queries i = 1 .. T-1 under a fixed gap Delta, elementwise over ``delta``.

    Key 0 as the sink (``phantom`` False): mean_i [i < W] / (1 + i e^{-Delta}); a phantom:
    mean_i 1 / (1 + min(i + 1, W) e^{-Delta}). ``window`` None: no window.
    """
    delta = np.asarray(delta, dtype=np.float64)
    i = np.arange(1, seq_len, dtype=np.float64)  # (T-1,) query positions
    seen = i + 1 if window is None else np.minimum(i + 1, window)  # real keys each query sees
    rivals = seen if phantom else seen - 1  # the keys competing with the sink
    share = 1.0 / (1.0 + rivals * np.exp(-delta[..., None]))  # (..., T-1)
    if not phantom and window is not None:
        share = np.where(i < window, share, 0.0)  # key 0 out of reach
    return share.mean(-1)


def gap_sensitivity(delta, seq_len: int, *, window: int | None = None, phantom: bool = False) -> np.ndarray:
    """|dDelta/dp0| = 1 / (dp0/dDelta) of :func:`p0_under_gap` at ``delta``, elementwise.

    dp0/dDelta = mean_{i=1}^{T-1} m_i s_i (1 - s_i), s_i = 1/(1 + r_i e^{-Delta}) (r_i rival keys,
    m_i = [i < W] for key 0 on a sliding layer), evaluated as r_i e^{-Delta} / (1 + r_i e^{-Delta})^2
    so it stays finite on the whole bracket.
    """
    delta = np.asarray(delta, dtype=np.float64)
    i = np.arange(1, seq_len, dtype=np.float64)  # (T-1,) query positions
    seen = i + 1 if window is None else np.minimum(i + 1, window)
    rivals = seen if phantom else seen - 1
    odds = rivals * np.exp(-delta[..., None])  # (..., T-1): r_i e^{-Delta}
    slope = odds / (1.0 + odds) ** 2  # s_i (1 - s_i)
    if not phantom and window is not None:
        slope = np.where(i < window, slope, 0.0)
    return 1.0 / slope.mean(-1)


def error_not_reported(windows: list[int | None] | None, shortest: int) -> list[int]:
    """Layers whose ``leak_p0_error`` is 0 by construction (sliding, W <= ``shortest``): it has no rows there."""
    return [layer for layer, w in enumerate(windows or []) if w is not None and w <= shortest]


def leak(delta, n: int, *, window: int | None = None, phantom: bool = False) -> np.ndarray:
    """leak(n) = 1 - 1 / (1 + (n - 1) e^{-Delta}) (Qiu et al. 2025) for a query seeing n keys, sink included.

    A phantom competes with all n real keys (n - 1 becomes n); a window caps the keys at W.
    """
    delta = np.asarray(delta, dtype=np.float64)
    seen = n if window is None else min(n, window)
    rivals = seen if phantom else seen - 1
    return 1.0 - 1.0 / (1.0 + rivals * np.exp(-delta))


def fit_delta(p0, seq_len: int, iterations: int = 80, *, window: int | None = None,
              phantom: bool = False) -> np.ndarray:
    """Delta with p0_under_gap(Delta, seq_len) = ``p0``, elementwise (bisection on [DELTA_MIN, DELTA_MAX])."""
    target = np.asarray(p0, dtype=np.float64)
    lo = np.full(target.shape, DELTA_MIN)
    hi = np.full(target.shape, DELTA_MAX)
    for _ in range(iterations):  # 90 nats / 2^80: far below float resolution
        mid = (lo + hi) / 2
        above = p0_under_gap(mid, seq_len, window=window, phantom=phantom) > target
        hi = np.where(above, mid, hi)
        lo = np.where(above, lo, mid)
    return (lo + hi) / 2


def _aggregate(per_head: dict[tuple[int, int], tuple[float, int]], metric: str, seq_len: int) -> list[Row]:
    """Per-head rows, per-layer means over heads, the model mean over layers (SPEC 'Averages').

    ``n`` is the measured rows' windows on every row (SPEC.md "Tables": the heads share them, so the
    aggregates keep it, never a sum); no ``se``: a fit of means over windows is not one.
    """
    cond = (("seq_len", seq_len),)
    rows, by_layer = [], defaultdict(list)
    for (layer, head), (value, n) in sorted(per_head.items()):
        rows.append(Row("leak_fit", metric, layer, head, float(value), n, cond))
        by_layer[layer].append((value, n))
    layer_means = []
    for layer, items in sorted(by_layer.items()):
        layer_means.append(float(np.mean([v for v, _ in items])))
        rows.append(Row("leak_fit", metric, layer, None, layer_means[-1], max(n for _, n in items), cond))
    if layer_means:
        rows.append(Row("leak_fit", metric, None, None, float(np.mean(layer_means)),
                        max(n for _, n in per_head.values()), cond))
    return rows


#: (measured metric, phantom, metric names: delta, predicted, error, leak, gap, |dDelta/dp0|, flag)
SINKS = (("p0_mass", False, ("leak_delta", "leak_p0_predicted", "leak_p0_error", "leak", "leak_gap", "leak_delta_dp0",
                             "leak_delta_ill_conditioned")),
         ("phantom_mass", True, ("leak_phantom_delta", "leak_phantom_predicted", "leak_phantom_error", "leak_phantom",
                                 "leak_phantom_gap", "leak_phantom_delta_dp0", "leak_phantom_delta_ill_conditioned")))


def leak_rows(rows: list[Row], windows: list[int | None] | None = None) -> list[Row]:
    """The ``leak_fit`` rows of a multi-length table (none without two lengths of per-head rows).

    ``windows[l]``: the sliding window of layer l (None: full), for the windowed form of the model.
    Phantom rows only where some head's ``phantom_mass`` is not zero.
    """
    out: list[Row] = []
    for measured, phantom, names in SINKS:
        values: dict[int, dict[tuple[int, int], tuple[float, int]]] = defaultdict(dict)
        for row in rows:
            if row.metric == measured and row.layer is not None and row.head is not None:
                conditions = dict(row.conditions)
                if set(conditions) == {"seq_len"}:
                    values[int(conditions["seq_len"])][(row.layer, row.head)] = (row.value, row.n)
        lengths = sorted(values)
        if len(lengths) < 2 or (phantom and not any(v for v, _ in values[lengths[0]].values())):
            continue
        out += _fit(values, lengths, phantom, names, windows or [])
    return out


def _fit(values, lengths, phantom, names, windows) -> list[Row]:
    delta_name, predicted_name, error_name, leak_name, gap_name, dp0_name, flag_name = names
    shortest = lengths[0]
    heads = sorted(values[shortest])
    window_of = {h: windows[h[0]] if h[0] < len(windows) else None for h in heads}
    gaps = {n: {h: float(fit_delta([v], n, window=window_of.get(h), phantom=phantom)[0])
                for h, (v, _) in values[n].items()} for n in lengths}  # the gap each length alone implies
    delta = gaps[shortest]
    out = _aggregate({h: (delta[h], values[shortest][h][1]) for h in heads}, delta_name, shortest)
    dp0 = {h: float(gap_sensitivity([delta[h]], shortest, window=window_of[h], phantom=phantom)[0]) for h in heads}
    out += _aggregate({h: (dp0[h], values[shortest][h][1]) for h in heads}, dp0_name, shortest)
    out += _aggregate({h: (float(dp0[h] > ILL_CONDITIONED_DP0), values[shortest][h][1]) for h in heads}, flag_name,
                      shortest)
    # key 0 on a sliding layer with W <= the shortest length: the error is 0 by construction (not reported)
    exempt = set() if phantom else set(error_not_reported(windows, shortest))
    for n in lengths:
        out += _aggregate({h: (g, values[n][h][1]) for h, g in gaps[n].items()}, gap_name, n)
    for n in lengths:
        out += _aggregate({h: (float(leak(delta[h], n, window=window_of[h], phantom=phantom)), values[shortest][h][1])
                           for h in heads}, leak_name, n)
    for n in lengths[1:]:
        predicted = {h: float(p0_under_gap([delta[h]], n, window=window_of[h], phantom=phantom)[0])
                     for h in heads if h in values[n]}
        out += _aggregate({h: (p, values[n][h][1]) for h, p in predicted.items()}, predicted_name, n)
        out += _aggregate({h: (p - values[n][h][0], values[n][h][1]) for h, p in predicted.items()
                           if h[0] not in exempt}, error_name, n)
    return out
