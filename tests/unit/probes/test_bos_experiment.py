"""The ``bos_experiment`` probe (``probes/bos_experiment.py``), fed synthetic attention weights and
losses.

Built on a hand-written ``ModelSpec`` and given hook values of the documented shapes directly,
in more than one batch so the streaming sums are exercised. The reference is an independent
numpy float64 computation of each formula in the module docstring and SPEC.md "The position-zero
circuit": Sink_0^eps from explicit softmax weights, and the passes' inputs and kept targets
built from Python lists.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.errors import SinkscopeError
from sinkscope.errors import check_repeats
from sinkscope.probes.bos_experiment import BosExperiment
from probe_helpers import assert_one_sentence, make_spec, one_row


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
            assert loss.n == B  # the windows (SPEC.md "Tables")
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


def test_bos_repeats_are_checked_by_the_probe():
    """The probe owns the check; ``sinkscope circuit --repeats`` reuses the same phrases."""
    assert check_repeats((1, 2, 4, 8)) is None and check_repeats(("1", 3)) is None
    assert check_repeats(("x",)) == "takes positive integers such as 1,2,4,8"
    including = "takes positive integers including 1 (the reference), such as 1,2,4,8"
    assert check_repeats(()) == check_repeats((2, 4)) == check_repeats((1, 0)) == including
