"""The ``attn_out_norm`` probe (``probes/attn_out_norm.py``), fed synthetic ``hook_z`` and
``hook_attn_out`` values.

Built on a hand-written ``ModelSpec`` and given hook values of the documented shapes directly,
in more than one batch so the streaming sums are exercised. The reference is an independent
numpy float64 computation of each formula in the module docstring and SPEC.md "The position-zero
circuit": norms per head and pooled, and a least-squares slope from ``np.polyfit``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.probes.attn_out_norm import AttnOutNorm
from probe_helpers import assert_one_sentence, make_spec, one_row, rows_by

RTOL = 1e-9


def _curve_reference(curve: np.ndarray) -> tuple[float, float]:
    """(position 0 / mean of t >= 1, least-squares slope against log2 t over t >= 1 / that mean)."""
    rest = curve[1:]
    slope = np.polyfit(np.log2(np.arange(1, len(curve))), rest, 1)[0]
    return curve[0] / rest.mean(), slope / rest.mean()


def test_attn_out_norm_rows_equal_per_head_pooled_and_output_norms():
    rng = np.random.default_rng(4)
    B, T, H, D, C = 4, 10, 3, 4, 12
    z = rng.normal(size=(B, T, H, D)) * np.linspace(2.0, 0.5, T)[None, :, None, None]  # (B, T, H, D) falling norm
    out = rng.normal(size=(B, T, C))  # (B, T, C)
    probe = AttnOutNorm(make_spec(n_heads=H), layer=1)
    for layer in (0, 1, 2):  # only layer 1 is read
        scale = 1.0 if layer == 1 else 100.0
        for part in (slice(0, 1), slice(1, B)):  # two batches
            probe.z(layer, torch.from_numpy(z[part] * scale))
            probe.attn_out(layer, torch.from_numpy(out[part] * scale))
    rows = probe.rows()
    assert {r.layer for r in rows} == {1}
    assert all(r.n == B for r in rows)
    per_head = np.linalg.norm(z, axis=-1).mean(0)  # (T, H)
    pooled = np.linalg.norm(z.reshape(B, T, H * D), axis=-1).mean(0)  # (T,)
    after = np.linalg.norm(out, axis=-1).mean(0)  # (T,)
    for metric, head, curve in [*[("attn_z_norm", h, per_head[:, h]) for h in range(H)],
                                ("attn_z_norm", None, pooled), ("attn_out_norm", None, after)]:
        got = {dict(r.conditions)["position"]: r.value for r in rows if r.metric == metric and r.head == head}
        np.testing.assert_allclose([got[t] for t in range(T)], curve, rtol=RTOL)
        assert sorted(got) == list(range(T))
        ratio, trend = _curve_reference(curve)
        of_head = [r for r in rows if r.head == head]
        assert one_row(of_head, f"{metric}_p0_ratio").value == pytest.approx(ratio, rel=RTOL)
        assert one_row(of_head, f"{metric}_trend").value == pytest.approx(trend, rel=1e-8)
    # the pooled row is the norm of the heads side by side, not the mean of the per-head rows
    assert not np.allclose(pooled, per_head.mean(1))
    assert rows_by(rows, "attn_z_norm_trend")[(1, None, ())] < 0  # the constructed norm falls with position
    assert not [r for r in rows if r.metric.startswith("attn_out_norm") and r.head is not None]


def test_attn_out_norm_trend_is_nan_with_one_position_after_zero_and_absent_points_give_no_rows():
    z = torch.from_numpy(np.random.default_rng(5).normal(size=(2, 2, 4, 4)))  # (B, T=2, H, D)
    probe = AttnOutNorm(make_spec())
    assert probe.rows() == []
    probe.z(0, z)  # hook_attn_out never arrives: only the hook_z rows
    rows = probe.rows()
    assert {r.metric for r in rows} == {"attn_z_norm", "attn_z_norm_p0_ratio", "attn_z_norm_trend"}
    norms = z.numpy()
    pooled = np.linalg.norm(norms.reshape(2, 2, 16), axis=-1).mean(0)  # (T,)
    assert one_row([r for r in rows if r.head is None], "attn_z_norm_p0_ratio").value == pytest.approx(
        pooled[0] / pooled[1], rel=RTOL)
    assert all(math.isnan(r.value) for r in rows if r.metric == "attn_z_norm_trend")


def test_attn_out_norm_bad_layer_is_one_sentence():
    with pytest.raises(SinkscopeError) as error:
        AttnOutNorm(make_spec(), layer=-1)
    assert_one_sentence(error)
