"""Attach the named hook points (``hooks.py``) to a transformers model, for one scope.

Attention itself is observed through transformers' own attention interface: we register one
function, ``"sinkscope"``, in ``AttentionInterface`` *and* ``AttentionMaskInterface`` (without
the mask registration ``masking_utils`` builds no mask for an unknown implementation name and
the model silently runs unmasked). The function calls the family's own
``eager_attention_forward`` (so GQA, gpt-oss sinks, GPT-2's scaling, sliding windows and
soft-capping are all exactly the model's), returns its result unchanged, and hands an
:class:`~sinkscope.capture.record.AttentionRecord` to the active sink.

Two implementations are registered. ``"sinkscope"`` (explicit, the reference) runs the
family's eager attention and hands over its weights. ``"sinkscope_fused"`` (the default for
runs) computes the same attention with a fused kernel that also returns each row's log-sum-exp
(``kernels.py``), so nothing quadratic in the sequence length is kept; its mask comes from
transformers' ``sdpa_mask`` (None for plain causal layers). Both give the probes the same
numbers (tests: 1e-5 on every family). Either also applies a replacement of the value vectors
(``blocks.{l}.attn.hook_v``) before the attention mixes them.

Everything outside the attention function (residual stream, norms, the output projection's
input and per-head results, the MLP's first projection, Qwen3-Next's output gate) is read by
forward hooks on the modules discovery finds (``discover.py``). :func:`capture` installs
only the hooks the sink asks for, and removes them, and restores the model's attention
implementation, on exit. Outside the context the registered functions are inert: with no
active capture they are the family's eager attention.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from sinkscope.capture import hooks as hp
from sinkscope.capture.discover import LAYER_OF, Parts, _family_eager, find_submodule
from sinkscope.capture.families import ModelSpec, family_of, get_submodule
from sinkscope.capture.kernels import attention_with_lse, attention_with_received
from sinkscope.capture.masks import _additive, causal_additive_mask, fold_into_mask
from sinkscope.capture.record import AttentionRecord, sink_rows
from sinkscope.capture.window_masks import fused_eager_mask, fused_sdpa_mask
from sinkscope.errors import SinkscopeError

IMPLEMENTATION = "sinkscope"
FUSED_IMPLEMENTATION = "sinkscope_fused"
#: the fused function with transformers' float (eager) mask, for models without SDPA support: they may
#: edit the mask as floats (DeepSeek V4 appends a float bias with ``.to(mask.dtype)``), which a boolean
#: mask from ``sdpa_mask`` does not survive.
FUSED_EAGER_MASK = "sinkscope_fused_eager_mask"
MODES = {"explicit": IMPLEMENTATION, "fused": FUSED_IMPLEMENTATION}


class HookSink(Protocol):
    """What receives the hook points (the runner's dispatcher).

    ``observed`` and ``intervened`` are the hook-point templates (``hooks.py``) asked for;
    ``emit`` receives an observed point's value, ``replace`` returns the value to use in place
    of an intervened one (the same object when nothing changes). A sink that runs several passes
    through one capture (the runner's pass switch) may also have ``live_observed`` and
    ``live_intervened``, the current pass's subsets: the capture installs hooks for ``observed``
    but computes a point, or builds an attention record, only where the current pass reads it.
    A sink with ``attention_function`` set runs sinkscope's attention function even when it
    observes no record (a command's second stage, whose loss is compared with the first stage's).
    """

    observed: frozenset[str]
    intervened: frozenset[str]

    def emit(self, template: str, layer: int | None, value) -> None: ...

    def replace(self, template: str, layer: int, value: Tensor) -> Tensor: ...


_ACTIVE: contextvars.ContextVar["_ActiveCapture | None"] = contextvars.ContextVar(
    "sinkscope_active_capture", default=None
)


class _ActiveCapture:
    """Per-``capture`` state: the sink, and values waiting for a later hook of their layer."""

    def __init__(self, sink: HookSink, spec: ModelSpec, sink_form: str | None = None):
        self.sink = sink
        self.spec = spec
        #: how the model applies its learned sink (``discover.Parts.sink_form``)
        self.sink_form = sink_form
        #: ids of the decoder layers' attention modules, and the layer running now (layer pre-hooks)
        self.attention_modules: set[int] = set()
        self.current_layer: int | None = None
        self.observe_attention = hp.ATTN in sink.observed
        self.replace_values = hp.ATTN_V in sink.intervened
        self.observe_values = hp.ATTN_V in sink.observed
        #: sinkscope's attention function runs although no record may be read (``HookSink``)
        self.attention_function = bool(getattr(sink, "attention_function", False))
        #: crafted value columns some probe reads from fused records (``Probe.record_columns``).
        self.record_columns = frozenset(getattr(sink, "record_columns", ()))
        self.pending_gates: dict[int, Tensor] = {}
        #: records waiting for an output gate the model computes after its attention function (LFM3's g_proj)
        self.waiting: dict[int, AttentionRecord] = {}
        self.gate_after_attention = False  # set from discover.Parts by capture()
        self.resid_pre: dict[int, Tensor] = {}
        #: the model's code tolerates a None mask for a layer transformers would mask (it supports SDPA or
        #: flash attention); set by capture()
        self.none_mask_ok = False
        #: every attention call names its sliding window (``discover.Parts.window_kwarg``): a plain window's
        #: mask may be left to the kernel (``window_masks.py``); set by capture()
        self.window_kwarg = False

    def observes(self, template: str) -> bool:
        """Whether the pass running now observes ``template``.

        A sink with several passes (the runner's pass switch) says which points its current pass
        reads (``live_observed``); the hooks are installed for every pass, but nothing is computed
        at a point, and no attention record is built, on a pass that reads none. Other sinks: ``observed``.
        """
        return template in getattr(self.sink, "live_observed", self.sink.observed)

    def intervenes(self, template: str) -> bool:
        """Whether the pass running now intervenes on ``template`` (``live_intervened``, else ``intervened``)."""
        return template in getattr(self.sink, "live_intervened", self.sink.intervened)

    def records_now(self) -> bool:
        """Whether this pass builds attention records: some probe of it observes them."""
        return self.observe_attention and self.observes(hp.ATTN)

    def emit_record(self, layer: int, record: AttentionRecord) -> None:
        """Hand ``record`` to the sink, or hold it until its layer's output gate is read (``gate_arrived``)."""
        if record.output_gate is None and self.gate_after_attention:
            self.waiting[layer] = record
            return
        self.sink.emit(hp.ATTN, layer, record)

    def gate_arrived(self, layer: int, gate: Tensor) -> None:
        """An output gate of ``layer`` (B, T, H, D) was read: attach it to the waiting record, or keep it for the next."""
        record = self.waiting.pop(layer, None)
        if record is None:
            self.pending_gates[layer] = gate
            return
        record.output_gate = gate
        self.sink.emit(hp.ATTN, layer, record)

    def values(self, layer: int, value: Tensor) -> Tensor:
        """Apply and report ``hook_v`` on (B, Hkv, S, D) values; the probes see (B, S, Hkv, D)."""
        if self.replace_values and self.intervenes(hp.ATTN_V):
            replaced = self.sink.replace(hp.ATTN_V, layer, value.transpose(1, 2))  # (B, S, Hkv, D)
            if tuple(replaced.shape) != (value.shape[0], value.shape[2], value.shape[1], value.shape[3]):
                raise ValueError(f"a hook_v replacement must keep the shape {tuple(value.transpose(1, 2).shape)}")
            value = replaced.transpose(1, 2).to(value.dtype)  # (B, Hkv, S, D)
        if self.observe_values and self.observes(hp.ATTN_V):
            self.sink.emit(hp.ATTN_V, layer, value.transpose(1, 2))  # (B, S, Hkv, D)
        return value


def _sliding_window(module: nn.Module, kwargs: dict) -> int | None:
    return kwargs.get("sliding_window") or getattr(module, "sliding_window", None)


def _sink_logits(module: nn.Module, kwargs: dict) -> Tensor | None:
    """The learned sink logits the model hands its attention function, or None.

    (H,) per head, b_h: gpt-oss's ``s_aux`` or the module's ``sinks`` parameter. (B, H, T) per
    query, b_hi: a ``sinks`` argument of shape (B, H, T, 1), computed from the hidden state by
    Inkling2's ``sink_proj`` (its eager function appends it as an extra softmax column).
    """
    sinks = kwargs.get("s_aux")
    if not isinstance(sinks, Tensor):
        per_query = kwargs.get("sinks")
        if isinstance(per_query, Tensor) and per_query.dim() == 4:
            return per_query.detach()[..., 0]  # (B, H, T)
        sinks = per_query if isinstance(per_query, Tensor) else getattr(module, "sinks", None)
    return sinks.detach() if isinstance(sinks, Tensor) else None


def _layer(module: nn.Module) -> int | None:
    """The decoder layer an attention call belongs to, or None for a call sinkscope does not observe.

    Inside a capture: the decoder layer running now, when ``module`` is that layer's attention
    module (a module shared by several layers, Zamba2's, is measured in each); None for any other
    module calling the interface (a vision tower, a residual-mixing module). Outside one: the
    module's ``layer_idx``, else the layer discovery found it in.
    """
    active = _ACTIVE.get()
    if active is not None and id(module) not in active.attention_modules:
        return None
    if active is not None and active.current_layer is not None:
        return active.current_layer
    index = getattr(module, "layer_idx", None)  # called outside a layer's forward: its own index
    return index if isinstance(index, int) else LAYER_OF.get(module)


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
    attention_mask = fold_into_mask(attention_mask, kwargs, query, key)
    active = _ACTIVE.get()
    layer = _layer(module)
    if active is not None and layer is None:  # not a decoder layer's attention: computed, not observed
        return _family_eager(module, required=True)(module, query, key, value, attention_mask, **kwargs)
    if active is not None:
        value = active.values(layer, value)  # (B, Hkv, S, D)
    out, weights = _family_eager(module, required=True)(module, query, key, value, attention_mask, **kwargs)
    if active is not None and active.records_now():
        mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
        record = AttentionRecord(
            layer=layer,
            query=query,
            key=key,
            value=value,
            scale=_scale(query, kwargs),
            mask=mask,
            weights=weights.float(),
            sliding_window=_sliding_window(module, kwargs),
            sink_logits=_sink_logits(module, kwargs),
            output_gate=active.pending_gates.pop(layer, None),
            softcap=kwargs.get("softcap"),
        )
        if record.has_phantom and active.sink_form == "rescale":
            # the eager rows sum to 1 and the output is scaled by sigmoid(LSE - b) = 1 - phi: the same
            # algebra as a softmax column for the sink, so the record's weights are a_ij = w_ij (1 - phi_i)
            record.weights = record.weights * (1 - record.phantom_mass()).unsqueeze(-1)
            record._cache.clear()
        active.emit_record(layer, record)
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
    soft-capping fall back to the explicit function, with the causal mask built here when
    ``sdpa_mask`` left it implicit (None).
    """
    attention_mask = fold_into_mask(attention_mask, kwargs, query, key, kwargs.get("sliding_window"))
    if kwargs.get("softcap") is not None:
        S = key.shape[-2]
        if attention_mask is None:  # None: plain causal, within the layer's window if any (window_masks.py)
            mask = causal_additive_mask(query.shape[-2], S, query.dtype, query.device,
                                        kwargs.get("sliding_window"))  # (1, 1, T, S)
        else:
            mask = _additive(attention_mask[:, :, :, :S], query.dtype)  # (B, 1, T, S)
        return sinkscope_attention(module, query, key, value, mask, **kwargs)
    active = _ACTIVE.get()
    layer = _layer(module)
    if layer is None:  # not a decoder layer's attention (a residual-mixing module, a vision tower): its own
        eager = _family_eager(module, required=True)  # eager, unobserved
        return eager(module, query, key, value, attention_mask, **kwargs)
    if active is not None:
        value = active.values(layer, value)  # (B, Hkv, S, D)
    S = key.shape[-2]
    mask = None if attention_mask is None else _additive(attention_mask[:, :, :, :S], query.dtype)
    # no mask: causal, within the window the call names (a plain window's mask is left out only for models whose
    # calls name it, as transformers' flash path reads it: window_masks.py)
    window = kwargs.get("sliding_window") if mask is None else None
    scale = _scale(query, kwargs)
    quiet = received = None
    records = active is not None and active.records_now()
    sinks = _sink_logits(module, kwargs)
    if records and "quiet" in active.record_columns:
        # exposure: the quiet-set indicators ride along as extra value columns of the same call
        out, lse, quiet = _attention_with_columns(query, key, value, scale, mask,
                                                  AttentionRecord.quiet_indicator_columns(value), window)
    elif records and "received" in active.record_columns:
        # per-key mass (h2o, --protect top-p0): the column sums from the logits that make the output
        out, lse, received = attention_with_received(query, key, value, scale, mask, window=window,
                                                     sink_rows=None if sinks is None else sink_rows(sinks))
    else:
        out, lse = attention_with_lse(query, key, value, scale, mask, window=window)  # (B, H, T, D), (B, H, T)
    if sinks is not None:  # both forms (an extra softmax column, the output rescaled by sigmoid(LSE - b)) are this
        phi = torch.sigmoid(sink_rows(sinks) - lse)  # (B, H, T); b (1, H, 1) per head or (B, H, T) per query
        out = out * (1 - phi).unsqueeze(-1).to(out.dtype)  # drop the phantom's share
    if records:
        active.emit_record(layer, AttentionRecord(
            layer=layer, query=query, key=key, value=value, scale=scale, mask=mask, weights=None,
            kernel_lse=lse, sink_logits=sinks,
            sliding_window=window if mask is None else _sliding_window(module, kwargs),  # None: the window applied
            output_gate=active.pending_gates.pop(layer, None), quiet_columns=quiet, received=received,
        ))
    return out.transpose(1, 2).contiguous(), None  # (B, T, H, D)


#: the head width of a kernel call with crafted value columns is padded to a multiple of this.
COLUMN_ALIGNMENT = 8


def _attention_with_columns(query: Tensor, key: Tensor, value: Tensor, scale: float, mask: Tensor | None,
                            columns: Tensor, window: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One fused call whose values carry ``columns`` (B, Hkv, S, K) after the real D: out, lse, column outputs.

    q, k and v are zero-padded to one width, a multiple of :data:`COLUMN_ALIGNMENT` (the CPU
    kernel wants equal head sizes; zero coordinates change no logit). Returns the real output
    (B, H, T, D) in the values' dtype, LSE (B, H, T) and sum_j w_ij columns_j (B, H, T, K) float32.
    """
    D, K = value.shape[-1], columns.shape[-1]
    width = max(query.shape[-1], D + K)
    width += -width % COLUMN_ALIGNMENT
    v = torch.cat([value, columns.to(value.dtype)], dim=-1)  # (B, Hkv, S, D+K)
    q, k, v = (F.pad(t, (0, width - t.shape[-1])) for t in (query, key, v))  # (B, H|Hkv, T|S, W)
    out, lse = attention_with_lse(q, k, v, scale, mask, window=window)  # (B, H, T, W), (B, H, T)
    return out[..., :D], lse, out[..., D:D + K].float()


def implementation_for(model: nn.Module, mode: str) -> str:
    """The registered implementation name for ``mode``: the fused one with a float mask where the model has no SDPA."""
    if mode == "fused" and getattr(model, "_supports_sdpa", True) is False:
        return FUSED_EAGER_MASK
    return MODES[mode]


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
        AttentionMaskInterface.register(FUSED_IMPLEMENTATION, functools.partial(fused_sdpa_mask,
                                                                                window_named=_window_named))
        AttentionInterface.register(FUSED_EAGER_MASK, sinkscope_fused_attention)
        AttentionMaskInterface.register(FUSED_EAGER_MASK, functools.partial(
            fused_eager_mask, none_allowed=_none_mask_ok, window_named=_window_named))
        _registered = True


def _none_mask_ok() -> bool:
    """Whether the model under the active capture tolerates a None mask (``_ActiveCapture.none_mask_ok``)."""
    active = _ACTIVE.get()
    return active is not None and active.none_mask_ok


def _window_named() -> bool:
    """Whether the active capture's model names its sliding window in every attention call (``window_kwarg``)."""
    active = _ACTIVE.get()
    return active is not None and active.window_kwarg


# ---- hooks outside the attention function ---------------------------------------------------------


def _output_of(out) -> Tensor:
    """Modules return a tensor or a tuple whose first item is the hidden state."""
    return out[0] if isinstance(out, (tuple, list)) else out


def _input_of(args: tuple, kwargs: dict) -> Tensor:
    """The hidden state a module is called with: first positional argument or ``hidden_states``."""
    return args[0] if args else kwargs["hidden_states"]


def head_results(z: Tensor, out_proj: nn.Module, conv1d: bool) -> Tensor:
    """Per-head contributions z_h W_O[h], (B, T, H, C), from z (B, T, H, D) and W_O.

    ``nn.Linear`` keeps W_O as (C, H*D), GPT-2's ``Conv1D`` as (H*D, C). The sum over heads
    plus the projection's bias is the projection's output.
    """
    B, T, H, D = z.shape
    weight = out_proj.weight
    if conv1d:
        return torch.einsum("bthd,hdc->bthc", z, weight.view(H, D, -1).to(z.dtype))  # (B, T, H, C)
    return torch.einsum("bthd,chd->bthc", z, weight.view(-1, H, D).to(z.dtype))  # (B, T, H, C)


def _install_hooks(model: nn.Module, family: Parts, spec: ModelSpec, active: _ActiveCapture) -> list:
    """Forward hooks for every requested point outside the attention function; returns the handles."""
    # installed for every pass's points; inside a hook, ``now(t)`` / ``now_replaced(t)``: the current pass's
    sink, observed, intervened = active.sink, active.sink.observed, active.sink.intervened
    now, now_replaced = active.observes, active.intervenes

    def emit_now(template: str, index: int, value: Tensor) -> None:  # returns None: a hook that changes nothing
        if now(template):
            sink.emit(template, index, value)
    handles: list = []
    found: dict[str, bool] = {}
    layers = get_submodule(model, family.layers)
    parallel = family.parallel
    want_pre_store = hp.RESID_MID in observed and parallel

    def on(template: str, module: nn.Module | None, hook, pre: bool = False) -> None:
        found[template] = found.get(template, False) or module is not None
        if module is not None:
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True) if pre
                           else module.register_forward_hook(hook))

    def enter(_m, _args, index):
        active.current_layer = index

    def leave(_m, _args, _out):
        active.current_layer = None

    attention_modules = {index: find_submodule(layers[index], family.attention) for index in spec.attention_layers}
    active.attention_modules = {id(m) for m in attention_modules.values() if m is not None}
    # the attention function learns its layer from ``layer_idx``; where that cannot tell it (a module shared
    # by several layers, Zamba2's, or one without its own index, GPT-Neo's), from hooks on the layers
    track = (active.observe_attention or active.replace_values or active.observe_values
             or active.attention_function) and (
        len(active.attention_modules) < len([m for m in attention_modules.values() if m is not None])
        or any(getattr(m, "layer_idx", None) != index for index, m in attention_modules.items() if m is not None))
    for index, layer_module in enumerate(layers):
        is_attention = index in spec.attention_layers
        if track:
            handles.append(layer_module.register_forward_pre_hook(lambda m, a, index=index: enter(m, a, index)))
            handles.append(layer_module.register_forward_hook(leave))
        if hp.RESID_PRE in observed or want_pre_store:
            def resid_pre(_m, args, kwargs, index=index):
                hidden = _input_of(args, kwargs)  # (B, T, C)
                if want_pre_store and now(hp.RESID_MID):
                    active.resid_pre[index] = hidden
                if now(hp.RESID_PRE):
                    sink.emit(hp.RESID_PRE, index, hidden)
            on(hp.RESID_PRE, layer_module, resid_pre, pre=True)
        if hp.RESID_POST in intervened:
            def resid_post(_m, _i, out, index=index):
                hidden = _output_of(out)  # (B, T, C)
                replaced = sink.replace(hp.RESID_POST, index, hidden) if now_replaced(hp.RESID_POST) else hidden
                if now(hp.RESID_POST):
                    sink.emit(hp.RESID_POST, index, replaced)
                if replaced is hidden:
                    return None
                replaced = replaced.to(hidden.dtype)
                return (replaced, *out[1:]) if isinstance(out, tuple) else [replaced, *out[1:]] \
                    if isinstance(out, list) else replaced
            on(hp.RESID_POST, layer_module, resid_post)
        elif hp.RESID_POST in observed:
            on(hp.RESID_POST, layer_module,
               lambda _m, _i, out, index=index: emit_now(hp.RESID_POST, index, _output_of(out)))
        if hp.LN1_NORMALIZED in observed:
            on(hp.LN1_NORMALIZED, find_submodule(layer_module, family.ln1),
               lambda _m, _i, out, index=index: emit_now(hp.LN1_NORMALIZED, index, _output_of(out)))
        if hp.RESID_MID in observed and not parallel:
            on(hp.RESID_MID, find_submodule(layer_module, family.ln2 or family.mlp),
               lambda _m, args, kwargs, index=index: emit_now(hp.RESID_MID, index, _input_of(args, kwargs)), pre=True)
        if (hp.ATTN_OUT in observed or (hp.RESID_MID in observed and parallel)) and is_attention:
            def attn_out(_m, _i, out, index=index):
                added = _output_of(out)  # (B, T, C)
                if now(hp.ATTN_OUT):
                    sink.emit(hp.ATTN_OUT, index, added)
                if parallel and now(hp.RESID_MID):
                    sink.emit(hp.RESID_MID, index, active.resid_pre.pop(index) + added)
            on(hp.ATTN_OUT, find_submodule(layer_module, family.attn_out), attn_out)
            if hp.RESID_MID in observed and parallel:
                found[hp.RESID_MID] = True
        wants_z = {hp.ATTN_Z, hp.ATTN_RESULT} & observed or hp.ATTN_Z in intervened
        if wants_z and is_attention:
            out_proj = find_submodule(layer_module, family.out_proj)

            def z_hook(module, args, kwargs, index=index):
                if not (now_replaced(hp.ATTN_Z) or now(hp.ATTN_Z) or now(hp.ATTN_RESULT)):
                    return None
                flat = _input_of(args, kwargs)  # (B, T, H*D)
                z = flat.view(*flat.shape[:-1], spec.n_heads, spec.head_dim)  # (B, T, H, D)
                changed = False
                if now_replaced(hp.ATTN_Z):
                    replaced = sink.replace(hp.ATTN_Z, index, z)
                    changed = replaced is not z
                    z = replaced.to(flat.dtype)
                if now(hp.ATTN_Z):
                    sink.emit(hp.ATTN_Z, index, z)
                if now(hp.ATTN_RESULT):
                    sink.emit(hp.ATTN_RESULT, index, head_results(z, module, family.out_proj_conv1d))
                if changed:
                    flat = z.reshape(flat.shape)  # (B, T, H*D)
                    return ((flat, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": flat})
                return None

            for template in (hp.ATTN_Z, hp.ATTN_RESULT):
                found[template] = found.get(template, False) or out_proj is not None
            if out_proj is not None:
                handles.append(out_proj.register_forward_pre_hook(z_hook, with_kwargs=True))
        if hp.MLP_PRE in observed:
            on(hp.MLP_PRE, find_submodule(layer_module, family.mlp_pre),
               lambda _m, _i, out, index=index: emit_now(hp.MLP_PRE, index, _output_of(out)))
        if hp.MLP_PRE_LINEAR in observed:
            on(hp.MLP_PRE_LINEAR, find_submodule(layer_module, family.mlp_pre_linear),
               lambda _m, _i, out, index=index: emit_now(hp.MLP_PRE_LINEAR, index, _output_of(out)))
        if family.gate_module is not None and is_attention and active.observe_attention:
            def read_gate(_mod, _inp, out, index=index):
                if active.records_now():  # a pass that builds no record reads no gate
                    active.gate_arrived(index, family.gate_reader(out, spec.n_heads, spec.head_dim))
            handles.append(get_submodule(layer_module, family.gate_module).register_forward_hook(read_gate))

    missing = [name for name, ok in found.items() if not ok]
    if missing:
        for handle in handles:
            handle.remove()
        why = "; ".join(f"{name}: {family.absent[name]}" for name in missing if family.absent.get(name))
        raise SinkscopeError(f"{family.label} models have no {', '.join(missing)}{f' ({why})' if why else ''}; "
                             "choose probes that do not need it (`sinkscope ls hooks MODEL` lists what it has).")
    return handles


def _read_eager_weights(model: nn.Module, family: Parts, active: _ActiveCapture) -> list:
    """The eager fallback (``discover.EAGER_FALLBACK``): every pass returns its attention weights, made records.

    For a model whose attention does not call the attention interface, a pre-hook on the model asks
    for ``output_attentions`` and a hook on its output turns each softmax layer's weights into an
    explicit :class:`AttentionRecord` holding weights only (the model computed them; no q, k or v),
    then drops them from the output. The weights of every layer exist at once: memory quadratic in
    the sequence length, as the model's own eager attention.
    """
    def ask(_module, args, kwargs):
        if not active.observes(hp.ATTN):  # a pass that reads no record: the model's weights are not asked for
            return None
        return args, {**kwargs, "output_attentions": True}

    def read(_module, _args, _kwargs, output):
        weights = getattr(output, "attentions", None)
        if weights is None:
            return None
        for layer, w in zip(family.attention_layers, [w for w in weights if isinstance(w, Tensor)]):
            active.sink.emit(hp.ATTN, layer, AttentionRecord(
                layer=layer, query=None, key=None, value=None, scale=float("nan"), mask=None,
                weights=w.float(), output_gate=active.pending_gates.pop(layer, None)))
        output.attentions = None
        return output

    return [model.register_forward_pre_hook(ask, with_kwargs=True),
            model.register_forward_hook(read, with_kwargs=True)]


@contextlib.contextmanager
def capture(model: nn.Module, sink: HookSink, *, mode: str = "fused") -> Iterator[ModelSpec]:
    """Attach the hook points ``sink`` asks for to ``model`` for the duration of the block.

    In ``"fused"`` mode (kernel LSE and linear memory, the default) every softmax layer runs
    sinkscope's fused function for the whole block, on every pass, whether or not a record is
    read: a sink that reads only the residual stream gets the SDPA flash kernel too, never the
    eager T x T scores the model is loaded with (issue 42). In ``"explicit"`` mode (the family's
    eager weights, the reference) the implementation is switched only when an attention record
    is observed, the values are intervened on or the sink asks for it (``attention_function``);
    otherwise the model keeps its own implementation and only forward hooks are added. A family
    whose attention does not go through transformers' interface always keeps its own.

    Yields:
        The model's :class:`ModelSpec`.
    """
    family = family_of(model)
    spec = ModelSpec.from_model(model)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, not {mode!r}")
    active = _ActiveCapture(sink, spec, family.sink_form)
    active.gate_after_attention = family.gate_module is not None and family.gate_after_attention
    active.none_mask_ok = bool(getattr(model, "_supports_sdpa", True) or getattr(model, "_supports_flash_attn", False))
    active.window_kwarg = family.window_kwarg
    if mode == "fused" and family.interface:  # the fused kernel on every pass, records or not (docstring)
        active.attention_function = True
    switch = (bool({hp.ATTN, hp.ATTN_V} & (sink.observed | sink.intervened))
              or active.attention_function) and family.interface
    previous = model.config._attn_implementation
    handles = _install_hooks(model, family, spec, active)
    if not family.interface and hp.ATTN in sink.observed:
        handles += _read_eager_weights(model, family, active)
    if switch:
        register_interfaces()
        model.set_attn_implementation(implementation_for(model, mode))
    token = _ACTIVE.set(active)
    try:
        yield spec
    finally:
        _ACTIVE.reset(token)
        for handle in handles:
            handle.remove()
        if switch:
            model.set_attn_implementation(previous)
