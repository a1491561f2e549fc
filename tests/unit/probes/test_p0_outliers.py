"""The ``p0_outliers`` probe (``probes/p0_outliers.py``), fed synthetic values before and after the
first pre-norm.

Built on a hand-written ``ModelSpec`` and given hook values of the documented shapes directly,
in more than one batch so the streaming sums are exercised. The reference is an independent
numpy float64 computation of each formula in the module docstring and SPEC.md "The position-zero
circuit": z-scores from ``np.mean``/``np.std``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.probes.p0_outliers import P0Outliers
from probe_helpers import assert_one_sentence, make_spec, one_row


def _z_reference(x: np.ndarray) -> np.ndarray:
    """z_c = (mean_w x[w,0,c] - mean_{w,t>=1} x[w,t,c]) / std_{w,t>=1} x[w,t,c]; 0/0 -> 0, a/0 -> +-inf."""
    others = x[:, 1:].reshape(-1, x.shape[-1])  # (B (T-1), C)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (x[:, 0].mean(0) - others.mean(0)) / others.std(0)
    return np.where(np.isnan(z), 0.0, z)


def test_p0_outliers_rank_the_direct_z_scores_before_and_after_the_norm():
    rng = np.random.default_rng(9)
    B, T, C, L, top = 4, 6, 7, 2, 4
    data = {}
    for place in ("resid_pre", "normed"):
        for layer in range(L):
            x = rng.normal(size=(B, T, C))  # (B, T, C)
            x[:, 0, 2] += 6.0 if place == "resid_pre" else -3.0  # an outlier channel
            x[:, 1:, 4] = 0.0  # force-sink's reserved channel: zero at every other position ...
            x[:, 0, 4] = 1.5  # ... and not at position 0: z = +inf
            x[:, :, 6] = 0.0  # constant everywhere: z = 0
            data[place, layer] = x
    probe = P0Outliers(make_spec(n_layers=L, hidden=C), top=top)
    for layer in range(L):
        for part in (slice(0, 3), slice(3, B)):  # two batches
            probe.before(layer, torch.from_numpy(data["resid_pre", layer][part]))
            probe.after(layer, torch.from_numpy(data["normed", layer][part]))
    rows = probe.rows()
    for (place, layer), x in data.items():
        z = _z_reference(x)
        assert z[4] == np.inf and z[6] == 0.0
        order = np.argsort(-np.abs(z), kind="stable")[:top]
        got_z = [one_row([r for r in rows if r.layer == layer], "p0_outlier_z", where=place, rank=k).value
                 for k in range(1, top + 1)]
        got_c = [one_row([r for r in rows if r.layer == layer], "p0_outlier_channel", where=place, rank=k).value
                 for k in range(1, top + 1)]
        assert got_c == [float(c) for c in order]
        np.testing.assert_allclose(got_z, z[order], rtol=1e-9)
        max_z = one_row([r for r in rows if r.layer == layer], "p0_outlier_max_z", where=place)
        assert max_z.value == np.abs(z).max() == np.inf and max_z.n == B
    assert {r.layer for r in rows} == set(range(L))


def test_p0_outliers_a_constant_channel_that_does_not_differ_has_z_zero():
    x = np.random.default_rng(10).normal(size=(3, 7, 4))  # (B, T, C)
    x[:, :, 2] = 0.7  # the same value at position 0 and everywhere else
    probe = P0Outliers(make_spec(n_layers=1, hidden=4))
    probe.before(0, torch.from_numpy(x))
    assert float(probe.z_scores(0, 0)[2]) == 0.0  # the documented value: the channel does not differ


def test_p0_outliers_without_values_or_with_top_zero():
    assert P0Outliers(make_spec()).rows() == []
    with pytest.raises(SinkscopeError) as error:
        P0Outliers(make_spec(), top=0)
    assert_one_sentence(error)
