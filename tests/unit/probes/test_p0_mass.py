"""``P0Mass`` (probes/p0_mass.py) against a float64 numpy reference on synthetic attention records.

Checked: ``p0_mass`` = mean over queries i >= 1 and windows of w_i0 = a_i0 / sum_j a_ij (the
real-key share, so a phantom's mass is excluded), with layer rows the mean over heads, the model
row the mean over the layers seen, ``n`` the items behind each number and ``se`` over windows;
explicit and fused records alike (-inf or float32-minimum masks); the eager fallback's
weights-only records; batches adding up; and on a sliding-window layer the extra rows
``p0_out_of_reach`` (share of queries i >= 1 that cannot see key 0) and ``p0_mass_in_reach``
(w_i0 averaged over the queries that can, ``n`` their count), which full layers do not get.

Reference: synthetic_attention.make_layer's numpy softmax (docs/SPEC.md "Position-0 mass").
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sinkscope.probes.p0_mass import P0Mass
from synthetic_attention import Expected, assert_rows, by_key, expected_means, make_layer, spec


def _p0_items(layer) -> np.ndarray:
    """w_i0 for queries i >= 1, (B, H, T - 1), from the reference's a_ij."""
    a = layer.a  # (B, H, T, S)
    return (a[..., 0] / a.sum(-1))[:, :, 1:]  # (B, H, T - 1)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("sink", [None, "head"])
def test_p0_mass_rows_equal_the_reference(fused, sink):
    probe = P0Mass(spec(n_layers=2, has_phantom=sink is not None))
    layers = {l: make_layer(l, seed=10 + l, fused=fused, sink=sink) for l in range(2)}
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    rows = probe.rows()

    assert_rows(rows, "p0_mass", expected_means({l: _p0_items(x) for l, x in layers.items()}))
    assert {r.metric for r in rows} == {"p0_mass", "sink_head_share"}  # full layers: no reach rows
    if sink is not None:  # the real-key share differs from a_i0 itself where the phantom holds mass
        a0 = layers[0].a[..., 0][:, :, 1:].mean()
        assert abs(by_key(rows, "p0_mass")[(0, None)].value - a0) > 1e-3


def test_batches_add_up_and_unseen_layers_have_no_rows():
    """Two batches of one layer pool into one mean over all windows; a layer never fed gets no row."""
    probe = P0Mass(spec(n_layers=3, attention_layers=(0, 2)))
    first, second = make_layer(0, B=2, seed=1), make_layer(0, B=3, seed=2)
    other = make_layer(2, B=5, seed=3)
    probe.attention(0, first.record)
    probe.attention(0, second.record)
    probe.attention(2, other.record)
    pooled = np.concatenate([_p0_items(first), _p0_items(second)])  # (5, H, T - 1)
    assert_rows(probe.rows(), "p0_mass", expected_means({0: pooled, 2: _p0_items(other)}))


def test_weights_only_record_of_the_eager_fallback():
    probe = P0Mass(spec(n_layers=1))
    layer = make_layer(0, weights_only=True, seed=4)
    assert layer.record.weights_only
    probe.attention(0, layer.record)
    assert_rows(probe.rows(), "p0_mass", expected_means({0: _p0_items(layer)}))


def test_a_strong_sink_head_is_above_the_uniform_floor():
    """The fixture's head 3 parks most of its mass on key 0, head 0 does not (the test is not vacuous)."""
    probe = P0Mass(spec(n_layers=1))
    layer = make_layer(0, T=16, seed=5)
    probe.attention(0, layer.record)
    rows = by_key(probe.rows(), "p0_mass")
    floor = np.mean(1.0 / (np.arange(1, 16) + 1))  # SPEC.md: mean_{i>=1} 1/(i+1)
    assert rows[(0, 3)].value > 0.5 > floor
    assert rows[(0, 0)].value < rows[(0, 3)].value


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("mask", ["inf", "min"])
def test_sliding_window_layer_gets_reach_rows(fused, mask):
    """Layer 0 slides (W = 4 on T = 10: queries 1..3 see key 0, 4..9 do not); layer 1 is full."""
    W, T, B, H = 4, 10, 3, 4
    probe = P0Mass(spec(n_layers=2))
    sliding = make_layer(0, T=T, B=B, window=W, fused=fused, mask=mask, sink="head", seed=6)
    full = make_layer(1, T=T, B=B, fused=fused, mask=mask, seed=7)
    probe.attention(0, sliding.record)
    probe.attention(1, full.record)
    rows = probe.rows()

    items = {0: _p0_items(sliding), 1: _p0_items(full)}
    assert np.all(items[0][:, :, W - 1:] == 0.0)  # out of reach: w_i0 = 0, counted in p0_mass
    assert_rows(rows, "p0_mass", expected_means(items))

    reach = np.arange(1, T) < W  # (T - 1,): queries i >= 1 that see key 0
    out_items = np.broadcast_to(~reach, (B, H, T - 1)).astype(np.float64)
    assert_rows(rows, "p0_out_of_reach", expected_means({0: out_items}))

    in_reach = items[0][:, :, reach]  # (B, H, W - 1)
    per_head = in_reach.mean(axis=(0, 2))  # (H,)
    want = {(0, h): Expected(float(v), B) for h, v in enumerate(per_head)}  # n: the windows (SPEC.md "Tables")
    want[(0, None)] = Expected(float(per_head.mean()), B)
    want[(None, None)] = Expected(float(per_head.mean()), B)  # the one sliding layer
    assert_rows(rows, "p0_mass_in_reach", want, check_se=False)
    assert all(math.isnan(r.se) for r in rows if r.metric == "p0_mass_in_reach")  # a ratio of means: no se


def test_in_reach_model_row_averages_the_sliding_layers_only():
    W, T = 3, 8
    probe = P0Mass(spec(n_layers=3))
    layers = {0: make_layer(0, T=T, window=W, seed=8), 1: make_layer(1, T=T, seed=9),
              2: make_layer(2, T=T, window=W + 2, seed=10)}
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    rows = by_key(probe.rows(), "p0_mass_in_reach")
    assert {key[0] for key in rows} == {0, 2, None}
    layer_means = []
    for l in (0, 2):
        reach = np.arange(1, T) < layers[l].record.sliding_window
        layer_means.append(_p0_items(layers[l])[:, :, reach].mean(axis=(0, 2)).mean())
        assert rows[(l, None)].value == pytest.approx(layer_means[-1], abs=1e-5)
    assert rows[(None, None)].value == pytest.approx(np.mean(layer_means), abs=1e-5)
    assert rows[(None, None)].n == rows[(0, None)].n == rows[(2, None)].n  # the windows, which the layers share


@pytest.mark.parametrize("threshold", [0.5, 0.2])
def test_sink_head_share_counts_the_heads_above_the_threshold(threshold):
    """SPEC.md "Share of sink heads": per layer the share of its heads whose p0_mass exceeds the threshold,
    the model row over every (layer, head) pair; the threshold is a column, n counts the heads."""
    probe = P0Mass(spec(n_layers=2), head_share_threshold=threshold)
    layers = {l: make_layer(l, B=3, seed=40 + l, sink_strength=np.array([6.0, 0.0, 3.0, -2.0])) for l in range(2)}
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    p0 = {l: _p0_items(x).mean(axis=(0, 2)) for l, x in layers.items()}  # (H,) per layer
    assert any((p > threshold).any() for p in p0.values()) and any((p <= threshold).any() for p in p0.values())
    shares = by_key(probe.rows(), "sink_head_share")
    for l, heads in p0.items():
        row = shares[(l, None)]
        assert row.value == pytest.approx(float((heads > threshold).mean()), abs=1e-12)
        assert row.n == len(heads) and row.conditions == (("threshold", threshold),)
    pooled = np.concatenate(list(p0.values()))
    assert shares[(None, None)].value == pytest.approx(float((pooled > threshold).mean()), abs=1e-12)
    assert shares[(None, None)].n == len(pooled)
