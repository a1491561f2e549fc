"""``ValueNormRatio`` and ``GatedValueNormRatio`` (probes/value_norm.py) against numpy on synthetic records.

Checked: r0 = ||v_0|| / median_{j >= 1} ||v_j|| per value (KV) head and window, averaged over
windows (rows indexed by KV head: Hkv of them under GQA, ``n`` = windows per head), with numpy's
exact median for an odd and an even count of keys j >= 1; the layer row the mean over KV heads
and the model row the mean over layers; the gated ratio of the reads g_j v_j, absent without a
value gate and for a routing-slot gate (whose reads are ungated).

Reference: numpy's ``np.linalg.norm`` and ``np.median`` on the record's values (docs/SPEC.md
"Value-norm ratio").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.probes.value_norm import GatedValueNormRatio, ValueNormRatio
from synthetic_attention import assert_rows, expected_means, make_layer, spec


def _ratio(norms: np.ndarray) -> np.ndarray:
    """(B, Hkv, S) read norms -> (B, Hkv, 1) r0 per window and value head."""
    return (norms[..., 0] / np.median(norms[..., 1:], axis=-1))[:, :, None]


def _gate(B: int, Hkv: int, S: int, seed: int) -> np.ndarray:
    """A value gate in (0, 1), (B, Hkv, S), float32-representable."""
    rng = np.random.default_rng(seed)
    return (1.0 / (1.0 + np.exp(-rng.normal(size=(B, Hkv, S)) * 2.0))).astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("T", [11, 12], ids=["even-median", "odd-median"])  # 10 or 11 keys j >= 1
@pytest.mark.parametrize("Hkv", [1, 2, 4])
def test_value_norm_ratio(T, Hkv):
    B, H = 4, 4
    probe = ValueNormRatio(spec(n_layers=2, n_heads=H, n_kv_heads=Hkv))
    layers = {l: make_layer(l, B=B, H=H, Hkv=Hkv, T=T, seed=100 + l) for l in range(2)}
    for l, layer in layers.items():
        layer.v[:, :, 0] *= 0.1  # a quiet sink value at position 0 (the record holds the same values)
        layer.record.value[:, :, 0] *= 0.1
        probe.attention(l, layer.record)
    rows = probe.rows()
    expected = expected_means({l: _ratio(np.linalg.norm(x.v, axis=-1)) for l, x in layers.items()})
    assert {key[1] for key in expected if key[0] == 0} == set(range(Hkv)) | {None}  # value heads, not query heads
    assert_rows(rows, "value_norm_ratio", expected)
    assert rows[-1].value < 0.5  # the quiet position 0 is visible in the number


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_gated_value_norm_ratio(fused):
    B, Hkv, T = 3, 2, 12
    probe = GatedValueNormRatio(spec(n_layers=2, n_kv_heads=Hkv, has_value_gate=True))
    gated, plain = {}, ValueNormRatio(spec(n_layers=2, n_kv_heads=Hkv))
    for l in range(2):
        g = _gate(B, Hkv, T, seed=110 + l)
        layer = make_layer(l, B=B, Hkv=Hkv, T=T, fused=fused, seed=120 + l,
                           value_gate=torch.from_numpy(g).float())
        probe.attention(l, layer.record)
        plain.attention(l, layer.record)
        gated[l] = _ratio(g * np.linalg.norm(layer.v, axis=-1))  # ||g_j v_j|| = g_j ||v_j||
    assert_rows(probe.rows(), "gated_value_norm_ratio", expected_means(gated))
    ungated = {(r.layer, r.head): r.value for r in plain.rows()}
    assert any(abs(ungated[(r.layer, r.head)] - r.value) > 1e-3 for r in probe.rows())  # the gate matters


def test_gated_ratio_absent_without_a_value_slot_gate():
    probe = GatedValueNormRatio(spec(n_layers=2))
    probe.attention(0, make_layer(0, seed=130).record)  # no value gate
    g = torch.from_numpy(_gate(3, 2, 12, seed=131)).float()
    routing = make_layer(1, seed=132, key_bias=np.log(g.double().numpy()), value_gate=g, routing_gate=True)
    probe.attention(1, routing.record)  # a routing-slot gate: the reads are ungated
    assert probe.rows() == []


def test_a_layer_with_fewer_value_heads_has_rows_for_its_own():
    """MiMo-like: layer 1 has half the value heads of the widest layer; its rows and layer mean cover those."""
    probe = ValueNormRatio(spec(n_layers=2, n_heads=4, n_kv_heads=2))
    wide, narrow = make_layer(0, Hkv=2, seed=140), make_layer(1, Hkv=1, seed=141)
    probe.attention(0, wide.record)
    probe.attention(1, narrow.record)
    expected = expected_means({0: _ratio(np.linalg.norm(wide.v, axis=-1)),
                               1: _ratio(np.linalg.norm(narrow.v, axis=-1))})
    assert (1, 1) not in expected
    assert_rows(probe.rows(), "value_norm_ratio", expected)
