"""``ReadGate`` (probes/read_gate.py) against numpy on synthetic value gates.

Checked, per value (KV) head over every read j (BOS included) of every window, unweighted:
``read_gate_mean`` = mean of g_j and ``read_gate_below_half`` = share of reads with g_j < 0.5
(strict: a gate of exactly 0.5 is not below), with rows indexed by value head, layer rows over
those heads, the model row over layers, ``n`` = reads per head (windows x keys) and ``se`` over
windows; the attention weights play no part (a routing-slot gate reads the same); no rows for
layers without a value gate.

Reference: numpy means over the gate array (docs/SPEC.md "Routing-slot gate statistics").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.probes.read_gate import ReadGate
from synthetic_attention import assert_rows, by_key, expected_means, make_layer, spec


def _gate(B: int, Hkv: int, S: int, seed: int) -> np.ndarray:
    """Gate values in (0, 1), some exactly 0.5, float32-representable, (B, Hkv, S)."""
    rng = np.random.default_rng(seed)
    g = 1.0 / (1.0 + np.exp(-1.5 * rng.normal(size=(B, Hkv, S))))
    g[:, :, ::4] = 0.5  # on the threshold: not below it
    return g.astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("Hkv", [1, 2, 4])
@pytest.mark.parametrize("routing", [False, True], ids=["value-slot", "routing-slot"])
def test_read_gate_statistics(Hkv, routing):
    B, T = 3, 12
    probe = ReadGate(spec(n_layers=2, n_kv_heads=Hkv, has_value_gate=True))
    gates = {}
    for l in range(2):
        g = _gate(B, Hkv, T, seed=400 + l)
        probe.attention(l, make_layer(l, B=B, Hkv=Hkv, T=T, seed=410 + l, value_gate=torch.from_numpy(g).float(),
                                      key_bias=np.log(g) if routing else None, routing_gate=routing).record)
        gates[l] = g
    rows = probe.rows()
    assert_rows(rows, "read_gate_mean", expected_means(gates))
    below = {l: (g < 0.5).astype(np.float64) for l, g in gates.items()}
    assert_rows(rows, "read_gate_below_half", expected_means(below))
    assert {h for (l, h) in by_key(rows, "read_gate_mean") if l == 0} == set(range(Hkv)) | {None}
    assert by_key(rows, "read_gate_mean")[(0, 0)].n == B  # the windows (SPEC.md "Tables")


def test_the_threshold_is_strict():
    probe = ReadGate(spec(n_layers=1, has_value_gate=True))
    g = torch.tensor([0.5, 0.49, 0.51, 0.5]).repeat(2, 2, 1)  # (B, Hkv, S) = (2, 2, 4)
    probe.attention(0, make_layer(0, B=2, T=4, seed=420, value_gate=g).record)
    below = by_key(probe.rows(), "read_gate_below_half")
    assert below[(0, 0)].value == 0.25 and below[(0, None)].value == 0.25


def test_layers_without_a_value_gate_give_no_rows():
    probe = ReadGate(spec(n_layers=2))
    probe.attention(0, make_layer(0, seed=430).record)
    gated = make_layer(1, seed=431, value_gate=torch.full((3, 2, 12), 0.25))
    probe.attention(1, gated.record)
    rows = probe.rows()
    assert {r.layer for r in rows} == {1, None}
    assert_rows(rows, "read_gate_mean", expected_means({1: np.full((3, 2, 12), 0.25)}), tol=0.0)


def test_a_layer_with_fewer_value_heads_has_rows_for_its_own():
    probe = ReadGate(spec(n_layers=2, n_kv_heads=2, has_value_gate=True))
    gates = {0: _gate(3, 2, 12, seed=440), 1: _gate(3, 1, 12, seed=441)}  # layer 1: one value head
    for l, g in gates.items():
        probe.attention(l, make_layer(l, Hkv=g.shape[1], seed=450 + l, value_gate=torch.from_numpy(g).float()).record)
    rows = probe.rows()
    assert_rows(rows, "read_gate_mean", expected_means(gates))
    assert_rows(rows, "read_gate_below_half", expected_means({l: (g < 0.5).astype(np.float64) for l, g in gates.items()}))
