"""``Exposure`` (probes/exposure.py) against a float64 numpy reference on synthetic attention records.

Checked: per value head and window the quiet set {j : ||v_j|| < c} (strict), c numpy's linear
median or 25th percentile of the window's S read norms; ``quiet_mass_median`` / ``quiet_mass_q25``
= sum over quiet j of a_ij (phantom in the normaliser) for query head h reading value head
h // (H / Hkv), and ``exposure_phantom_mass`` = phi_i, both averaged over **every** query
i >= 0 (row 0 included, unlike p0_mass), with layer, model, ``n`` and ``se`` rows; the explicit
record and a fused one carrying the quiet-set columns sum_j w_ij 1[j quiet] agree; reads of
equal norm have no quiet read (mass 0); a fused record without the columns is refused.

Reference: numpy ``np.quantile`` and the numpy softmax of synthetic_attention.make_layer
(docs/SPEC.md "Quiet mass (exposure)").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.probes.exposure import Exposure
from synthetic_attention import assert_rows, expected_means, make_layer, spec

CUTOFFS = {"median": 0.5, "q25": 0.25}


def _quiet(v: np.ndarray, q: float, groups: int) -> np.ndarray:
    """The quiet reads per query head, (B, H, S) float64 indicator, from values (B, Hkv, S, D)."""
    norms = np.linalg.norm(v.astype(np.float32), axis=-1).astype(np.float64)  # (B, Hkv, S)
    cutoff = np.quantile(norms, q, axis=-1, keepdims=True)  # (B, Hkv, 1): numpy's linear default
    return np.repeat((norms < cutoff).astype(np.float64), groups, axis=1)  # (B, H, S)


def _quiet_columns(layer) -> torch.Tensor:
    """What a fused kernel call appends: sum_j w_ij 1[j quiet] per cutoff, (B, H, T, K) float32."""
    cols = [np.einsum("bhts,bhs->bht", layer.w, _quiet(layer.v, q, layer.groups)) for q in CUTOFFS.values()]
    return torch.from_numpy(np.stack(cols, axis=-1)).float()


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("sink", [None, "head", "query"])
@pytest.mark.parametrize("T", [12, 13])
def test_quiet_and_phantom_mass(fused, sink, T):
    probe = Exposure(spec(n_layers=2, has_phantom=sink is not None))
    assert probe.record_columns == frozenset({"quiet"})
    layers = {}
    for l in range(2):
        layers[l] = make_layer(l, T=T, sink=sink, seed=140 + l)
        record = layers[l].record
        if fused:
            record = make_layer(l, T=T, sink=sink, seed=140 + l, fused=True,
                                quiet_columns=_quiet_columns(layers[l])).record
        probe.attention(l, record)
    rows = probe.rows()

    for name, q in CUTOFFS.items():
        items = {l: np.einsum("bhts,bhs->bht", x.a, _quiet(x.v, q, x.groups)) for l, x in layers.items()}  # (B, H, T)
        assert 0.0 < np.mean([m.mean() for m in items.values()]) < 1.0
        assert_rows(rows, f"quiet_mass_{name}", expected_means(items))
    assert_rows(rows, "exposure_phantom_mass", expected_means({l: x.phi for l, x in layers.items()}))  # i >= 0
    if sink is not None:  # row 0 is in the average: it differs from the i >= 1 mean of phantom_mass
        x = layers[0]
        assert abs(x.phi.mean(axis=(0, 2)) - x.phi[:, :, 1:].mean(axis=(0, 2))).max() > 1e-4


def test_reads_of_equal_norm_have_no_quiet_read():
    """Strict <: a window whose reads all have one norm has an empty quiet set at every cutoff."""
    B, Hkv, T, D = 2, 2, 8, 8
    probe = Exposure(spec(n_layers=1, n_kv_heads=Hkv, head_dim=D))
    layer = make_layer(0, B=B, Hkv=Hkv, T=T, D=D, seed=150)
    same = np.zeros((B, Hkv, T, D), dtype=np.float32)
    same[:, :, np.arange(T), np.arange(T) % D] = 2.0  # (B, Hkv, S, D): every ||v_j|| = 2 exactly
    layer.record.value = torch.from_numpy(same)
    probe.attention(0, layer.record)
    rows = probe.rows()
    for name in CUTOFFS:
        assert_rows(rows, f"quiet_mass_{name}", expected_means({0: np.zeros((B, 4, T))}), tol=0.0)


def test_fused_record_without_quiet_columns_is_refused():
    probe = Exposure(spec(n_layers=1))
    with pytest.raises(NotImplementedError, match="quiet"):
        probe.attention(0, make_layer(0, fused=True, seed=160).record)
