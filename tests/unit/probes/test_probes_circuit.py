"""The five position-zero circuit probes of ``probes/circuit.py``, fed synthetic hook values.

Each probe is built on a hand-written ``ModelSpec`` and given hook values of the documented shapes
directly (``residual``, ``z``, ``attn_out``, ``pre``, ``before``/``after``, ``loss``, ``attention``),
in more than one batch so the streaming sums are exercised. The reference is an independent
numpy float64 computation of each formula in the module docstring and SPEC.md "The position-zero
circuit": norms and exact medians (``np.median``), cosines over explicit pairs of windows, a
least-squares slope from ``np.polyfit``, a PCA from ``np.cov``/``np.linalg.eigh`` on the stacked
positions, z-scores from ``np.mean``/``np.std``, and the BOS passes' inputs and kept targets built
from Python lists.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from sinkscope.capture import hooks
from sinkscope.capture.families import ModelSpec
from sinkscope.capture.record import AttentionRecord
from sinkscope.errors import SinkscopeError
from sinkscope.probes import circuit
from sinkscope.probes.circuit import SUBTRACTED, AttnOutNorm, BosExperiment, MlpPca, MlpPcaUp, P0Norm, P0Outliers

RTOL = 1e-9


def make_spec(n_layers: int = 3, n_heads: int = 4, hidden: int = 6) -> ModelSpec:
    return ModelSpec(family="test", n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads, head_dim=4,
                     hidden_size=hidden, attention_layers=tuple(range(n_layers)), has_phantom=False,
                     has_output_gate=False)


def rows_by(rows, metric: str) -> dict:
    """{(layer, head, conditions as a tuple): value} of one metric's rows."""
    return {(r.layer, r.head, r.conditions): r.value for r in rows if r.metric == metric}


def one_row(rows, metric: str, **conditions):
    found = [r for r in rows if r.metric == metric
             and all(dict(r.conditions).get(k) == v for k, v in conditions.items())]
    assert len(found) == 1, (metric, conditions, found)
    return found[0]


def assert_one_sentence(error: pytest.ExceptionInfo) -> None:
    message = str(error.value)
    assert "\n" not in message and message.endswith("."), message


# ---- p0_norm ------------------------------------------------------------------------------------------


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


# ---- attn_out_norm -----------------------------------------------------------------------------------


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


# ---- mlp_pca / mlp_pca_up ----------------------------------------------------------------------------


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
    leading = vectors[:, ::-1][:, :circuit.TOP_PCS]  # (F, k) leading first
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


# ---- p0_outliers -------------------------------------------------------------------------------------


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


# ---- bos_experiment ------------------------------------------------------------------------------------


def _bos_inputs_reference(ids: list[list[int]], setting: str, r: int, r_max: int, bos: int) -> list[list[int]]:
    out = []
    for window in ids:
        K = window[1:len(window) - r_max + 1]
        out.append([bos] * r + K if setting == "with" else [K[0]] * r + K[1:])
    return out


def test_bos_passes_build_their_inputs_from_the_windows_content():
    probe = BosExperiment(make_spec(), bos_id=7, repeats=(4, 1, 2))
    assert probe.passes() == ("with-bos-r1", "with-bos-r2", "with-bos-r4",
                              "without-bos-r1", "without-bos-r2", "without-bos-r4")
    ids = torch.arange(100, 120).reshape(2, 10)  # (B, T)
    probe.pass_label = None
    assert probe.pass_inputs(ids) is None  # the clean windows are left alone
    for label in probe.passes():
        probe.pass_label = label
        setting, r = label.split("-bos-r")
        got = probe.pass_inputs(ids)  # (B, T')
        assert got.tolist() == _bos_inputs_reference(ids.tolist(), setting, int(r), 4, 7)
        assert got.dtype == ids.dtype


def test_bos_pass_observers_read_attention_only_on_the_r1_passes():
    probe = BosExperiment(make_spec(), bos_id=0)
    assert hooks.ATTN in probe.pass_observers("with-bos-r1")
    assert hooks.ATTN in probe.pass_observers("without-bos-r1")
    assert hooks.ATTN not in probe.pass_observers("without-bos-r8")
    assert hooks.LOSS in probe.pass_observers("without-bos-r8")


def _weights(rng, B: int, H: int, T: int, sink: np.ndarray) -> np.ndarray:
    """(B, H, T, T) causal softmax of random logits, key 0 raised by ``sink`` (per head)."""
    logits = rng.normal(size=(B, H, T, T)) + np.zeros((B, H, T, T))
    logits[..., 0] += sink[None, :, None]
    logits = np.where(np.tril(np.ones((T, T), dtype=bool)), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def test_bos_sink_rate_and_repeat_loss_equal_direct_computation():
    rng = np.random.default_rng(11)
    L, H, B, T, eps = 4, 3, 5, 8, 0.3
    spec = make_spec(n_layers=L, n_heads=H)
    probe = BosExperiment(spec, bos_id=1, repeats=(1, 2, 4), epsilon=eps, layer_start=2)
    r_max, content = 4, T - 4  # L = T - r_max content tokens
    alpha = {}
    for setting in ("with", "without"):
        probe.pass_label = f"{setting}-bos-r1"
        for layer in range(L):
            sink = rng.uniform(-1.0, 4.0, size=H)
            w = _weights(rng, B, H, T, sink)  # (B, H, T, T)
            alpha[setting, layer] = w[..., 0].mean(-1)  # (B, H): mean over queries t >= 0 of a_t0
            for part in (slice(0, 2), slice(2, B)):  # two batches
                record = AttentionRecord(layer, None, None, None, 1.0, None, torch.from_numpy(w[part]).float())
                probe.attention(layer, record)
        probe.pass_label = f"{setting}-bos-r2"  # a record on an r > 1 pass is not counted
        probe.attention(0, AttentionRecord(0, None, None, None, 1.0, None, torch.ones(B, H, T, T)))
    losses = {}
    for label in probe.passes():
        probe.pass_label = label
        setting, r = label.split("-bos-r")
        length = int(r) + content - (0 if setting == "with" else 1)  # tokens of the pass
        value = rng.uniform(0.5, 5.0, size=(B, length - 1))  # (B, T' - 1): loss predicting token i + 1
        losses[setting, int(r)] = value[:, -(content - 1):].mean()  # the targets K[1:] are the last L - 1 tokens
        probe.loss(None, torch.from_numpy(value[:2]).float())
        probe.loss(None, torch.from_numpy(value[2:]).float())
    rows = probe.rows()
    for setting in ("with", "without"):
        hits = np.stack([(alpha[setting, layer] > eps).mean(0) for layer in range(L)])  # (L, H)
        sink = {(r.layer, r.head): r.value for r in rows if r.metric == "bos_sink_rate"
                and dict(r.conditions)["bos"] == setting}
        for layer in range(L):
            np.testing.assert_allclose([sink[layer, h] for h in range(H)], hits[layer], rtol=1e-12)
            assert sink[layer, None] == pytest.approx(hits[layer].mean(), rel=1e-12)
        assert sink[None, None] == pytest.approx(hits.mean(), rel=1e-12)
        late = one_row(rows, "bos_sink_rate_from_layer", bos=setting, layer_start=2)
        assert late.value == pytest.approx(hits[2:].mean(), rel=1e-12)
        for r in (1, 2, 4):
            loss = one_row(rows, "bos_repeat_loss", bos=setting, repeat=r)
            delta = one_row(rows, "bos_repeat_loss_delta", bos=setting, repeat=r)
            assert loss.value == pytest.approx(losses[setting, r], rel=1e-6)  # float32 losses
            assert delta.value == pytest.approx(losses[setting, r] - losses[setting, 1], rel=1e-5, abs=1e-6)
            assert loss.n == B * (content - 1)
    assert 0 < hits.mean() < 1  # the construction has heads on both sides of eps


def test_without_a_bos_id_only_the_without_setting_runs():
    probe = BosExperiment(make_spec(), repeats=(1, 2))
    assert probe.passes() == ("without-bos-r1", "without-bos-r2")
    ids = torch.arange(6).reshape(1, 6)  # (B, T)
    probe.pass_label = "without-bos-r2"
    assert probe.pass_inputs(ids).tolist() == [[1, 1, 2, 3, 4]]  # K = [1, 2, 3, 4]
    assert probe.rows() == []  # nothing measured


def test_bos_windows_too_short_for_the_repeats_are_one_sentence():
    probe = BosExperiment(make_spec(), repeats=(1, 8))
    probe.pass_label = "without-bos-r8"
    with pytest.raises(SinkscopeError) as error:
        probe.pass_inputs(torch.zeros(1, 9, dtype=torch.int64))  # (B, T): T - r_max = 1 < 2
    assert_one_sentence(error)
    assert probe.content(torch.zeros(1, 10, dtype=torch.int64)).shape == (1, 2)


@pytest.mark.parametrize("params", [{"repeats": (2, 4)}, {"repeats": (1, 0)}, {"repeats": ("x",)},
                                    {"epsilon": 1.0}, {"epsilon": 0.0}, {"layer_start": -1}, {"bos_id": "bos"}])
def test_bos_bad_parameters_are_one_sentence(params):
    with pytest.raises(SinkscopeError) as error:
        BosExperiment(make_spec(), **params)
    assert_one_sentence(error)


def test_bos_experiment_merges_rolls_back_and_restores_its_own_state():
    rng = np.random.default_rng(13)
    B, H, T = 4, 4, 8
    records = {(s, layer): _weights(rng, B, H, T, rng.uniform(-1.0, 4.0, size=H)) for s in ("with", "without")
               for layer in range(3)}  # (B, H, T, T) each
    losses = {label: rng.uniform(1.0, 3.0, size=(B, 6)) for label in ("with-bos-r1", "with-bos-r2",
                                                                      "without-bos-r1", "without-bos-r2")}

    def feed(probe, part):
        for label, value in losses.items():
            probe.pass_label = label
            probe.loss(None, torch.from_numpy(value[part]))  # (b, T' - 1)
            setting, r = label.split("-bos-r")
            if r == "1":
                for layer in range(3):
                    w = torch.from_numpy(records[setting, layer][part]).float()  # (b, H, T, T)
                    probe.attention(layer, AttentionRecord(layer, None, None, None, 1.0, None, w))

    def make():
        return BosExperiment(make_spec(), bos_id=0, repeats=(1, 2))

    whole, first, second = make(), make(), make()
    feed(whole, slice(0, B))
    feed(first, slice(0, 1))
    feed(second, slice(1, B))
    first.merge(second)
    key = lambda r: (r.metric, r.layer, r.head, r.conditions, r.n)  # noqa: E731
    assert [key(r) for r in first.rows()] == [key(r) for r in whole.rows()]
    np.testing.assert_allclose([r.value for r in first.rows()], [r.value for r in whole.rows()], rtol=1e-12)
    saved = whole.snapshot()
    feed(whole, slice(0, 2))  # a batch that is rolled back
    whole.restore(saved)
    np.testing.assert_allclose([r.value for r in whole.rows()], [r.value for r in first.rows()], rtol=1e-12)
    loaded = make()
    loaded.load_state_dict(whole.state_dict())
    assert [key(r) for r in loaded.rows()] == [key(r) for r in whole.rows()]
    np.testing.assert_allclose([r.value for r in loaded.rows()], [r.value for r in whole.rows()], rtol=1e-12)
