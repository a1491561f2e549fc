"""The ``mlp_pca`` and ``mlp_pca_up`` probes (``probes/mlp_pca.py``), fed synthetic MLP
pre-activations.

Built on a hand-written ``ModelSpec`` and given hook values of the documented shapes directly,
in more than one batch so the streaming sums are exercised. The reference is an independent
numpy float64 computation of each formula in the module docstring and SPEC.md "The position-zero
circuit": a PCA from ``np.cov``/``np.linalg.eigh`` on the stacked positions.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.capture import hooks
from sinkscope.errors import SinkscopeError
from sinkscope.probes import mlp_pca
from sinkscope.errors import check_heads
from sinkscope.probes.mlp_pca import SUBTRACTED, MlpPca, MlpPcaUp
from probe_helpers import assert_one_sentence, make_spec, one_row


def _pca_data(seed: int, B: int = 6, T: int = 12, F: int = 5) -> np.ndarray:
    """(B, T, F) with a distinct spectrum and position 0 shifted along one direction."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, F)) * np.array([3.0, 2.0, 1.2, 0.7, 0.3])  # (B, T, F)
    x[:, 0] += np.array([4.0, -1.0, 0.5, 2.0, 1.0])
    return x


def _pca_reference(x: np.ndarray) -> dict:
    """PCA over every position of every window; scores against the other positions (population std)."""
    B, T, F = x.shape
    flat = x.reshape(B * T, F)  # (N, F)
    mu = flat.mean(0)
    values, vectors = np.linalg.eigh(np.cov(flat.T, bias=True))  # ascending
    others, zero = x[:, 1:].reshape(-1, F), x[:, 0]  # (B (T-1), F), (B, F)
    diff = zero.mean(0) - others.mean(0)
    leading = vectors[:, ::-1][:, :mlp_pca.TOP_PCS]  # (F, k) leading first
    scores = np.abs(leading.T @ diff) / (others @ leading).std(0)  # (k,)
    v1 = leading[:, 0] * np.sign(leading[:, 0] @ diff)
    v2 = leading[:, 1] * np.sign(leading[:, 1] @ diff)
    return {"separation": (v1 @ diff) / (others @ v1).std(), "pc1": values[-1] / values.clip(min=0).sum(),
            "pc2": values[-2] / values.clip(min=0).sum(), "best": scores.max(), "best_pc": int(scores.argmax()) + 1,
            "mu": mu, "v1": v1, "v2": v2, "n": B * T}


def _check_pca_rows(rows, x: np.ndarray, subtracted: str, scatter_windows: int, positions: list[int]) -> None:
    ref = _pca_reference(x)
    cond = {"subtracted": subtracted}
    assert one_row(rows, "pca_separation", **cond).value == pytest.approx(ref["separation"], rel=1e-8)
    assert one_row(rows, "pca_explained_pc1", **cond).value == pytest.approx(ref["pc1"], rel=1e-8)
    assert one_row(rows, "pca_explained_pc2", **cond).value == pytest.approx(ref["pc2"], rel=1e-8)
    assert one_row(rows, "pca_separation_best", **cond).value == pytest.approx(ref["best"], rel=1e-8)
    assert one_row(rows, "pca_separation_best_pc", **cond).value == ref["best_pc"]
    assert one_row(rows, "pca_separation", **cond).n == ref["n"]
    # the scatter sample: position 0 of every window, the chosen positions of the first windows, in that order
    want = sorted([(w, 0) for w in range(x.shape[0])] + [(w, p) for w in range(scatter_windows) for p in positions])
    pc1 = [r for r in rows if r.metric == "pca_scatter_pc1" and dict(r.conditions)["subtracted"] == subtracted]
    pc2 = [r for r in rows if r.metric == "pca_scatter_pc2" and dict(r.conditions)["subtracted"] == subtracted]
    got = [(dict(r.conditions)["window"], dict(r.conditions)["position"]) for r in pc1]
    assert got == want
    assert [dict(r.conditions)["point"] for r in pc1] == list(range(len(want)))
    points = np.array([x[w, t] for w, t in want])  # (P, F)
    np.testing.assert_allclose([r.value for r in pc1], (points - ref["mu"]) @ ref["v1"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose([r.value for r in pc2], (points - ref["mu"]) @ ref["v2"], rtol=1e-5, atol=1e-5)


def test_mlp_pca_scores_and_scatter_equal_a_direct_pca():
    x = _pca_data(6)  # (B=6, T=12, F=5)
    probe = MlpPca(make_spec(), layer=0, scatter_positions=3, scatter_windows=2)
    assert probe.passes() == (None,)
    probe.pre(0, torch.from_numpy(x[:4]))  # (4, T, F): the first batch holds the scatter windows
    probe.pre(1, torch.from_numpy(x[:4] + 50.0))  # another layer: ignored
    probe.pre(0, torch.from_numpy(x[4:]))  # (2, T, F)
    rows = probe.rows()
    assert {r.layer for r in rows} == {0}
    # positions >= 1 in the sample: round(linspace(1, T - 1, 3))
    _check_pca_rows(rows, x, "none", scatter_windows=2, positions=[1, 6, 11])
    ref = _pca_reference(x)
    assert ref["separation"] > 1.0  # the constructed shift separates position 0


def test_mlp_pca_subtracted_pass_is_fitted_on_its_own_values_and_zeroes_only_its_heads():
    spec = make_spec(n_heads=4)
    probe = MlpPcaUp(spec, layer=1, heads=("1.3", "1.1"), scatter_positions=2, scatter_windows=1)
    assert probe.targets == [1, 3]
    assert probe.passes() == (None, SUBTRACTED)
    z = torch.randn(2, 5, 4, 3, dtype=torch.float64)  # (B, T, H, D)
    assert probe.zero(1, z) is None  # the clean pass changes nothing
    probe.pass_label = SUBTRACTED
    assert probe.zero(0, z) is None  # another layer: untouched
    zeroed = probe.zero(1, z)  # (B, T, H, D)
    assert torch.equal(zeroed[:, :, [1, 3]], torch.zeros_like(zeroed[:, :, [1, 3]]))
    assert torch.equal(zeroed[:, :, [0, 2]], z[:, :, [0, 2]])
    assert not torch.equal(z[:, :, 1], torch.zeros_like(z[:, :, 1]))  # the input was not changed in place

    clean, removed = _pca_data(7, B=3, T=9), _pca_data(8, B=3, T=9)
    probe.pass_label = None
    probe.pre(1, torch.from_numpy(clean))
    probe.pass_label = SUBTRACTED
    probe.pre(1, torch.from_numpy(removed))
    rows = probe.rows()
    positions = sorted(set(np.round(np.linspace(1, 8, 2)).astype(int).tolist()))
    _check_pca_rows(rows, clean, "none", scatter_windows=1, positions=positions)
    _check_pca_rows(rows, removed, "1.1+1.3", scatter_windows=1, positions=positions)
    assert hooks.MLP_PRE_LINEAR in MlpPcaUp.observers and hooks.MLP_PRE in MlpPca.observers


def test_mlp_pca_shares_merge_with_global_window_numbers():
    x = _pca_data(12, B=6, T=7)  # (B, T, F)
    whole, first, second = (MlpPca(make_spec(), scatter_positions=2, scatter_windows=2) for _ in range(3))
    whole.pre(0, torch.from_numpy(x))
    first.pre(0, torch.from_numpy(x[:3]))  # windows 0-2: its first two give the other positions
    second.pre(0, torch.from_numpy(x[3:]))  # windows 3-5, numbered 0-2 in their own share
    first.merge(second)
    want, got = whole.rows(), first.rows()
    assert [(r.metric, r.conditions, r.n) for r in got] == [(r.metric, r.conditions, r.n) for r in want]
    np.testing.assert_allclose([r.value for r in got], [r.value for r in want], rtol=1e-6, atol=1e-6)
    _check_pca_rows(got, x, "none", scatter_windows=2, positions=[1, 6])


def test_mlp_pca_without_values_has_no_rows():
    assert MlpPca(make_spec()).rows() == []


@pytest.mark.parametrize("params", [{"heads": ("1.0",)}, {"heads": ("0.4",)}, {"heads": ("zero",)},
                                    {"layer": -1}, {"scatter_positions": -2}, {"scatter_windows": -1}])
def test_mlp_pca_bad_parameters_are_one_sentence(params):
    with pytest.raises(SinkscopeError) as error:
        MlpPca(make_spec(n_heads=4), **params)  # layer 0 by default; heads 0 to 3
    assert_one_sentence(error)


def test_mlp_pca_heads_take_layer_head_pairs_checked_by_the_probe():
    """The check is shared (errors.py ``check_heads``); ``sinkscope circuit --subtract-head`` reuses it."""
    assert check_heads(("0.3", "12.7")) is None
    assert check_heads(("0.3", "1-2")) == "takes LAYER.HEAD pairs such as 0.3, not '1-2'"
    assert check_heads(("x",), example="3.1") == "takes LAYER.HEAD pairs such as 3.1, not 'x'"
    with pytest.raises(SinkscopeError, match=r"^the mlp_pca parameter heads takes LAYER\.HEAD pairs such as 0\.3, "
                                             r"not 'zero' \(got \('zero',\)\)\.$"):
        MlpPca(make_spec(), heads=("zero",))


def test_covariance_sums_that_would_not_fit_are_one_sentence_before_they_exist(monkeypatch):
    """Issue 56, item 3 (the guard): a 70B model's F = 28,672 needs 2 x 28,672^2 doubles (13.2 GB) per pass; with
    less free memory the probe stops in one sentence before allocating them, and nothing is accumulated."""
    from sinkscope.probes.mlp_pca import check_covariance_fits, covariance_bytes

    assert covariance_bytes(28_672, 1) == 2 * 28_672 ** 2 * 8
    with pytest.raises(SinkscopeError) as error:
        check_covariance_fits("mlp_pca", 28_672, 2, torch.device("cpu"), free=16 * 10 ** 9)
    assert_one_sentence(error)
    assert "26.3 GB" in str(error.value) and "28,672" in str(error.value)
    check_covariance_fits("mlp_pca", 28_672, 1, torch.device("cpu"), free=16 * 10 ** 9)  # 13.2 GB fits in 16
    monkeypatch.setattr(mlp_pca, "_free_bytes", lambda device: 100)  # 100 bytes free: a 5-wide field needs 400
    probe = MlpPca(make_spec(), layer=0)
    with pytest.raises(SinkscopeError, match="covariance sums of 5 x 5"):
        probe.pre(0, torch.from_numpy(_pca_data(2)))
    assert probe.sq_all.numel() == 0
