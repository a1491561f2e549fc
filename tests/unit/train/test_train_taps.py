"""How the trainer's model hands over its hook points (src/sinkscope/train/taps.py).

``emit`` and ``replace`` on made-up tensors, the older ``Tap`` seen through ``TapHooks``, and one
forward pass of a tiny ``GPT`` with a hook sink of the shape ``capture.hooks.HookSink`` declares.
"""

from __future__ import annotations

import pytest
import torch

from sinkscope.capture import hooks as hp
from sinkscope.train import taps
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT


class Sink:
    """A minimal ``hp.HookSink``: records what it observes, doubles what it intervenes on."""

    def __init__(self, observed=(), intervened=()):
        self.observed, self.intervened = frozenset(observed), frozenset(intervened)
        self.seen: list[tuple[str, int | None, torch.Tensor]] = []

    def emit(self, template, layer, value):
        self.seen.append((template, layer, value))

    def replace(self, template, layer, value):
        return value * 2


def test_emit_hands_over_a_detached_value_only_where_observed():
    value = torch.ones(2, 3, requires_grad=True)
    taps.emit(None, hp.RESID_PRE, 0, value)  # no sink: nothing to do
    sink = Sink(observed={hp.RESID_PRE})
    taps.emit(sink, hp.RESID_MID, 0, value)
    taps.emit(sink, hp.RESID_PRE, 1, value)
    assert [(t, layer) for t, layer, _ in sink.seen] == [(hp.RESID_PRE, 1)]
    assert not sink.seen[0][2].requires_grad


def test_replace_keeps_shape_and_dtype_and_passes_through_where_not_intervened():
    value = torch.ones(2, 3, dtype=torch.float16)
    assert taps.replace(None, hp.RESID_POST, 0, value) is value
    assert taps.replace(Sink(), hp.RESID_POST, 0, value) is value
    replaced = taps.replace(Sink(intervened={hp.RESID_POST}), hp.RESID_POST, 0, value)
    assert replaced.dtype == torch.float16 and torch.equal(replaced, value * 2)

    class Wrong(Sink):
        def replace(self, template, layer, value):
            return value[:1]

    with pytest.raises(ValueError, match=r"a blocks.\{l\}.hook_resid_post replacement must keep the shape \(2, 3\)"):
        taps.replace(Wrong(intervened={hp.RESID_POST}), hp.RESID_POST, 0, value)


def test_a_tap_sees_records_and_the_residual_stream():
    class Tap:
        def __init__(self):
            self.records, self.residuals = [], []

        def on_attention(self, record):
            self.records.append(record.layer)

        def on_residual(self, layer, hidden):
            self.residuals.append((layer, tuple(hidden.shape)))

    tap = Tap()
    hooks = taps.TapHooks(tap)
    assert hooks.observed == {hp.ATTN, hp.RESID_POST} and not hooks.intervened
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16))
    idx = torch.randint(0, 16, (3, 8))  # (B, T)
    with torch.no_grad():
        model(idx, tap=tap)
    assert tap.records == [0, 1] and tap.residuals == [(0, (3, 8, 16)), (1, (3, 8, 16))]


def test_the_model_emits_and_replaces_through_a_hook_sink():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=2, n_head=2, n_embd=16))
    idx = torch.randint(0, 16, (3, 8))  # (B, T)
    with torch.no_grad():
        plain, _ = model(idx)
        sink = Sink(observed={hp.RESID_PRE, hp.MLP_PRE, hp.ATTN_Z})
        same, _ = model(idx, hooks=sink)
        doubled, _ = model(idx, hooks=Sink(intervened={hp.RESID_POST}))
    torch.testing.assert_close(same, plain)
    assert [(t, layer, tuple(v.shape)) for t, layer, v in sink.seen] == [
        (hp.RESID_PRE, 0, (3, 8, 16)), (hp.ATTN_Z, 0, (3, 8, 2, 8)), (hp.MLP_PRE, 0, (3, 8, 64)),
        (hp.RESID_PRE, 1, (3, 8, 16)), (hp.ATTN_Z, 1, (3, 8, 2, 8)), (hp.MLP_PRE, 1, (3, 8, 64))]
    assert not torch.allclose(doubled, plain)
