"""The ``p0_norm`` probe (``probes/p0_norm.py``), fed synthetic ``hook_resid_post`` values.

Built on a hand-written ``ModelSpec`` and given hook values of the documented shapes directly,
in more than one batch so the streaming sums are exercised. The reference is an independent
numpy float64 computation of each formula in the module docstring and SPEC.md "The position-zero
circuit": norms and exact medians (``np.median``) and cosines over explicit pairs of
windows.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.probes.p0_norm import P0Norm
from probe_helpers import assert_one_sentence, make_spec, one_row, rows_by

RTOL = 1e-9


def _mean_pairwise_cos(x: np.ndarray) -> float:  # (N, C)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    return float(np.mean([u[i] @ u[j] for i, j in itertools.permutations(range(len(u)), 2)]))


def _p0_norm_inputs(seed: int = 0, B: int = 5, T: int = 9, C: int = 6, L: int = 3) -> list[np.ndarray]:
    """Per layer (B, T, C): position 0 scaled up from layer 1 on (so layer 1 is the first to separate)."""
    rng = np.random.default_rng(seed)
    hidden = []
    for layer in range(L):
        h = rng.normal(size=(B, T, C))  # (B, T, C)
        h[:, 0] = h[:, 0] * (1.0 if layer == 0 else 8.0) + (0.0 if layer == 0 else 3.0)  # a shared direction later
        hidden.append(h)
    return hidden


@pytest.mark.parametrize("position", [4, 64])
def test_p0_norm_equals_norms_medians_and_pairwise_cosines(position):
    hidden = _p0_norm_inputs()  # T = 9: eight other positions, an even count (median of two middle values)
    B, T, _ = hidden[0].shape
    probe = P0Norm(make_spec(), position=position, threshold=2.0)
    for layer, h in enumerate(hidden):
        probe.residual(layer, torch.from_numpy(h[:3]))  # (3, T, C): two batches
        probe.residual(layer, torch.from_numpy(h[3:]))  # (2, T, C)
    rows = probe.rows()
    later = min(position, T - 1)
    first = math.nan
    for layer, h in enumerate(hidden):
        norms = np.linalg.norm(h, axis=-1)  # (B, T)
        p0, other = norms[:, 0].mean(), np.median(norms[:, 1:], axis=1).mean()
        assert rows_by(rows, "p0_norm")[(layer, None, ())] == pytest.approx(p0, rel=RTOL)
        assert rows_by(rows, "other_norm")[(layer, None, ())] == pytest.approx(other, rel=RTOL)
        assert rows_by(rows, "p0_norm_ratio")[(layer, None, ())] == pytest.approx(p0 / other, rel=RTOL)
        assert rows_by(rows, "p0_cosine")[(layer, None, ())] == pytest.approx(_mean_pairwise_cos(h[:, 0]), abs=1e-12)
        assert rows_by(rows, "later_cosine")[(layer, None, (("position", later),))] == pytest.approx(
            _mean_pairwise_cos(h[:, later]), abs=1e-12)
        if math.isnan(first) and p0 / other > 2.0:
            first = float(layer)
    assert first == 1.0  # the construction: layer 0 does not separate, layer 1 does
    separates = one_row(rows, "p0_norm_separates")
    assert separates.value == first and separates.layer is None and separates.n == B
    assert all(r.n == B for r in rows if r.metric in ("p0_norm", "other_norm", "p0_norm_ratio"))
    assert all(r.n == B * (B - 1) for r in rows if r.metric in ("p0_cosine", "later_cosine"))  # ordered pairs


def test_p0_norm_separates_is_nan_when_no_layer_exceeds_the_threshold():
    hidden = _p0_norm_inputs(seed=1)
    probe = P0Norm(make_spec(), threshold=1e6)
    for layer, h in enumerate(hidden):
        probe.residual(layer, torch.from_numpy(h))  # (B, T, C)
    ratios = [np.linalg.norm(h, axis=-1)[:, 0].mean() / np.median(np.linalg.norm(h, axis=-1)[:, 1:], axis=1).mean()
              for h in hidden]
    assert max(ratios) < 1e6
    assert math.isnan(one_row(probe.rows(), "p0_norm_separates").value)


def test_p0_norm_with_one_window_has_no_cosines_and_unseen_layers_no_rows():
    h = np.random.default_rng(2).normal(size=(1, 5, 6))  # (B=1, T, C)
    probe = P0Norm(make_spec())
    assert probe.rows() == []  # nothing seen: no rows at all
    probe.residual(1, torch.from_numpy(h))
    rows = probe.rows()
    assert {r.metric for r in rows} == {"p0_norm", "other_norm", "p0_norm_ratio", "p0_norm_separates"}
    assert {r.layer for r in rows if r.metric != "p0_norm_separates"} == {1}
    assert rows_by(rows, "p0_norm")[(1, None, ())] == pytest.approx(np.linalg.norm(h[0, 0]), rel=RTOL)


def test_p0_norm_shares_merge_to_the_rows_of_one_probe():
    hidden = _p0_norm_inputs(seed=3)
    whole, first, second = (P0Norm(make_spec(), position=3) for _ in range(3))
    for layer, h in enumerate(hidden):
        whole.residual(layer, torch.from_numpy(h))  # (B, T, C)
        first.residual(layer, torch.from_numpy(h[:2]))
        second.residual(layer, torch.from_numpy(h[2:]))
    first.merge(second)
    want, got = whole.rows(), first.rows()
    key = lambda r: (r.metric, r.layer, r.conditions, r.n)  # noqa: E731
    assert [key(r) for r in got] == [key(r) for r in want]
    np.testing.assert_allclose([r.value for r in got], [r.value for r in want], rtol=1e-12)


@pytest.mark.parametrize("params", [{"position": 0}, {"threshold": 0.0}, {"threshold": "high"}, {"positon": 3}])
def test_p0_norm_bad_parameters_are_one_sentence(params):
    with pytest.raises(SinkscopeError) as error:
        P0Norm(make_spec(), **params)
    assert_one_sentence(error)
