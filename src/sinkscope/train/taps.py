"""How the trainer's model hands its named hook points to a :class:`~sinkscope.capture.hooks.HookSink`.

``GPT.forward(hooks=...)`` takes any hook sink (``capture/hooks.py``): the model calls
:func:`emit` at each observable point and :func:`replace` at each intervenable one, so a point
that no sink asked for costs nothing. ``GPT.forward(tap=...)`` takes the older :class:`Tap`
(one :class:`~sinkscope.capture.record.AttentionRecord` per layer, each block's output stream),
seen as a hook sink through :class:`TapHooks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from sinkscope.capture import hooks as hp

if TYPE_CHECKING:
    from torch import Tensor

    from sinkscope.capture.record import AttentionRecord


class Tap(Protocol):
    """What receives the model's records (the runner's probe dispatcher)."""

    def on_attention(self, record: AttentionRecord) -> None: ...

    def on_residual(self, layer: int, hidden: Tensor) -> None: ...


class TapHooks:
    """A :class:`Tap` (``on_attention``/``on_residual``) seen as a hook sink of records and resid_post."""

    observed = frozenset({hp.ATTN, hp.RESID_POST})
    intervened = frozenset()

    def __init__(self, tap: Tap):
        self.tap = tap

    def emit(self, template: str, layer: int | None, value) -> None:
        if template == hp.ATTN:
            self.tap.on_attention(value)
        else:
            self.tap.on_residual(layer, value)

    def replace(self, template: str, layer: int, value: Tensor) -> Tensor:
        return value


def emit(hooks: hp.HookSink | None, template: str, layer: int | None, value: Tensor) -> None:
    """Hand ``value`` (detached) to ``hooks`` if it observes ``template``."""
    if hooks is not None and template in hooks.observed:
        hooks.emit(template, layer, value.detach())


def replace(hooks: hp.HookSink | None, template: str, layer: int, value: Tensor) -> Tensor:
    """The value ``hooks`` puts in place of ``value`` at an intervenable point (``value`` itself if none)."""
    if hooks is not None and template in hooks.intervened:
        replaced = hooks.replace(template, layer, value)
        if tuple(replaced.shape) != tuple(value.shape):
            raise ValueError(f"a {template} replacement must keep the shape {tuple(value.shape)}")
        return replaced.to(value.dtype)
    return value
