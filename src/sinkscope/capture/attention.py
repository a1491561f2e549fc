"""Observe a transformers model's attention through its own attention interface.

We register one function, ``"sinkscope"``, in transformers' ``AttentionInterface`` *and* its
``AttentionMaskInterface`` (without the mask registration ``masking_utils`` builds no mask for
an unknown implementation name and the model silently runs unmasked). The function calls the
family's own ``eager_attention_forward`` (so GQA, gpt-oss sinks, GPT-2's scaling, sliding
windows are all exactly the model's), returns its result unchanged, and hands an
:class:`~sinkscope.capture.record.AttentionRecord` to the active :class:`Tap`.

Two implementations are registered. ``"sinkscope"`` (explicit, the reference) runs the
family's eager attention and hands over its weights. ``"sinkscope_fused"`` (the default for
runs) computes the same attention with a fused kernel that also returns each row's log-sum-exp
(``kernels.py``), so nothing quadratic in the sequence length is kept; its mask comes from
transformers' ``sdpa_mask`` (None for plain causal layers). Both give the probes the same
numbers (tests: 1e-5 on every family).

Use them only through :func:`capture`, a context manager that switches the model to the
chosen implementation, installs the few forward hooks a family needs (output gates,
residual stream), and restores everything on exit. Outside the context the registered function
is inert: with no active tap it is the family's eager attention.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from typing import Callable, Iterator, Protocol

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

from sinkscope.capture.families import Family, ModelSpec, family_of, get_submodule
from sinkscope.capture.kernels import attention_with_lse
from sinkscope.capture.record import AttentionRecord

IMPLEMENTATION = "sinkscope"
FUSED_IMPLEMENTATION = "sinkscope_fused"
MODES = {"explicit": IMPLEMENTATION, "fused": FUSED_IMPLEMENTATION}


class Tap(Protocol):
    """What receives the captured tensors (the runner's probe dispatcher)."""

    def on_attention(self, record: AttentionRecord) -> None: ...

    def on_residual(self, layer: int, hidden: Tensor) -> None: ...


_ACTIVE_TAP: contextvars.ContextVar["_ActiveCapture | None"] = contextvars.ContextVar(
    "sinkscope_active_capture", default=None
)


class _ActiveCapture:
    """Per-``capture`` state: the tap and output gates waiting for their layer's attention."""

    def __init__(self, tap: Tap, spec: ModelSpec):
        self.tap = tap
        self.spec = spec
        self.pending_gates: dict[int, Tensor] = {}


def _family_eager(module: nn.Module) -> Callable:
    """The ``eager_attention_forward`` defined in the module's own modeling file."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise RuntimeError(f"{type(module).__name__} has no eager_attention_forward to observe")
    return eager


def sinkscope_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """The registered attention function: the family's eager attention, observed.

    Shapes: query (B, H, T, D), key/value (B, Hkv, S, D), mask (B, 1, T, S);
    returns the eager function's (out (B, T, H, D), weights (B, H, T, S)) unchanged.
    """
    out, weights = _family_eager(module)(module, query, key, value, attention_mask, **kwargs)
    active = _ACTIVE_TAP.get()
    if active is not None:
        layer = module.layer_idx
        mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
        sinks = getattr(module, "sinks", None)
        record = AttentionRecord(
            layer=layer,
            query=query,
            key=key,
            value=value,
            scale=_scale(query, kwargs),
            mask=mask,
            weights=weights.float(),
            sliding_window=kwargs.get("sliding_window") or getattr(module, "sliding_window", None),
            sink_logits=sinks.detach() if isinstance(sinks, Tensor) else None,
            output_gate=active.pending_gates.pop(layer, None),
        )
        active.tap.on_attention(record)
    return out, weights


def _scale(query: Tensor, kwargs: dict) -> float:
    scale = kwargs.get("scaling")
    return float(query.shape[-1] ** -0.5 if scale is None else scale)  # GPT-2 / Gemma eager default


def sinkscope_fused_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs,
) -> tuple[Tensor, None]:
    """The fused registered function: same attention, rows summarised by their log-sum-exp.

    A learned phantom (gpt-oss ``sinks``) is applied exactly: the real-key output is scaled by
    1 - phi_i with phi_i = sigmoid(b_h - LSE_i), which is what a softmax over [s_i., b_h]
    followed by dropping the sink column computes. Shapes as for the explicit function;
    the weights returned are None (nothing quadratic is kept). Families with logit
    soft-capping fall back to the explicit function.
    """
    if kwargs.get("softcap") is not None:
        mask = None if attention_mask is None else _additive(attention_mask, query.dtype)
        return sinkscope_attention(module, query, key, value, mask, **kwargs)
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, dim=1) if groups > 1 else key  # (B, H, S, D)
    v = value.repeat_interleave(groups, dim=1) if groups > 1 else value  # (B, H, S, D)
    S = key.shape[-2]
    mask = None if attention_mask is None else _additive(attention_mask[:, :, :, :S], query.dtype)
    scale = _scale(query, kwargs)
    out, lse = attention_with_lse(query, k, v, scale, mask)  # (B, H, T, D), (B, H, T)
    sinks = getattr(module, "sinks", None)
    if isinstance(sinks, Tensor):
        phi = torch.sigmoid(sinks.float().view(1, -1, 1) - lse)  # (B, H, T)
        out = out * (1 - phi).unsqueeze(-1).to(out.dtype)  # drop the phantom's share
    active = _ACTIVE_TAP.get()
    if active is not None:
        layer = module.layer_idx
        active.tap.on_attention(AttentionRecord(
            layer=layer, query=query, key=key, value=value, scale=scale, mask=mask, weights=None,
            kernel_lse=lse, sliding_window=kwargs.get("sliding_window") or getattr(module, "sliding_window", None),
            sink_logits=sinks.detach() if isinstance(sinks, Tensor) else None,
            output_gate=active.pending_gates.pop(layer, None),
        ))
    return out.transpose(1, 2).contiguous(), None  # (B, T, H, D)


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean keep-mask (sdpa_mask) as an additive float mask; float masks pass through."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask.to(dtype)


_registered = False


def register_interfaces() -> None:
    """Register both implementations in the attention and mask interfaces (idempotent).

    Registering new names adds entries; it patches nothing that other code uses.
    """
    global _registered
    if not _registered:
        AttentionInterface.register(IMPLEMENTATION, sinkscope_attention)
        AttentionMaskInterface.register(IMPLEMENTATION, eager_mask)
        AttentionInterface.register(FUSED_IMPLEMENTATION, sinkscope_fused_attention)
        AttentionMaskInterface.register(FUSED_IMPLEMENTATION, sdpa_mask)
        _registered = True


def _output_of(out) -> Tensor:
    """Decoder layers return a tensor or a tuple whose first item is the hidden state."""
    return out[0] if isinstance(out, (tuple, list)) else out


def _install_hooks(
    model: nn.Module, family: Family, spec: ModelSpec, active: _ActiveCapture, residual: bool
) -> list:
    handles = []
    layers = get_submodule(model, family.layers)
    for index, layer_module in enumerate(layers):
        if family.gate_module is not None and index in spec.attention_layers:
            source = get_submodule(layer_module, family.gate_module)

            def read_gate(_mod, _inp, out, index=index):
                active.pending_gates[index] = family.gate_reader(out, spec.n_heads, spec.head_dim)

            handles.append(source.register_forward_hook(read_gate))
        if residual:

            def read_residual(_mod, _inp, out, index=index):
                active.tap.on_residual(index, _output_of(out))

            handles.append(layer_module.register_forward_hook(read_residual))
    return handles


@contextlib.contextmanager
def capture(model: nn.Module, tap: Tap, *, residual: bool = False, mode: str = "explicit") -> Iterator[ModelSpec]:
    """Attach the capture to ``model`` for the duration of the block.

    Args:
        model: a transformers causal LM of a supported family.
        tap: receives one record per attention layer per forward (and residual states).
        residual: also hand each decoder layer's output hidden state (B, T, C) to the tap.
        mode: ``"explicit"`` (eager weights, the reference) or ``"fused"`` (kernel LSE, linear memory).

    Yields:
        The model's :class:`ModelSpec`.
    """
    family = family_of(model)
    spec = ModelSpec.from_model(model)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, not {mode!r}")
    register_interfaces()
    previous = model.config._attn_implementation
    active = _ActiveCapture(tap, spec)
    model.set_attn_implementation(MODES[mode])
    handles = _install_hooks(model, family, spec, active, residual)
    token = _ACTIVE_TAP.set(active)
    try:
        yield spec
    finally:
        _ACTIVE_TAP.reset(token)
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)
