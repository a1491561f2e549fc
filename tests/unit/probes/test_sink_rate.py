"""``SinkRate`` (probes/sink_rate.py) against a float64 numpy reference on synthetic attention records.

Checked: alpha_k = mean over queries t >= k of a_tk (phantom in the normaliser) per window and
head; ``sink_rate`` = the share of windows with alpha_k > eps per head (layer row: mean over heads,
model row: mean over layers, ``n`` windows), ``sink_alpha`` = alpha_k averaged over windows;
``sink_rate_from_layer`` (column ``layer_start`` = s) restricted to attention layers l >= s (none when ``layer_start`` is None); the
parameters ``epsilon`` and ``key``; on a sliding-window layer ``sink_alpha`` counting the queries
out of reach as 0, and the in-reach rows (alpha_k^reach over the queries that see key k) that
full layers do not get; the module's ``key_importance`` helpers; and bad parameters refused.

Reference: synthetic_attention.make_layer's numpy softmax (docs/SPEC.md "Sink rate"; Gu et al. 2025).
"""

from __future__ import annotations

import numpy as np
import pytest

from sinkscope.errors import SinkscopeError
from sinkscope.probes.sink_rate import SinkRate, key_importance, key_importance_in_reach
from synthetic_attention import assert_rows, by_key, expected_means, make_layer, spec


def _alpha(layer, k: int = 0) -> np.ndarray:
    """alpha_k per (window, head): mean over t >= k of a_tk, (B, H)."""
    return layer.a[:, :, k:, k].mean(-1)


def _alpha_in_reach(layer, k: int = 0) -> np.ndarray:
    """Mean of a_tk over the queries t that see key k, (B, H)."""
    seen = layer.visible[:, k]  # (T,)
    return layer.a[:, :, seen, k].mean(-1)


def _as_items(per_window: np.ndarray) -> np.ndarray:
    """(B, H) -> (B, H, 1): one item per window and head."""
    return per_window[:, :, None]


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("sink", [None, "head"])
def test_rates_and_alphas_equal_the_reference(fused, sink):
    eps = 0.3
    probe = SinkRate(spec(n_layers=4, has_phantom=sink is not None), epsilon=eps)
    layers = {l: make_layer(l, B=5, sink=sink, fused=fused, seed=60 + l) for l in range(4)}
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    rows = probe.rows()

    alphas = {l: _alpha(x) for l, x in layers.items()}
    hits = {l: (a > eps).astype(np.float64) for l, a in alphas.items()}
    all_hits = np.concatenate([h.ravel() for h in hits.values()])
    assert 0.0 < all_hits.mean() < 1.0  # some heads sink and some do not: the threshold matters
    assert_rows(rows, "sink_alpha", expected_means({l: _as_items(a) for l, a in alphas.items()}))
    assert_rows(rows, "sink_rate", expected_means({l: _as_items(h) for l, h in hits.items()}))

    late = [2, 3]  # layer_start defaults to 2
    late_rows = by_key(rows, "sink_rate_from_layer")
    assert set(late_rows) == {(None, None)}
    assert late_rows[(None, None)].conditions == (("layer_start", 2),)  # the parameter is a column
    assert late_rows[(None, None)].value == pytest.approx(np.mean([hits[l].mean() for l in late]), abs=1e-12)
    assert late_rows[(None, None)].n == 5  # the windows (SPEC.md "Tables")
    per_window = np.mean([hits[l].mean(axis=1) for l in late], axis=0)  # (B,): each window's rate over the late heads
    assert late_rows[(None, None)].se == pytest.approx(per_window.std(ddof=1) / np.sqrt(5), rel=1e-9)
    assert not [r for r in rows if r.metric.endswith("in_reach")]  # full layers only


def test_epsilon_key_and_layer_start_parameters():
    eps, k = 0.15, 2
    probe = SinkRate(spec(n_layers=3, attention_layers=(0, 1, 2)), epsilon=eps, key=k, layer_start=1)
    layers = {l: make_layer(l, B=4, seed=70 + l, sink_strength=np.zeros(4)) for l in range(3)}
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    rows = probe.rows()
    alphas = {l: _alpha(x, k) for l, x in layers.items()}
    hits = {l: (a > eps).astype(np.float64) for l, a in alphas.items()}
    assert_rows(rows, "sink_alpha", expected_means({l: _as_items(a) for l, a in alphas.items()}))
    assert_rows(rows, "sink_rate", expected_means({l: _as_items(h) for l, h in hits.items()}))
    late = by_key(rows, "sink_rate_from_layer")[(None, None)]
    assert late.value == pytest.approx(np.mean([hits[1].mean(), hits[2].mean()]), abs=1e-12)
    assert late.conditions == (("layer_start", 1),)  # one documented name under any start


def test_no_late_row_without_layer_start():
    probe = SinkRate(spec(n_layers=3), layer_start=None)
    for l in range(3):
        probe.attention(l, make_layer(l, seed=80 + l).record)
    assert not [r for r in probe.rows() if r.metric == "sink_rate_from_layer"]


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("k", [0, 1])
def test_sliding_window_rows(fused, k):
    """Layer 0 slides (W = 4 on T = 12), layer 1 is full: in-reach rows for layer 0 only."""
    eps, W = 0.3, 4
    probe = SinkRate(spec(n_layers=2, has_phantom=True), epsilon=eps, key=k)
    sliding = make_layer(0, B=6, window=W, sink="head", fused=fused, mask="min", seed=90)
    full = make_layer(1, B=6, sink="head", fused=fused, seed=91)
    probe.attention(0, sliding.record)
    probe.attention(1, full.record)
    rows = probe.rows()

    alpha = {0: _alpha(sliding, k), 1: _alpha(full, k)}
    T = sliding.a.shape[2]
    n_seen = int(sliding.visible[:, k].sum())
    assert n_seen == W  # queries k .. k + W - 1 see key k
    np.testing.assert_allclose(alpha[0], _alpha_in_reach(sliding, k) * n_seen / (T - k), atol=1e-12)  # zeros count
    assert_rows(rows, "sink_alpha", expected_means({l: _as_items(a) for l, a in alpha.items()}))
    reach = _alpha_in_reach(sliding, k)  # (B, H)
    assert_rows(rows, "sink_alpha_in_reach", expected_means({0: _as_items(reach)}))
    assert_rows(rows, "sink_rate_in_reach", expected_means({0: _as_items((reach > eps).astype(np.float64))}))


def test_key_importance_helpers():
    layer = make_layer(0, window=3, sink="head", seed=95)
    for k in (0, 2):
        np.testing.assert_allclose(key_importance(layer.record, k).double().numpy(), _alpha(layer, k), atol=1e-6)
        np.testing.assert_allclose(key_importance_in_reach(layer.record, k).double().numpy(),
                                   _alpha_in_reach(layer, k), atol=1e-6)


@pytest.mark.parametrize("params", [{"epsilon": 0.0}, {"epsilon": 1.0}, {"key": -1}, {"layer_start": -2},
                                    {"epsilon": "high"}, {"thresh": 0.3}])
def test_bad_parameters_are_refused(params):
    with pytest.raises(SinkscopeError):
        SinkRate(spec(), **params)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("first_query", [1, 3])
def test_first_query_averages_the_later_queries_only(first_query, window):
    """alpha_0 over t >= first_query (the audit's protocol at 1): the reference's rows from t on, a first_query column."""
    layer = make_layer(0, B=4, T=12, seed=21, window=window)
    probe = SinkRate(spec(n_layers=1), epsilon=0.3, layer_start=None, first_query=first_query)
    probe.attention(0, layer.record)
    rows = probe.rows()
    alpha = layer.a[:, :, first_query:, 0].mean(-1)  # (B, H): mean over t >= first_query of a_t0
    got = by_key(rows, "sink_alpha")
    for h in range(alpha.shape[1]):
        assert got[(0, h)].value == pytest.approx(alpha[:, h].mean(), rel=1e-5)
    rate = by_key(rows, "sink_rate")
    for h in range(alpha.shape[1]):
        assert rate[(0, h)].value == pytest.approx((alpha[:, h] > 0.3).mean())
    assert all(dict(r.conditions)["first_query"] == first_query for r in rows)
    plain = SinkRate(spec(n_layers=1), epsilon=0.3, layer_start=None)
    plain.attention(0, make_layer(0, B=4, T=12, seed=21, window=window).record)
    assert by_key(plain.rows(), "sink_alpha")[(0, 0)].value != got[(0, 0)].value  # query 0's a_00 = 1 is left out
    assert all("first_query" not in dict(r.conditions) for r in plain.rows())
    if window is not None:  # in reach: the queries t >= first_query that see key 0
        seen = layer.visible[:, 0].copy()
        seen[:first_query] = False
        reach = layer.a[:, :, seen, 0].mean(-1)
        assert by_key(rows, "sink_alpha_in_reach")[(0, 2)].value == pytest.approx(reach[:, 2].mean(), rel=1e-5)


@pytest.mark.parametrize("epsilon", [0.05, 0.3, 0.5, 0.9])
def test_epsilon_thresholds_alpha_as_the_formula_says(epsilon):
    layer = make_layer(0, B=5, T=10, seed=22)
    probe = SinkRate(spec(n_layers=1), epsilon=epsilon, layer_start=None)
    probe.attention(0, layer.record)
    alpha = layer.a[:, :, :, 0].mean(-1)  # (B, H), t >= 0
    rate = by_key(probe.rows(), "sink_rate")
    assert rate[(0, None)].value == pytest.approx((alpha > epsilon).mean())


def test_a_negative_first_query_is_refused():
    with pytest.raises(SinkscopeError, match="first_query must be at least 0"):
        SinkRate(spec(n_layers=1), first_query=-1)
