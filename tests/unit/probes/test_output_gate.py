"""``OutputGate`` (probes/output_gate.py) against numpy on synthetic output gates.

Checked, per (layer, head) over windows: ``out_gate_mean`` (every position i >= 0 and channel),
``out_gate_first`` (position 0), ``out_gate_rest`` (positions i >= 1) and ``out_gate_sparsity``
(share of gate values o < 0.1), with layer rows over heads, the model row over layers, ``n``
the gate values behind each number and ``se`` over windows; an elementwise gate counts every
channel, a headwise gate broadcast over the head's channels (stride 0) one value per head and
position; a one-token window has no ``out_gate_rest`` rows; a layer without an output gate
gives no rows.

Reference: numpy means over the gate array (docs/SPEC.md "Output-gate statistics").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.probes.output_gate import OutputGate
from synthetic_attention import assert_rows, by_key, expected_means, make_layer, spec


def _gate(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Gate values in (0, 1), a good share of them below 0.1, float32-representable."""
    rng = np.random.default_rng(seed)
    return (1.0 / (1.0 + np.exp(-(2.0 * rng.normal(size=shape) - 1.5)))).astype(np.float32).astype(np.float64)


def _items(o: np.ndarray) -> np.ndarray:
    """(B, T, H, D') gate values -> (B, H, T * D') items per window and head."""
    B, T, H, Dp = o.shape
    return o.transpose(0, 2, 1, 3).reshape(B, H, T * Dp)


@pytest.mark.parametrize("headwise", [False, True], ids=["elementwise", "headwise"])
def test_output_gate_statistics(headwise):
    B, T, H, D = 3, 9, 4, 8
    probe = OutputGate(spec(n_layers=2, n_heads=H, head_dim=D, has_output_gate=True))
    gates = {}
    for l in range(2):
        o = _gate((B, T, H, 1 if headwise else D), seed=300 + l)  # (B, T, H, D|1)
        tensor = torch.from_numpy(o).float()
        if headwise:
            tensor = tensor.expand(B, T, H, D)  # (B, T, H, D), stride 0 over the channels
            assert tensor.stride(-1) == 0
        probe.attention(l, make_layer(l, B=B, H=H, T=T, D=D, seed=310 + l, output_gate=tensor).record)
        gates[l] = o
    rows = probe.rows()

    assert_rows(rows, "out_gate_mean", expected_means({l: _items(o) for l, o in gates.items()}))
    assert_rows(rows, "out_gate_first", expected_means({l: _items(o[:, :1]) for l, o in gates.items()}))
    assert_rows(rows, "out_gate_rest", expected_means({l: _items(o[:, 1:]) for l, o in gates.items()}))
    sparse = {l: _items((o < 0.1).astype(np.float64)) for l, o in gates.items()}
    assert 0.0 < np.mean([s.mean() for s in sparse.values()]) < 1.0
    assert_rows(rows, "out_gate_sparsity", expected_means(sparse))
    per_head = by_key(rows, "out_gate_mean")[(0, 0)].n
    assert per_head == B  # the windows (SPEC.md "Tables")


def test_one_token_window_has_no_rest_rows():
    B, H, D = 2, 4, 8
    probe = OutputGate(spec(n_layers=1, n_heads=H, head_dim=D, has_output_gate=True))
    o = _gate((B, 1, H, D), seed=320)
    probe.attention(0, make_layer(0, B=B, T=1, seed=321, output_gate=torch.from_numpy(o).float()).record)
    rows = probe.rows()
    assert {r.metric for r in rows} == {"out_gate_mean", "out_gate_first", "out_gate_sparsity"}
    assert_rows(rows, "out_gate_first", expected_means({0: _items(o)}))
    assert_rows(rows, "out_gate_mean", expected_means({0: _items(o)}))


def test_layers_without_an_output_gate_give_no_rows():
    probe = OutputGate(spec(n_layers=2))
    probe.attention(0, make_layer(0, seed=330).record)
    probe.attention(1, make_layer(1, seed=331).record)
    assert probe.rows() == []
