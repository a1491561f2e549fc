"""``GateSelectivity`` (probes/gate_selectivity.py) against a float64 numpy reference on synthetic records.

Checked: for a value gate g_j and the real-key weights w_ij (phantom excluded),
m_i = sum_j w_ij g_j and sel_i = sqrt(sum_j w_ij (g_j - m_i)^2), averaged over queries i >= 1
and windows per head (``gate_selectivity``, ``gate_mean``), layer rows over heads, the model
row over layers, ``n`` and ``se``; explicit records and fused ones carrying the two moment
columns (sum_j w_ij x_j, sum_j w_ij x_j^2 with x_j = g_j - g_0) agree; GQA (a value head's gate
shared by its query heads); routing-norm (weights softmax_j(s_ij + log g_j)); a gate constant
within each row gives sel = 0 exactly; no rows without a value gate or for one-token windows.

Reference: the numpy softmax of synthetic_attention.make_layer (docs/SPEC.md "Gate selectivity").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.probes.gate_selectivity import GateSelectivity
from synthetic_attention import assert_rows, by_key, expected_means, make_layer, spec


def _gate(B: int, Hkv: int, S: int, seed: int) -> np.ndarray:
    """A value gate in (0, 1), (B, Hkv, S), float32-representable."""
    rng = np.random.default_rng(seed)
    return (1.0 / (1.0 + np.exp(-2.0 * rng.normal(size=(B, Hkv, S))))).astype(np.float32).astype(np.float64)


def _moments(layer, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m_i, sel_i), each (B, H, T), from the reference's real-key weights w and the gate (B, Hkv, S)."""
    g_q = np.repeat(g, layer.groups, axis=1)[:, :, None, :]  # (B, H, 1, S)
    m = (layer.w * g_q).sum(-1)  # (B, H, T)
    var = (layer.w * (g_q - m[..., None]) ** 2).sum(-1)  # (B, H, T)
    return m, np.sqrt(var)


def _gate_columns(layer, g: np.ndarray) -> torch.Tensor:
    """The fused kernel's two moment columns, (B, H, T, 2) float32: sum_j w_ij x_j, sum_j w_ij x_j^2."""
    x = np.repeat(g - g[..., :1], layer.groups, axis=1)  # (B, H, S): centred on g_0
    first = np.einsum("bhts,bhs->bht", layer.w, x)
    second = np.einsum("bhts,bhs->bht", layer.w, x * x)
    return torch.from_numpy(np.stack([first, second], axis=-1)).float()


def _run(fused: bool, sink: str | None, Hkv: int = 2, routing: bool = False, n_layers: int = 2):
    """Feed ``n_layers`` gated layers; returns (probe, {layer: (m, sel)})."""
    B, T = 3, 12
    probe = GateSelectivity(spec(n_layers=n_layers, n_kv_heads=Hkv, has_phantom=sink is not None,
                                 has_value_gate=True))
    assert probe.record_columns == frozenset({"value_gate"})
    reference = {}
    for l in range(n_layers):
        g = _gate(B, Hkv, T, seed=200 + l)
        common = dict(B=B, Hkv=Hkv, T=T, sink=sink, seed=210 + l, value_gate=torch.from_numpy(g).float(),
                      key_bias=np.log(g) if routing else None, routing_gate=routing)
        layer = make_layer(l, **common)
        record = layer.record
        if fused:
            record = make_layer(l, fused=True, gate_columns=_gate_columns(layer, g), **common).record
        probe.attention(l, record)
        reference[l] = _moments(layer, g)
    return probe, reference


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("sink", [None, "head"])
@pytest.mark.parametrize("Hkv", [1, 2, 4])
def test_selectivity_and_mean_gate(fused, sink, Hkv):
    probe, reference = _run(fused, sink, Hkv)
    rows = probe.rows()
    assert_rows(rows, "gate_selectivity", expected_means({l: sel[:, :, 1:] for l, (_, sel) in reference.items()}))
    assert_rows(rows, "gate_mean", expected_means({l: m[:, :, 1:] for l, (m, _) in reference.items()}))
    assert by_key(rows, "gate_selectivity")[(None, None)].value > 0.05  # a random gate discriminates


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_routing_norm_weights(fused):
    """routing-norm: the weights carry + log g_j; the moments are under those weights."""
    probe, reference = _run(fused, sink="head", routing=True)
    rows = probe.rows()
    assert_rows(rows, "gate_selectivity", expected_means({l: sel[:, :, 1:] for l, (_, sel) in reference.items()}))
    assert_rows(rows, "gate_mean", expected_means({l: m[:, :, 1:] for l, (m, _) in reference.items()}))


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_gate_constant_within_rows_has_zero_selectivity(fused):
    """Pure abstention: g_j the same for every key of a window and value head -> sel = 0 exactly, m = g."""
    B, Hkv, T = 3, 2, 10
    level = np.array([[0.2, 0.7], [0.5, 0.9], [0.3, 0.6]], dtype=np.float32).astype(np.float64)  # (B, Hkv)
    g = np.repeat(level[:, :, None], T, axis=2)  # (B, Hkv, S)
    probe = GateSelectivity(spec(n_layers=1, n_kv_heads=Hkv, has_value_gate=True))
    layer = make_layer(0, B=B, Hkv=Hkv, T=T, seed=220, value_gate=torch.from_numpy(g).float())
    record = layer.record
    if fused:
        record = make_layer(0, B=B, Hkv=Hkv, T=T, seed=220, fused=True, value_gate=torch.from_numpy(g).float(),
                            gate_columns=_gate_columns(layer, g)).record
    probe.attention(0, record)
    rows = probe.rows()
    assert all(r.value == 0.0 for r in rows if r.metric == "gate_selectivity")
    mean_items = np.repeat(level, 2, axis=1)[:, :, None] * np.ones((1, 1, T - 1))  # (B, H, T - 1)
    assert_rows(rows, "gate_mean", expected_means({0: mean_items}), tol=1e-7)


def test_no_rows_without_a_gate_or_with_one_token():
    probe = GateSelectivity(spec(n_layers=2, has_value_gate=True))
    probe.attention(0, make_layer(0, seed=230).record)  # no value gate
    one = make_layer(1, T=1, seed=231, value_gate=torch.full((3, 2, 1), 0.5))
    probe.attention(1, one.record)
    assert probe.rows() == []
