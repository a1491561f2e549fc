"""``HeadImportance`` (probes/head_importance.py) against a float64 numpy reference on synthetic records.

Checked: the implicit gate G_i = 1 - A_sink,i for every sink set, from the reference's a_ij
(phantom in the normaliser): ``first`` 1 - a_i0 (a phantom outside the set counts as active),
``phantom`` 1 - phi_i, ``first+phantom`` 1 - a_i0 - phi_i, and ``auto`` resolving to the model's
own; ``implicit_gate`` and ``head_importance`` = mean of G over queries i >= 1 and windows (a
one-token window keeps its only query), on explicit records, fused ones (the LSE form) and the
eager fallback's weights-only records; on a sliding-window layer ``first`` gives G = 1 to the
queries past the window (both paths, -inf and float32-minimum masks); with an output gate
``head_importance`` is the head's mean gate over its D channels instead; ``load_imbalance`` =
population std / mean of Imp over a layer's heads (model row: the mean over layers);
``dormant`` = Imp < dormant_below (layer row: the share of heads; model row: the mean of those
shares) and ``dormant_heads``; the data-driven set (Fu et al. 2026 §6.2: alpha_j over the queries
i >= max(j, 1) that see j above ``sink_attention`` and ||v_j|| below ``sink_value_ratio`` times
the lower median norm) with its ``sink_keys`` rows; ``clean_loss`` summing the loss; the options;
and the refusals (a phantom set without a phantom, the data set on weights-only records).

Reference: synthetic_attention.make_layer's numpy softmax (docs/SPEC.md "Implicit gate and
head importance"), with CV, dormancy and the data set written out in numpy here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.probes.head_importance import HeadImportance
from synthetic_attention import Expected, assert_rows, expected_means, make_layer, spec


def _gate(layer, sink_set: str) -> np.ndarray:
    """G_i (B, H, T) of a fixed sink set from the reference's a_ij and phi_i."""
    G = np.ones_like(layer.phi)
    if sink_set in ("first", "first+phantom"):
        G = G - layer.a[..., 0]
    if sink_set in ("phantom", "first+phantom"):
        G = G - layer.phi
    return G


def _imbalance_and_dormant(imp: dict[int, np.ndarray], windows: int, below: float) -> dict[str, dict]:
    """Expected ``load_imbalance`` and ``dormant`` rows from Imp per layer (H,) over ``windows`` windows.

    ``n`` (SPEC.md "Tables"): the heads for a statistic over heads (the CV, a share of heads), the
    windows on a dormant head's row.
    """
    cv_rows, dormant_rows, cvs, shares = {}, {}, [], []
    for layer, heads in sorted(imp.items()):
        H = len(heads)
        cvs.append(float(np.std(heads) / max(np.mean(heads), 1e-12)))  # population std
        cv_rows[(layer, None)] = Expected(cvs[-1], H)
        flags = (heads < below).astype(np.float64)
        for h, flag in enumerate(flags):
            dormant_rows[(layer, h)] = Expected(float(flag), windows)
        shares.append(float(flags.mean()))
        dormant_rows[(layer, None)] = Expected(shares[-1], H)
    total = sum(len(h) for h in imp.values())
    cv_rows[(None, None)] = Expected(float(np.mean(cvs)), total)
    dormant_rows[(None, None)] = Expected(float(np.mean(shares)), total)
    return {"load_imbalance": cv_rows, "dormant": dormant_rows}


def _check(rows, items: dict[int, np.ndarray], below: float, *, importance: dict[int, np.ndarray] | None = None):
    """implicit_gate from ``items`` (B, H, N); head_importance, load_imbalance, dormant from ``importance``."""
    importance = items if importance is None else importance
    assert_rows(rows, "implicit_gate", expected_means(items))
    assert_rows(rows, "head_importance", expected_means(importance))
    B = next(iter(importance.values())).shape[0]
    imp = {l: x.mean(axis=(0, 2)) for l, x in importance.items()}
    for metric, expected in _imbalance_and_dormant(imp, B, below).items():
        assert_rows(rows, metric, expected, check_se=False)


def _threshold_between(values: np.ndarray) -> float:
    """A dormancy threshold halfway between the two middle head importances (some heads on each side)."""
    v = np.sort(values.ravel())
    mid = len(v) // 2
    assert v[mid] - v[mid - 1] > 1e-4
    return float((v[mid - 1] + v[mid]) / 2)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("sink, sink_set", [(None, "auto"), (None, "first"), ("head", "auto"), ("head", "first"),
                                            ("head", "phantom"), ("head", "first+phantom"),
                                            ("query", "phantom"), ("query", "first+phantom")])
def test_fixed_sink_sets(fused, sink, sink_set):
    model = spec(n_layers=2, has_phantom=sink is not None)
    resolved = sink_set if sink_set != "auto" else ("phantom" if sink else "first")
    layers = {l: make_layer(l, sink=sink, fused=fused, seed=500 + l) for l in range(2)}
    items = {l: _gate(x, resolved)[:, :, 1:] for l, x in layers.items()}  # (B, H, T - 1)
    below = _threshold_between(np.stack([x.mean(axis=(0, 2)) for x in items.values()]))
    probe = HeadImportance(model, sink_set=sink_set, dormant_below=below)
    assert probe.sink_set == resolved
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    rows = probe.rows()
    _check(rows, items, below)
    imp = {l: x.mean(axis=(0, 2)) for l, x in items.items()}
    assert probe.dormant_heads() == [(l, h) for l in sorted(imp) for h in range(len(imp[l])) if imp[l][h] < below]
    assert probe.dormant_heads()  # the threshold splits the heads


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("sink_set", ["phantom", "first+phantom"])
def test_a_layer_without_the_phantom_of_a_phantom_model(fused, sink_set):
    """MiMo-like: layer 1 of a model with a phantom has none; its phantom mass is 0 (G = 1 for ``phantom``)."""
    layers = {0: make_layer(0, sink="head", fused=fused, seed=590), 1: make_layer(1, fused=fused, seed=591)}
    probe = HeadImportance(spec(n_layers=2, has_phantom=True), sink_set=sink_set)
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    items = {l: _gate(x, sink_set)[:, :, 1:] for l, x in layers.items()}
    if sink_set == "phantom":
        assert np.all(items[1] == 1.0)
    _check(probe.rows(), items, 0.1)


def test_first_is_one_minus_p0_mass_without_a_phantom():
    """Vanilla attention: G_i = 1 - w_i0, so implicit_gate = 1 - p0_mass on the same windows."""
    layer = make_layer(0, seed=510)
    probe = HeadImportance(spec(n_layers=1))
    probe.attention(0, layer.record)
    w0 = layer.w[..., 0][:, :, 1:]  # (B, H, T - 1)
    assert_rows(probe.rows(), "implicit_gate", expected_means({0: 1.0 - w0}))


def test_weights_only_records():
    layers = {l: make_layer(l, weights_only=True, seed=520 + l) for l in range(2)}
    probe = HeadImportance(spec(n_layers=2))
    for l, layer in layers.items():
        probe.attention(l, layer.record)
    _check(probe.rows(), {l: _gate(x, "first")[:, :, 1:] for l, x in layers.items()}, 0.1)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("mask", ["inf", "min"])
def test_sliding_window_first_gives_one_past_the_window(fused, mask):
    W = 4
    layer = make_layer(0, window=W, mask=mask, fused=fused, sink="head", seed=530)
    probe = HeadImportance(spec(n_layers=1, has_phantom=True), sink_set="first")
    probe.attention(0, layer.record)
    G = _gate(layer, "first")  # (B, H, T)
    assert np.all(G[:, :, W:] == 1.0)  # key 0 hidden: nothing in the sink set
    _check(probe.rows(), {0: G[:, :, 1:]}, 0.1)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_one_token_window_keeps_its_only_query(fused):
    layer = make_layer(0, T=1, sink="head", fused=fused, seed=540)
    probe = HeadImportance(spec(n_layers=1, has_phantom=True), sink_set="first+phantom")
    probe.attention(0, layer.record)
    G = _gate(layer, "first+phantom")  # (B, H, 1): 1 - a_00 - phi_0 = 0
    np.testing.assert_allclose(G, 0.0, atol=1e-12)
    assert_rows(probe.rows(), "implicit_gate", expected_means({0: G}), tol=1e-5)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_output_gate_is_the_importance(fused):
    B, T, H, D = 3, 10, 4, 8
    rng = np.random.default_rng(550)
    probe = HeadImportance(spec(n_layers=2, n_heads=H, head_dim=D, has_output_gate=True), dormant_below=0.3)
    assert probe.gate == "output" and probe.options()["gate"] == "output"
    implicit, output = {}, {}
    for l in range(2):
        o = (1.0 / (1.0 + np.exp(-rng.normal(size=(B, T, H, D)) - np.linspace(-2, 1, H)[:, None])))
        o = o.astype(np.float32).astype(np.float64)  # (B, T, H, D)
        layer = make_layer(l, B=B, H=H, T=T, D=D, fused=fused, seed=560 + l, output_gate=torch.from_numpy(o).float())
        probe.attention(l, layer.record)
        implicit[l] = _gate(layer, "first")[:, :, 1:]
        output[l] = o.mean(-1).transpose(0, 2, 1)[:, :, 1:]  # (B, H, T - 1): mean over the D gates
    _check(probe.rows(), implicit, 0.3, importance=output)


def _data_reference(layer, attention_above: float, value_ratio: float, phantom: bool):
    """Fu et al. 2026 §6.2's set in numpy: (G (B, H, T), keys per window and head (B, H))."""
    a = layer.a  # (B, H, T, S)
    T, S = a.shape[-2:]
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    counted = layer.visible & (i >= 1) & (i >= j)  # (T, S): queries i >= max(j, 1) that see j
    seen = counted.sum(0)  # (S,)
    alpha = (a * counted).sum(-2) / np.maximum(seen, 1)  # (B, H, S)
    norms = np.repeat(np.linalg.norm(layer.v, axis=-1), layer.groups, axis=1)  # (B, H, S)
    lower_median = np.sort(norms, axis=-1)[..., (S - 1) // 2][..., None]  # (B, H, 1)
    enough = seen >= min(16, max(1, -(-seen.max() // 2)))  # (S,): scored by 16 queries, or half the most
    keys = (alpha > attention_above) & enough & (norms < value_ratio * lower_median)  # (B, H, S)
    G = 1.0 - (a * keys[:, :, None, :]).sum(-1)
    if phantom:
        G = G - layer.phi
    return G, keys.sum(-1).astype(np.float64)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
@pytest.mark.parametrize("sink", [None, "head"])
@pytest.mark.parametrize("window", [None, 5])
def test_data_driven_sink_set(fused, sink, window):
    above, ratio = 0.3, 0.5
    probe = HeadImportance(spec(n_layers=2, has_phantom=sink is not None), sink_set="data",
                           sink_attention=above, sink_value_ratio=ratio)
    assert {"sink_attention", "sink_value_ratio"} <= set(probe.options())
    gates, keys = {}, {}
    for l in range(2):
        layer = make_layer(l, B=4, sink=sink, fused=fused, window=window, seed=570 + l)
        layer.v[:, :, 0] *= 0.1  # a quiet sink value at key 0, in both the reference and the record
        layer.record.value[:, :, 0] *= 0.1
        probe.attention(l, layer.record)
        G, n_keys = _data_reference(layer, above, ratio, phantom=sink is not None)
        gates[l], keys[l] = G[:, :, 1:], n_keys[:, :, None]
    assert 0.0 < np.mean([k.mean() for k in keys.values()]) < 2.0  # a strong head's key 0 is in the set
    rows = probe.rows()
    _check(rows, gates, 0.1)
    assert_rows(rows, "sink_keys", expected_means(keys))


def test_clean_loss_is_summed_when_asked():
    probe = HeadImportance(spec(n_layers=1), clean_loss=True)
    losses = [torch.rand(3, 11), torch.rand(2, 11)]
    for loss in losses:
        probe.clean_loss_seen(None, loss)
    params = probe.clean_loss_params()
    assert params["clean_n"] == 55
    assert math.isclose(params["clean_sum"], float(sum(x.double().sum() for x in losses)), rel_tol=1e-12)


def test_options_and_refusals():
    options = HeadImportance(spec(n_layers=1)).options()
    assert options["sink_set"] == "first" and options["gate"] == "implicit"
    assert "sink_attention" not in options and "sink_value_ratio" not in options
    for sink_set in ("phantom", "first+phantom"):
        with pytest.raises(SinkscopeError, match="phantom"):
            HeadImportance(spec(n_layers=1), sink_set=sink_set)
    with pytest.raises(SinkscopeError):
        HeadImportance(spec(n_layers=1), sink_set="last")
    with pytest.raises(SinkscopeError):
        HeadImportance(spec(n_layers=1), dormant_below=1.5)
    probe = HeadImportance(spec(n_layers=1), sink_set="data")
    with pytest.raises(SinkscopeError, match="value vectors"):
        probe.attention(0, make_layer(0, weights_only=True, seed=580).record)
    assert HeadImportance(spec(n_layers=1)).rows() == []  # nothing seen: no rows, no imbalance
