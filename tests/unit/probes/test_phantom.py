"""``PhantomMass`` (probes/phantom.py) against a float64 numpy reference on synthetic attention records.

Checked: ``phantom_mass`` = mean over queries i >= 1 and windows of phi_i = sigmoid(b - LSE_i),
which equals 1 - sum_j a_ij for weights with the phantom in the normaliser (gpt-oss eager), per
head, layer and model, with ``n`` and ``se``; explicit and fused records; ``sink_logit`` = b_h as a
fixed per-head row (n = 1, no se) for a per-head phantom, and the mean of b_hi over queries
i >= 1 and windows for a per-query phantom (Inkling2's ``sink_proj``); a model without a phantom
gets phantom mass 0 exactly and no ``sink_logit`` rows, weights-only records included.

Reference: synthetic_attention.make_layer's numpy softmax with the phantom column (docs/SPEC.md
"Notation", "Phantom mass").
"""

from __future__ import annotations

import numpy as np
import pytest

from sinkscope.probes.phantom import PhantomMass
from synthetic_attention import assert_rows, expected_means, fixed_rows, make_layer, spec


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_per_head_phantom(fused):
    probe = PhantomMass(spec(n_layers=2, has_phantom=True))
    layers = {l: make_layer(l, sink="head", fused=fused, seed=20 + l) for l in range(2)}
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    rows = probe.rows()

    items = {l: (1.0 - x.a.sum(-1))[:, :, 1:] for l, x in layers.items()}  # (B, H, T - 1): 1 - sum_j a_ij
    for l, x in layers.items():
        np.testing.assert_allclose(items[l], x.phi[:, :, 1:], atol=1e-12)  # = sigmoid(b_h - LSE_i)
        assert items[l].mean() > 0.01  # the phantom holds real mass: the test is not vacuous
    assert_rows(rows, "phantom_mass", expected_means(items))
    assert_rows(rows, "sink_logit", fixed_rows({l: x.b[0, :, 0] for l, x in layers.items()}))


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_per_query_phantom(fused):
    """b_hi (B, H, T): phi_i = sigmoid(b_hi - LSE_i); sink_logit is the mean of b_hi over i >= 1 and windows."""
    probe = PhantomMass(spec(n_layers=2, has_phantom=True))
    layers = {l: make_layer(l, sink="query", fused=fused, seed=30 + l) for l in range(2)}
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    rows = probe.rows()

    phi = {l: (1.0 / (1.0 + np.exp(x.lse - x.b)))[:, :, 1:] for l, x in layers.items()}  # (B, H, T - 1)
    assert_rows(rows, "phantom_mass", expected_means(phi))
    assert_rows(rows, "sink_logit", expected_means({l: x.b[:, :, 1:] for l, x in layers.items()}))


@pytest.mark.parametrize("weights_only", [False, True], ids=["record", "weights-only"])
def test_no_phantom_gives_zero_and_no_sink_logit(weights_only):
    probe = PhantomMass(spec(n_layers=2))
    B, H, T = 3, 4, 12
    for l in range(2):
        probe.attention(l, make_layer(l, B=B, H=H, T=T, weights_only=weights_only, seed=40 + l).record)
    rows = probe.rows()
    assert_rows(rows, "phantom_mass", expected_means({l: np.zeros((B, H, T - 1)) for l in range(2)}), tol=0.0)
    assert not [r for r in rows if r.metric == "sink_logit"]


def test_batches_of_one_layer_pool():
    probe = PhantomMass(spec(n_layers=1, has_phantom=True))
    first, second = make_layer(0, B=2, sink="head", seed=50), make_layer(0, B=4, sink="head", seed=50)
    probe.attention(0, first.record)
    probe.attention(0, second.record)
    pooled = np.concatenate([first.phi[:, :, 1:], second.phi[:, :, 1:]])  # (6, H, T - 1)
    rows = probe.rows()
    assert_rows(rows, "phantom_mass", expected_means({0: pooled}))
    assert_rows(rows, "sink_logit", fixed_rows({0: second.b[0, :, 0]}))  # a parameter: set, not summed
