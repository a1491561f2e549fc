"""``probes/loss_change.py``: the clean / changed loss block of a second stage and the first stage's clean sum.

Small probe classes defined here (not registered, so the global probe registry is untouched) mix
in :class:`LossChange` and :class:`CleanLossSum` exactly as ``head_ablation`` and
``massive_topk`` do, and are fed ``loss`` values (B, T-1) directly on the clean (None) and changed
passes. The reference is numpy float64: loss_clean and loss_changed are the means of every fed
value of their pass, loss_delta their difference (SPEC.md "The loss change of a second stage"),
with the first stage's ``clean_sum`` / ``clean_n`` replacing the clean pass when given.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinkscope.capture import hooks
from sinkscope.capture.families import ModelSpec
from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import Probe
from sinkscope.probes.loss_change import CLEAN_LOSS_PARAM, CLEAN_PARAMS, CleanLossSum, LossChange

SPEC = ModelSpec(family="test", n_layers=2, n_heads=2, n_kv_heads=2, head_dim=4, hidden_size=8,
                 attention_layers=(0, 1), has_phantom=False, has_output_gate=False)


class SecondStage(LossChange):
    """A second-stage probe that changes something (the ``changes`` class attribute says whether)."""

    name = "test_second_stage"
    params = CLEAN_PARAMS
    changed_pass = "ablated"
    changes = True

    def setup(self) -> None:
        self.setup_loss(type(self).changes)


class NothingChanged(SecondStage):
    changes = False


class FirstStage(CleanLossSum, Probe):
    """A first-stage probe that also reads attention (so the loss is one observer among others)."""

    name = "test_first_stage"
    params = (CLEAN_LOSS_PARAM,)
    observers = {hooks.ATTN: "attention", hooks.LOSS: "clean_loss_seen"}

    def setup(self) -> None:
        self.setup_clean_loss()


def _feed(probe: Probe, label: str | None, batches: list[np.ndarray]) -> None:
    probe.pass_label = label
    for value in batches:
        probe.loss(None, torch.from_numpy(value))  # (B, T-1)


def _losses(rng, shape=(3, 7)) -> list[np.ndarray]:
    return [rng.uniform(0.1, 6.0, size=shape).astype(np.float32) for _ in range(2)]  # two batches of (B, T-1)


def test_passes_depend_on_what_changes_and_whether_the_clean_loss_was_given():
    assert SecondStage(SPEC).passes() == (None, "ablated")
    assert SecondStage(SPEC, clean_sum=3.0, clean_n=2).passes() == ("ablated",)
    assert NothingChanged(SPEC).passes() == (None,)
    assert NothingChanged(SPEC, clean_sum=3.0, clean_n=2).passes() == ()
    assert SecondStage(SPEC).clean_given is False and SecondStage(SPEC, clean_sum=0.0).clean_given is True
    assert SecondStage.attention_function is True  # both stages run sinkscope's attention function


def test_clean_and_changed_losses_are_the_means_of_their_passes():
    rng = np.random.default_rng(0)
    clean, changed = _losses(rng), _losses(rng)
    probe = SecondStage(SPEC)
    _feed(probe, None, clean[:1])
    _feed(probe, "ablated", changed[:1])  # passes interleave per batch, as the runner runs them
    _feed(probe, None, clean[1:])
    _feed(probe, "ablated", changed[1:])
    got_clean, got_changed, n = probe.losses()
    want_clean = np.concatenate([c.astype(np.float64).ravel() for c in clean]).mean()
    want_changed = np.concatenate([c.astype(np.float64).ravel() for c in changed]).mean()
    assert got_clean == pytest.approx(want_clean, rel=1e-12)
    assert got_changed == pytest.approx(want_changed, rel=1e-12)
    assert n == sum(c.shape[0] for c in clean)  # the windows (SPEC.md "Tables")
    assert got_changed - got_clean == pytest.approx(want_changed - want_clean, rel=1e-10)


def test_the_sums_are_float64_even_for_float32_losses():
    big = np.array([[16777216.0, 1.0, 1.0, 1.0]], dtype=np.float32)  # (B, T-1): 2^24 + 1 is not a float32
    probe = SecondStage(SPEC)
    _feed(probe, None, [big])
    assert float(big.sum(dtype=np.float32)) == 16777216.0  # float32 summation would lose the ones
    assert probe.losses()[0] == (2.0 ** 24 + 3) / 4


def test_a_given_clean_loss_replaces_the_clean_pass():
    rng = np.random.default_rng(1)
    changed = _losses(rng)
    probe = SecondStage(SPEC, clean_sum=120.5, clean_n=40, clean_windows=5)
    _feed(probe, "ablated", changed)
    clean, got_changed, n = probe.losses()
    assert (clean, n) == (120.5 / 40, 5)  # n: the first stage's windows
    assert got_changed == pytest.approx(np.concatenate([c.astype(np.float64).ravel() for c in changed]).mean(),
                                        rel=1e-12)


def test_nothing_changed_gives_the_clean_loss_twice_and_nothing_measured_gives_nan():
    rng = np.random.default_rng(2)
    clean = _losses(rng)
    probe = NothingChanged(SPEC)
    _feed(probe, None, clean)
    got_clean, got_changed, n = probe.losses()
    assert got_changed == got_clean == pytest.approx(np.concatenate([c.astype(np.float64).ravel()
                                                                     for c in clean]).mean(), rel=1e-12)
    empty_clean, empty_changed, empty_n = SecondStage(SPEC).losses()
    assert empty_n == 0 and math.isnan(empty_clean) and math.isnan(empty_changed)


def test_shares_merge_and_roll_back_like_one_probe():
    rng = np.random.default_rng(3)
    clean, changed = _losses(rng), _losses(rng)
    whole, first, second = SecondStage(SPEC), SecondStage(SPEC), SecondStage(SPEC)
    for probe, part in ((whole, slice(0, 2)), (first, slice(0, 1)), (second, slice(1, 2))):
        _feed(probe, None, clean[part])
        _feed(probe, "ablated", changed[part])
    first.merge(second)
    assert first.losses() == pytest.approx(whole.losses(), rel=1e-12)
    saved = whole.snapshot()
    _feed(whole, None, [np.full((2, 3), 99.0, dtype=np.float32)])  # a batch that is then rolled back
    whole.restore(saved)
    assert whole.losses() == pytest.approx(first.losses(), rel=1e-12)


@pytest.mark.parametrize("params", [{"clean_n": -1}, {"clean_sum": "lots"}, {"clean_n": 2.5}, {"clean_summ": 1.0}])
def test_bad_parameters_are_one_sentence(params):
    with pytest.raises(SinkscopeError) as error:
        SecondStage(SPEC, **params)
    message = str(error.value)
    assert "\n" not in message and message.endswith("."), message


def test_the_first_stage_sums_the_clean_loss_only_when_asked():
    rng = np.random.default_rng(4)
    clean = _losses(rng, shape=(2, 5))
    quiet = FirstStage(SPEC)
    assert quiet.attention_function is False
    assert set(quiet.pass_observers(None)) == {hooks.ATTN}  # no loss read: no logits beyond the last position's
    probe = FirstStage(SPEC, clean_loss=True)
    assert probe.attention_function is True
    assert set(probe.pass_observers(None)) == {hooks.ATTN, hooks.LOSS}
    for value in clean:
        probe.clean_loss_seen(None, torch.from_numpy(value))  # (B, T-1)
    params = probe.clean_loss_params()
    assert params["clean_n"] == sum(c.size for c in clean)
    assert params["clean_windows"] == sum(c.shape[0] for c in clean)
    assert params["clean_sum"] == pytest.approx(sum(c.astype(np.float64).sum() for c in clean), rel=1e-12)
    # handed to a second stage, the clean loss is the first stage's mean
    second = SecondStage(SPEC, **params)
    assert second.passes() == ("ablated",)
    assert second.losses()[0] == pytest.approx(np.concatenate([c.astype(np.float64).ravel()
                                                               for c in clean]).mean(), rel=1e-12)
