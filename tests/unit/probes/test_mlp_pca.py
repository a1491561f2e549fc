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


def test_a_sketch_as_wide_as_the_field_gives_the_direct_pca_and_a_zero_bound():
    """covariance=sketch with l >= F: every shrink drops a zero singular value, so the sketched fit is the exact one."""
    x = _pca_data(6)  # (B=6, T=12, F=5)
    probe = MlpPca(make_spec(), layer=0, scatter_positions=3, scatter_windows=2, covariance="sketch", sketch_rank=16)
    probe.announce = lambda message: None
    probe.pre(0, torch.from_numpy(x[:4]))
    probe.pre(0, torch.from_numpy(x[4:]))
    assert probe.method() == "sketch" and probe.sq_all.numel() == 0
    rows = probe.rows()
    _check_pca_rows(rows, x, "none", scatter_windows=2, positions=[1, 6, 11])
    assert abs(one_row(rows, "pca_sketch_bound", subtracted="none").value) < 1e-10


def _wide_data(seed: int, B: int = 12, T: int = 64, F: int = 120) -> np.ndarray:
    """(B, T, F): a decaying spectrum wider than a small sketch, position 0 shifted along a few channels."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, F)) * np.logspace(0.8, -0.8, F) + 0.3  # (B, T, F)
    x[:, 0, :4] += np.array([6.0, -3.0, 2.0, 1.0])
    return x


def test_a_narrow_sketch_is_close_to_the_exact_pca_and_within_its_bound():
    """The sketch's leading components agree with the exact ones, better as l grows, and its explained share of
    PC1 obeys what the bound promises (Weyl: lambda_1(sketch) <= lambda_1 <= lambda_1(sketch) + shrunk / n)."""
    x = _wide_data(3)
    exact = MlpPca(make_spec(), covariance="exact")
    exact.pre(0, torch.from_numpy(x))
    want = exact.pca(0)
    assert want["bound"] == 0.0
    angles, bounds = [], []
    for rank in (32, 64, 96):
        probe = MlpPca(make_spec(), covariance="sketch", sketch_rank=rank)
        probe.announce = lambda message: None
        for part in np.split(x, 3):
            probe.pre(0, torch.from_numpy(part))
        got = probe.pca(0)
        cos = abs(float(got["v1"] @ want["v1"]))
        angles.append(np.degrees(np.arccos(min(cos, 1.0))))
        lead, lead_exact = got["pc1"], want["pc1"]  # shares of the same exact trace
        assert lead <= lead_exact * (1 + 1e-9)
        assert lead_exact <= lead * (1 + got["bound"]) * (1 + 1e-9)
        assert got["separation"] == pytest.approx(want["separation"], rel=0.15)
        bounds.append(got["bound"])
    assert angles == sorted(angles, reverse=True) and angles[-1] < 0.1  # degrees
    assert bounds == sorted(bounds, reverse=True)


def test_shares_that_took_different_ways_merge_as_sketches():
    """A share that held the covariance exactly and one that sketched it (their free memory differed) merge; with
    l >= F the conversion loses nothing, so the merged rows are the whole run's."""
    x = _pca_data(12, B=6, T=7)  # (B, T, F)
    whole = MlpPca(make_spec(), scatter_positions=2, scatter_windows=2, covariance="exact")
    first = MlpPca(make_spec(), scatter_positions=2, scatter_windows=2, covariance="exact")
    second = MlpPca(make_spec(), scatter_positions=2, scatter_windows=2, covariance="sketch", sketch_rank=16)
    for probe in (whole, first, second):
        probe.announce = lambda message: None
    whole.pre(0, torch.from_numpy(x))
    first.pre(0, torch.from_numpy(x[:3]))
    second.pre(0, torch.from_numpy(x[3:]))
    first.merge(second)
    assert first.method() == "sketch"
    want, got = whole.rows(), first.rows()
    got = [r for r in got if r.metric != "pca_sketch_bound"]
    want = [r for r in want if r.metric != "pca_sketch_bound"]
    assert [(r.metric, r.conditions, r.n) for r in got] == [(r.metric, r.conditions, r.n) for r in want]
    np.testing.assert_allclose([r.value for r in got], [r.value for r in want], rtol=1e-6, atol=1e-6)


def test_a_sketched_state_survives_a_checkpoint_and_a_rolled_back_batch():
    x = _wide_data(5, B=6, T=40, F=60)
    params = dict(covariance="sketch", sketch_rank=16)
    whole, resumed, rolled = (MlpPca(make_spec(), **params) for _ in range(3))
    for probe in (whole, resumed, rolled):
        probe.announce = lambda message: None
    whole.pre(0, torch.from_numpy(x[:3]))
    whole.pre(0, torch.from_numpy(x[3:]))
    resumed.pre(0, torch.from_numpy(x[:3]))
    fresh = MlpPca(make_spec(), **params)
    fresh.load_state_dict(resumed.state_dict())
    fresh.pre(0, torch.from_numpy(x[3:]))
    rolled.pre(0, torch.from_numpy(x[:3]))
    before = rolled.snapshot()
    rolled.pre(0, torch.from_numpy(x[3:] * 7.0))  # a batch that is rolled back
    rolled.restore(before)
    rolled.pre(0, torch.from_numpy(x[3:]))
    want = [r.value for r in whole.rows()]
    for probe in (fresh, rolled):
        assert [r.value for r in probe.rows()] == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_the_plan_is_stated_before_the_first_window_when_the_width_is_known():
    """prepare (called by the runner before the first batch) plans from ModelSpec.mlp_width and prints one line;
    without a known width the line comes with the first window, before anything F wide exists."""
    from dataclasses import replace

    said = []
    probe = MlpPca(replace(make_spec(), mlp_width=5), memory_gb=1.0)
    probe.prepare(torch.device("cpu"), said.append)
    assert probe.plan.method == "exact" and probe.sq_all.numel() == 0
    assert len(said) == 1 and said[0].startswith("mlp_pca: exact covariance of layer 0's 5-wide MLP")
    assert "budget 1.00 GB: memory_gb" in said[0]
    probe.pre(0, torch.from_numpy(_pca_data(2)))
    assert len(said) == 1  # stated once
    later = MlpPca(make_spec(), covariance="sketch", sketch_rank=16, memory_gb=1.0)
    later.prepare(torch.device("cpu"), said.append)
    assert len(said) == 1 and later.plan is None
    later.pre(0, torch.from_numpy(_pca_data(2)))
    assert len(said) == 2 and "a streaming sketch of rank 16" in said[1] and "pca_sketch_bound" in said[1]


def test_a_covariance_that_does_not_fit_its_budget_is_one_sentence_before_it_exists():
    """Issue 56, item 3: a forced exact covariance above the budget stops before allocating, and nothing is kept."""
    probe = MlpPca(make_spec(), layer=0, covariance="exact", memory_gb=1e-7)  # 100 bytes
    probe.announce = lambda message: None
    with pytest.raises(SinkscopeError) as error:
        probe.pre(0, torch.from_numpy(_pca_data(2)))
    assert_one_sentence(error)
    assert "mlp_pca at layer 0: the exact covariance of its 5-wide MLP needs" in str(error.value)
    assert probe.sq_all.numel() == 0 and probe.sum_all.numel() == 0
