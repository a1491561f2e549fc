"""Find the parts the hook points read, in any causal LM, by watching one short forward pass.

No table of families: for a transformers model, :func:`discover` runs one forward pass of a few
tokens with a recording attention function registered in transformers' ``AttentionInterface``
and forward hooks on every module of the decoder layers, and reads off, per layer:

- the **decoder-layer stack**: the ``ModuleList`` with one entry per layer (``config`` says how
  many), the largest if several;
- the **attention module**: the module the attention function is called with; the layers that
  call it are the softmax-attention layers (a linear-attention or SSM layer never does), and the
  call's shapes give H, Hkv, the query/key head size and the value head size (MLA: they differ);
- the **output projection** W_O: the first module with a 2-D weight that the attention module
  calls after the attention function returned, taking H x D_v features (its input is ``hook_z``);
- the **attention's input norm** (``ln1``): the module whose output is the attention module's
  input (None when attention reads the residual stream itself);
- what the block **adds to the residual** (``attn_out``): the attention module, or the end of the
  chain of modules applied to its output (Gemma's post-attention norm, GPT-NeoX's dropout);
- the **MLP**: the layer's largest remaining child called after attention; its input norm
  (``ln2``, whose input is ``hook_resid_mid``); the **residual order**: parallel when the MLP
  reads (a norm of) the block's input rather than the residual after attention (GPT-J, Falcon,
  Phi, Cohere, Pythia);
- the MLP's **first projections** where the MLP is dense: the 2-D-weight modules reading the MLP's
  input; with two, the one feeding the activation is ``mlp.hook_pre`` and the other
  ``mlp.hook_pre_linear`` (a mixture of experts, a fused gate/up projection or an MLP without an
  activation module has no ``hook_pre``, and :attr:`Parts.absent` says why);
- a **learned sink**: the tensor passed to the attention function as ``s_aux`` (or the module's
  ``sinks``), with its form read off the model's own eager function: an extra softmax column
  (gpt-oss: the eager rows sum to 1 - phi) or an output rescaling by sigmoid(LSE - b) (Granite-SWA:
  the eager rows sum to 1). Any other parameter named like a sink is refused, never read as 0.

What cannot be found goes in :data:`QUIRKS` (empty today), each with
the reason. A model whose attention never calls the interface gets the eager fallback
(``Parts.interface`` False: the attention weights come from ``output_attentions``), and one with
no softmax attention at all one sentence.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor, nn

from sinkscope.capture.masks import fold_into_mask
from sinkscope.errors import SinkscopeError

#: the name under which the recording attention function is registered during discovery.
DISCOVERY = "sinkscope_discover"
#: tokens of the discovery pass (position 0 and a few after it).
DISCOVERY_TOKENS = 6


@dataclass(frozen=True)
class Parts:
    """Where one model keeps what the hook points read, found by :func:`discover`.

    Paths are dotted attribute paths: ``layers`` from the CausalLM, the others from one decoder
    layer. None means the model has no such part (``absent`` says why, per hook point).

    Attributes:
        model_type: ``config.model_type``.
        label: a human name for messages.
        layers: the decoder layers' ``ModuleList``.
        attention: the attention module (the one calling the attention interface).
        out_proj: W_O; its input is ``hook_z``, (B, T, H*D_v).
        ln1: the attention's input norm (``ln1.hook_normalized`` is its output).
        attn_out: the module whose output the block adds to the residual stream.
        attn_out_normalised: a module with parameters (a norm) lies between W_O and the residual
            stream, so a head's share of ``hook_attn_out`` is not its ``hook_result``.
        ln2: the MLP's input norm (its input is ``hook_resid_mid`` in a sequential block).
        mlp: the MLP module.
        parallel: attention and MLP read the same block input (``hook_resid_mid`` is then
            ``resid_pre + attn_out``).
        mlp_pre: the module whose output is ``mlp.hook_pre`` (the activation's input).
        mlp_pre_linear: a gated MLP's up projection (``mlp.hook_pre_linear``).
        out_proj_conv1d: W_O is a GPT-2 ``Conv1D`` (weight (in, out)).
        attention_layers: indices of the layers whose attention calls the interface.
        n_heads, n_kv_heads: H and Hkv of the attention calls (the largest Hkv where layers differ).
        head_dim: D_v, the value head size (``hook_z``'s last axis).
        qk_head_dim: the query/key head size (differs from D_v under MLA).
        hidden_size: C, the residual width.
        sink_form: ``"column"`` (an extra softmax logit, gpt-oss), ``"rescale"`` (the output
            scaled by sigmoid(LSE - b), Granite-SWA) or None (no learned sink).
        interface: whether the attention calls transformers' attention interface (False: the
            eager ``output_attentions`` fallback).
        gate_module: path of a module whose output holds an output gate: found (a projection of
            the attention's input whose sigmoid times the attention output is what W_O reads,
            :func:`sigmoid_gate`) or declared (:data:`QUIRKS`).
        gate_unread: why an output gate could not be read, when W_O reads the attention output
            changed by something else (a scaled or softplus gate, a gate packed into another
            projection); None otherwise.
        gate_after_attention: the gate module runs after the attention function (LFM3, Dots3,
            Inkling2), so the capture holds each record until the gate is read.
        gate_reader: turns that output into (B, T, H, D) gate values.
        window_kwarg: every layer's attention call passes ``sliding_window`` (see the field).
        absent: hook point -> why this model has none.
    """

    model_type: str
    label: str
    layers: str
    attention: str | None
    out_proj: str | None
    ln1: str | None
    attn_out: str | None
    attn_out_normalised: bool
    ln2: str | None
    mlp: str | None
    parallel: bool
    mlp_pre: str | None
    mlp_pre_linear: str | None
    out_proj_conv1d: bool
    attention_layers: tuple[int, ...]
    n_heads: int
    n_kv_heads: int
    head_dim: int
    qk_head_dim: int
    hidden_size: int
    sink_form: str | None = None
    interface: bool = True
    gate_unread: str | None = None
    gate_after_attention: bool = False
    #: every decoder layer's attention call names its sliding window (``sliding_window=``, None on a full
    #: layer): the fused capture may then leave a plain window's mask to the kernel (``window_masks.py``)
    window_kwarg: bool = False
    gate_module: str | None = None
    gate_reader: Callable | None = None
    absent: dict = field(default_factory=dict)


#: discovered parts per model object (a model is discovered once).
_FOUND: "weakref.WeakKeyDictionary[nn.Module, Parts]" = weakref.WeakKeyDictionary()
#: attention module -> its layer index, for modules without ``layer_idx``.
LAYER_OF: "weakref.WeakKeyDictionary[nn.Module, int]" = weakref.WeakKeyDictionary()


def discover(model: nn.Module) -> Parts:
    """The :class:`Parts` of a transformers causal LM (cached per model), or a one-sentence error."""
    found = _FOUND.get(model)
    if found is None:
        found = _FOUND[model] = _discover(model)
    return found


# ---- the decoder-layer stack ---------------------------------------------------------------------------


def text_config(config):
    """The text part of a config (multimodal models keep it in ``text_config``)."""
    inner = getattr(config, "get_text_config", None)
    return inner() if callable(inner) else config


def n_layers_of(config) -> int | None:
    config = text_config(config)
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def find_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The ``ModuleList`` of decoder layers: one entry per layer, the shallowest such list (then the largest).

    Searched under ``model.get_decoder()`` first where the model has one (a multimodal model's
    vision or audio encoder may have as many layers as its text decoder).
    """
    wanted = n_layers_of(model.config)
    decoder = None
    with contextlib.suppress(Exception):
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for root in ([decoder] if isinstance(decoder, nn.Module) else []) + [model]:
        found = _largest_list(model, root, wanted)
        if found is not None:
            return found
    raise SinkscopeError(f"could not find the decoder layers of this {model.config.model_type!r} model (no list of "
                         f"{wanted} modules); sinkscope cannot measure it.")


def _largest_list(model: nn.Module, root: nn.Module, wanted: int | None) -> tuple[str, nn.ModuleList] | None:
    prefix = next((name for name, module in model.named_modules() if module is root), "")
    best = None
    for name, module in root.named_modules(prefix=prefix):
        if not isinstance(module, nn.ModuleList) or not len(module) or (wanted and len(module) != wanted):
            continue
        rank = (-name.count("."), sum(p.numel() for p in module.parameters()))  # the shallowest, then the largest
        if best is None or rank > best[0]:
            best = (rank, name, module)
    return None if best is None else (best[1], best[2])


# ---- the discovery pass -----------------------------------------------------------------------------------


@dataclass
class _Call:
    """One module call of the discovery pass, in the decoder layer running it (None: outside the layers)."""

    path: str
    module: nn.Module
    start: int
    layer: int | None
    end: int = -1
    input: Tensor | None = None
    output: Tensor | None = None


@dataclass
class _AttentionCall:
    module: nn.Module
    order: int
    layer: int | None
    query: tuple
    key: tuple
    value: tuple
    sink: Tensor | None
    output: Tensor | None = None
    done: int = -1
    #: the call carried a ``sliding_window`` keyword (None on a full layer), as transformers' flash path reads it
    window_kwarg: bool = False


def _first_tensor(value) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], Tensor):
        return value[0]
    return None


def _same(a: Tensor | None, b: Tensor | None) -> bool:
    """The same tensor data: one storage offset and shape (a view with another shape is not)."""
    return (a is not None and b is not None and a.shape == b.shape and a.data_ptr() == b.data_ptr()
            and a.dtype == b.dtype)


def _family_eager(module: nn.Module, required: bool = False) -> Callable | None:
    """The ``eager_attention_forward`` defined in the module's own modeling file.

    None when it has none, unless ``required`` (the capture's registered functions): then a RuntimeError.
    """
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None and required:
        raise RuntimeError(f"{type(module).__name__} has no eager_attention_forward to observe")
    return eager


def _trace(model: nn.Module, layers: nn.ModuleList, prefix: str):
    """Run the discovery pass; returns (module calls in order, attention calls, whether the interface ran)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    calls: list[_Call] = []
    attention_calls: list[_AttentionCall] = []
    clock = [0]
    open_calls: dict[int, list[_Call]] = {}
    current: list[int] = []  # the decoder layers running now (a stack: one, unless a layer runs another)
    top = {id(layer): index for index, layer in enumerate(layers)}

    def tick() -> int:
        clock[0] += 1
        return clock[0]

    def before(module, args, kwargs, path):
        if id(module) in top:
            current.append(top[id(module)])
        hidden = args[0] if args and isinstance(args[0], Tensor) else kwargs.get("hidden_states")
        call = _Call(path, module, tick(), current[-1] if current else None,
                     input=hidden if isinstance(hidden, Tensor) else None)
        calls.append(call)
        open_calls.setdefault(id(module), []).append(call)

    def after(module, args, kwargs, output):
        stack = open_calls.get(id(module))
        if stack:
            call = stack.pop()
            call.end, call.output = tick(), _first_tensor(output)
        if id(module) in top and current:
            current.pop()

    def recording(module, query, key, value, attention_mask, **kwargs):
        attention_mask = fold_into_mask(attention_mask, kwargs, query, key)
        sink = kwargs.get("s_aux")
        if not isinstance(sink, Tensor):
            sink = kwargs.get("sinks")  # (B, H, T, 1) per query (Inkling2), or a per-head (H,)
        record = _AttentionCall(module, tick(), current[-1] if current else None, tuple(query.shape),
                                tuple(key.shape), tuple(value.shape), sink if isinstance(sink, Tensor) else None,
                                window_kwarg="sliding_window" in kwargs)
        attention_calls.append(record)
        eager = _family_eager(module)
        if eager is None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
        else:
            out, weights = eager(module, query, key, value, attention_mask, **kwargs)
        out = out.contiguous()
        record.output, record.done = out, tick()
        return out, weights

    AttentionInterface.register(DISCOVERY, recording)
    AttentionMaskInterface.register(DISCOVERY, eager_mask)  # a materialised mask: every eager function takes it
    handles = []
    for name, module in layers.named_modules():
        if module is layers:
            continue
        path = name
        handles.append(module.register_forward_pre_hook(
            lambda m, a, k, path=path: before(m, a, k, path), with_kwargs=True))
        handles.append(module.register_forward_hook(
            lambda m, a, k, o, path=path: after(m, a, k, o), with_kwargs=True))
    previous = getattr(model.config, "_attn_implementation", None)
    interface = True
    try:
        try:
            model.set_attn_implementation(DISCOVERY)
        except Exception:  # noqa: BLE001 - a model refusing a registered implementation: eager, observed
            interface = False
        vocab = _vocab(model)
        ids = (torch.arange(DISCOVERY_TOKENS) % max(vocab - 1, 1) + 1).view(1, -1)
        ids = ids.to(input_device(model))
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
        if interface and previous is not None:
            with contextlib.suppress(Exception):
                model.set_attn_implementation(previous)
    return calls, attention_calls, interface and bool(attention_calls)


def _vocab(model: nn.Module) -> int:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if isinstance(embeddings, nn.Embedding):
        return embeddings.num_embeddings
    return int(getattr(text_config(model.config), "vocab_size", 2) or 2)


def input_device(model: nn.Module) -> torch.device:
    """Where input ids go: the embedding's device (differs from parameters[0] when sharded)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "weight"):
        return embeddings.weight.device
    return next(model.parameters()).device


# ---- reading the parts off the pass ----------------------------------------------------------------------


def _has_matrix(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, Tensor) and weight.dim() == 2 and not isinstance(module, nn.Embedding)


def _is_activation(module: nn.Module) -> bool:
    return not any(True for _ in module.parameters(recurse=False)) and not list(module.children()) and \
        not isinstance(module, (nn.Dropout, nn.Identity)) and ("activation" in type(module).__name__.lower()
                                                                or type(module).__module__.startswith(
                                                                    ("torch.nn.modules.activation",
                                                                     "transformers.activations")))


def _is_moe(module: nn.Module) -> bool:
    """A mixture of experts: stacked expert weights (3-D) or a list of expert modules inside."""
    return any(p.dim() >= 3 for p in module.parameters()) or any(
        isinstance(m, nn.ModuleList) for m in module.modules())


def _inside(path: str, outer: str) -> bool:
    return path == outer or path.startswith(outer + ".")


def _relative(path: str, layer: int | None = None) -> str:
    """A path inside the layers' ModuleList without its leading layer index (``3.self_attn`` -> ``self_attn``)."""
    return path.split(".", 1)[1] if "." in path else ""


def find_submodule(root: nn.Module, dotted: str | None) -> nn.Module | None:
    """``root.a.b.c``, or None when ``dotted`` is None or any part is missing."""
    if dotted is None:
        return None
    module = root
    for part in dotted.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _sink_form(module: nn.Module, sink: Tensor, qk_dim: int, v_dim: int, n_heads: int, n_kv: int) -> str:
    """``column`` or ``rescale``: how the model's own eager function applies its learned sink.

    Runs the eager function on random queries and keys with a large sink logit: rows of its
    weights summing to 1 - phi mean an extra softmax column (gpt-oss), rows summing to 1 with an
    output scaled by sigmoid(LSE - b) mean the rescaling form (Granite-SWA); anything else is
    refused in one sentence.
    """
    eager = _family_eager(module)
    where = type(module).__name__
    if eager is None:
        raise SinkscopeError(f"{where} passes a learned sink to the attention interface but has no eager function "
                             "to read its form from; sinkscope cannot measure its phantom mass.")
    generator = torch.Generator().manual_seed(0)
    device, dtype = sink.device, torch.float32
    q = torch.randn(1, n_heads, 4, qk_dim, generator=generator).to(device, dtype)
    k = torch.randn(1, n_kv, 4, qk_dim, generator=generator).to(device, dtype)
    v = torch.randn(1, n_kv, 4, v_dim, generator=generator).to(device, dtype)
    per_query = sink.dim() == 4  # (B, H, T, 1): handed as ``sinks`` per query (Inkling2), else (H,) as ``s_aux``
    b = torch.full((1, n_heads, 4, 1) if per_query else tuple(sink.shape), 2.0, device=device, dtype=dtype)
    mask = torch.zeros(1, 1, 4, 4, device=device, dtype=dtype)
    saved = getattr(module, "sinks", None)
    try:
        with torch.no_grad():
            if isinstance(saved, nn.Parameter):
                module.sinks = nn.Parameter(b.to(saved.dtype), requires_grad=False)
            handed = {"sinks": b} if per_query else {"s_aux": b}
            out, weights = eager(module, q, k, v, mask, scaling=qk_dim ** -0.5, dropout=0.0, **handed)
    except Exception as error:  # noqa: BLE001 - an eager function we cannot call this way
        raise SinkscopeError(f"could not read how {where} applies its learned sink ({type(error).__name__}: "
                             f"{error}); sinkscope cannot measure its phantom mass.") from error
    finally:
        if isinstance(saved, nn.Parameter):
            module.sinks = saved
    if weights is None:
        raise SinkscopeError(f"{where}'s eager attention returns no weights, so the form of its learned sink cannot "
                             "be read; sinkscope cannot measure its phantom mass.")
    rows = weights.float().sum(-1)  # (1, H, 4)
    logits = torch.matmul(q, k.repeat_interleave(n_heads // n_kv, 1).transpose(-1, -2)) * qk_dim ** -0.5
    phi = torch.sigmoid(b.float().view(1, -1, 1) - torch.logsumexp(logits, -1)) if not per_query else \
        torch.sigmoid(b.float()[..., 0] - torch.logsumexp(logits, -1))  # (1, H, 4)
    if torch.allclose(rows, 1 - phi, atol=1e-4):
        return "column"
    plain = torch.matmul(torch.softmax(logits, -1), v.repeat_interleave(n_heads // n_kv, 1))  # (1, H, 4, Dv)
    if torch.allclose(rows, torch.ones_like(rows), atol=1e-4) and torch.allclose(
            out.float().transpose(1, 2), plain * (1 - phi).unsqueeze(-1), atol=1e-4):
        return "rescale"
    raise SinkscopeError(f"{where} applies its learned sink in a form sinkscope does not know (the eager rows sum "
                         "neither to 1 - phi nor to 1 with the output rescaled); sinkscope refuses to report its "
                         "phantom mass rather than report it wrong.")


# ---- output gates, and what cannot be found ---------------------------------------------------------------


def packed_sigmoid_gate(q_proj_out: Tensor, n_heads: int, head_dim: int) -> Tensor:
    """An output gate packed into ``q_proj`` (Qwen3-Next, Qwen3.5, Qwen4-exp), as ``sigmoid(gate)``.

    ``q_proj`` emits [query, gate] per head: (B, T, H * 2D) -> view (B, T, H, 2D) -> second
    half (modeling_qwen3_next.Qwen3NextAttention.forward, which then applies
    ``attn_output * sigmoid(gate)`` before ``o_proj``). ``discover`` keeps this reader only after
    checking on its traced pass that it gives exactly what W_O reads.
    """
    b, t, _ = q_proj_out.shape
    gate = q_proj_out.view(b, t, n_heads, 2 * head_dim)[..., head_dim:]  # (B, T, H, D)
    return torch.sigmoid(gate.float())


def sigmoid_gate(gate_proj_out: Tensor, n_heads: int, head_dim: int) -> Tensor:
    """An output gate read from its own projection, ``sigmoid(g)``, as (B, T, H, D).

    The projection emits one logit per head channel (B, T, H * D: AFMoE, Muse Spark, NeoMME,
    HY-V4) or one per head (B, T, H: LFM3, Dots3, Bailing; broadcast over the head's D channels,
    stride 0). ``discover`` keeps this reader only after checking, on its traced pass, that
    ``sigmoid(g) * attention output`` is exactly what W_O reads.
    """
    b, t, _ = gate_proj_out.shape
    gate = torch.sigmoid(gate_proj_out.float()).view(b, t, n_heads, -1)  # (B, T, H, D|1)
    return gate.expand(b, t, n_heads, head_dim)  # (B, T, H, D)


@dataclass(frozen=True)
class Quirk:
    """What discovery cannot find in a model type, declared, with the reason.

    Attributes:
        gate_module: path (from a decoder layer) of the module whose output holds an output gate.
        gate_reader: turns that output into (B, T, H, D) gate values in (0, 1).
        why: why it cannot be found by watching the forward pass.
    """

    gate_module: str | None = None
    gate_reader: Callable[[Tensor, int, int], Tensor] | None = None
    why: str = ""


#: the true quirks, by ``config.model_type``; everything else is found. Empty today: the output gate packed
#: into q_proj (Qwen3-Next), its one entry until 2026-12, is found and verified by :func:`_output_gate` like
#: every other sigmoid output gate.
QUIRKS: dict[str, Quirk] = {}


def _output_gate(in_layer: list[_Call], attn_call: _Call, record: _AttentionCall, out_proj: _Call, first: int,
                 n_heads: int) -> tuple[str | None, Callable | None, str | None]:
    """(gate module path, reader, None), or (None, None, why unread), or all None: W_O reads the attention output.

    An output gate shows as W_O's input z differing from the attention function's output a. It
    is read when one projection of the attention module's input, g, gives exactly
    z = sigmoid(g) * a, per channel (g: (B, T, H * D)), per head (g: (B, T, H)) or packed as the
    second half of each head's q_proj output (g: (B, T, H * 2D), Qwen3-Next); anything else
    (Dory's scaled sigmoid, Laguna's softplus, AXK2's gate split from a fused projection) is named
    unread, so no command reports the model as ungated.
    """
    a, z = record.output, out_proj.input
    if a is None or z is None or a.dim() != 4 or z.shape[:-1] != a.shape[:2] or z.shape[-1] != a[0, 0].numel():
        return None, None, None
    a, z = a.float(), z.float().view(a.shape)  # (B, T, H, Dv)
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(z).all())):
        return None, None, None  # a model with non-finite weights: the run's own check names the layer
    scale = float(a.abs().max()) or 1.0
    if torch.allclose(z, a, rtol=1e-4, atol=1e-6 * scale):
        return None, None, None
    B, T, H, D = a.shape
    for call in in_layer:
        g = call.output
        if not (_inside(call.path, attn_call.path) and call.path != attn_call.path and _has_matrix(call.module)
                and _same(call.input, attn_call.input) and g is not None and g.dim() == 3
                and g.shape[:2] == (B, T) and g.shape[-1] in (H * D, H, 2 * H * D)):
            continue
        reader = packed_sigmoid_gate if g.shape[-1] == 2 * H * D else sigmoid_gate
        gated = reader(g, n_heads, D) * a  # (B, T, H, Dv)
        if torch.allclose(gated, z, rtol=1e-4, atol=1e-5 * scale):
            return _relative(call.path, first), reader, None
    return None, None, ("W_O reads the attention output changed by something other than sigmoid(one projection of "
                        "the attention's input) (a scaled or softplus gate, a gate packed into another projection, "
                        "a norm), so sinkscope cannot read it as an output gate")


def _unknown_sink_parameters(module: nn.Module, known: Tensor | None) -> list[str]:
    """Parameters of an attention module named like a learned sink that the attention call does not carry."""
    names = []
    for name, parameter in module.named_parameters(recurse=False):
        if "sink" in name.lower() and (known is None or parameter.data_ptr() != known.data_ptr()):
            names.append(name)
    return names


def _discover(model: nn.Module) -> Parts:
    config = model.config
    model_type = getattr(config, "model_type", type(model).__name__)
    layers_path, layers = find_layers(model)
    calls, attention_calls, interface = _trace(model, layers, layers_path)
    if not attention_calls:
        return _discover_eager(model, model_type, layers_path, layers)
    path_of = {id(c.module): c.path for c in calls}
    by_layer: dict[int, list[_AttentionCall]] = {}
    for record in attention_calls:  # calls outside the decoder layers (a vision tower) are no layer's attention
        if record.layer is not None and id(record.module) in path_of:
            by_layer.setdefault(record.layer, []).append(record)
    if not by_layer:
        raise SinkscopeError(f"the {model_type!r} model calls attention only outside its decoder layers; sinkscope "
                             "cannot tell which layer each call belongs to.")
    first = min(by_layer)
    record = by_layer[first][0]  # the first module of the first such layer calling the interface
    attention = _relative(path_of[id(record.module)])
    attention_layers: dict[int, _AttentionCall] = {}
    for layer, records in by_layer.items():  # the same module path (or class) in every layer; others are not it
        here = find_submodule(layers[layer], attention) if attention else layers[layer]
        chosen = next((r for r in records if r.module is here), None) or next(
            (r for r in records if type(r.module) is type(record.module)), None)
        if chosen is not None:
            attention_layers[layer] = chosen
    for layer, call in attention_layers.items():
        LAYER_OF.setdefault(call.module, layer)
    layer_call = next((c for c in calls if c.module is layers[first]), None)
    in_layer = [c for c in calls if c.layer == first and c.module is not layers[first]]
    attn_call = next(c for c in in_layer if c.module is record.module)
    block_input = layer_call.input if layer_call is not None else None
    n_heads, n_kv = record.query[1], max(r.key[1] for r in attention_layers.values())
    qk_dim, v_dim = record.query[-1], record.value[-1]
    hidden = getattr(text_config(config), "hidden_size", None) or (block_input.shape[-1] if block_input is not None else 0)
    absent: dict[str, str] = {}
    if block_input is None or block_input.dim() != 3 or block_input.shape[-1] != hidden:
        for name in ("blocks.{l}.hook_resid_pre", "blocks.{l}.hook_resid_post", "blocks.{l}.hook_resid_mid"):
            absent[name] = ("the residual stream is not one (B, T, C) tensor between the layers (several streams, "
                            "hyper-connections)")

    # W_O: the first matrix the attention module applies after the attention function returned, to something
    # other than the attention's own input (a per-head gate projection g_proj(hidden) may come first: LFM3, Dots3)
    out_proj = None
    for call in in_layer:
        if _inside(call.path, attn_call.path) and call.path != attn_call.path and call.start > record.done \
                and _has_matrix(call.module) and call.input is not None and call.input.shape[-1] == n_heads * v_dim \
                and not _same(call.input, attn_call.input):
            out_proj = call
            break
    if out_proj is None:
        for name in ("blocks.{l}.attn.hook_z", "blocks.{l}.attn.hook_result"):
            absent[name] = "no output projection reading the heads' outputs was found"

    # ln1: the module whose output is what the attention module reads
    ln1 = None
    for call in in_layer:
        if call.end < attn_call.start and not _inside(call.path, attn_call.path) and _same(call.output, attn_call.input):
            if ln1 is None or len(call.path) < len(ln1.path):
                ln1 = call
    if ln1 is None:
        absent["blocks.{l}.ln1.hook_normalized"] = "the attention reads the residual stream without a norm module"
    elif ln1.output is None or ln1.output.shape[-1] != hidden:
        absent["blocks.{l}.ln1.hook_normalized"] = ("the attention's input norm is not a norm of the (B, T, C) residual "
                                                    "stream (Zamba's shared block reads it with the embeddings)")

    # attn_out: the chain of modules applied to the attention module's output
    end, normalised = attn_call, False
    calls_of = {}
    for c in in_layer:
        calls_of[id(c.module)] = calls_of.get(id(c.module), 0) + 1
    while True:
        nxt = next((c for c in in_layer if c.start > end.end and not _inside(c.path, attn_call.path)
                    and _same(c.input, end.output)), None)
        if nxt is None or nxt.output is None or calls_of[id(nxt.module)] > 1:
            break  # a module the layer calls twice (Phi's resid_dropout, on attention and MLP) is not attention's
        end, normalised = nxt, normalised or any(True for _ in nxt.module.parameters())

    if end.output is None or end.output.dim() != 3 or end.output.shape[-1] != hidden:
        for name in ("blocks.{l}.hook_attn_out", "blocks.{l}.hook_resid_mid"):
            absent[name] = "the attention's output is not what the block adds to a (B, T, C) residual stream"

    # the MLP: the largest remaining direct child of the layer called after attention
    chain = {end.path}
    children = [c for c in in_layer if "." not in _relative(c.path, first) and c.start > attn_call.end
                and c.path not in chain and c.path != attn_call.path and (ln1 is None or c.path != ln1.path)]
    mlp = max(children, key=lambda c: sum(p.numel() for p in c.module.parameters()), default=None)
    if mlp is not None and not any(True for _ in mlp.module.parameters()):
        mlp = None
    ln2, parallel = None, False
    if mlp is not None:
        candidates = [c for c in in_layer if not _inside(c.path, mlp.path) and c.end <= mlp.start
                      and _same(c.output, mlp.input) and not _inside(c.path, attn_call.path)]
        ln2 = min(candidates, key=lambda c: len(c.path), default=None)
        mlp_source = ln2.input if ln2 is not None else mlp.input
        parallel = _same(mlp_source, block_input) or (ln1 is not None and ln2 is not None and ln2.path == ln1.path) \
            or (ln1 is not None and _same(mlp.input, ln1.output))
    else:
        for name in ("blocks.{l}.mlp.hook_pre", "blocks.{l}.mlp.hook_pre_linear"):
            absent[name] = "no MLP module was found in the layer"
        absent.setdefault("blocks.{l}.hook_resid_mid", "the block has no MLP after its attention (one mixer per layer)")

    # the MLP's first projections
    mlp_pre = mlp_pre_linear = None
    if mlp is not None:
        if _is_moe(mlp.module):
            reason = "a mixture-of-experts MLP has no single pre-activation"
        else:
            reason = None
            firsts = [c for c in in_layer if _inside(c.path, mlp.path) and c.path != mlp.path and _has_matrix(c.module)
                      and _same(c.input, mlp.input)]
            acts = [c for c in in_layer if _inside(c.path, mlp.path) and _is_activation(c.module)]
            feeds = [f for f in firsts if any(_same(a.input, f.output) for a in acts)]
            if len(firsts) == 1 and (feeds or not acts):
                mlp_pre = firsts[0]
            elif len(firsts) == 1:
                reason = "the MLP's first projection is fused (gate and up in one matrix)"
            elif len(firsts) == 2 and len(feeds) == 1:
                mlp_pre = feeds[0]
                mlp_pre_linear = next(f for f in firsts if f is not mlp_pre)
            else:
                reason = "the MLP's first projections could not be told apart"
        if mlp_pre is None:
            absent["blocks.{l}.mlp.hook_pre"] = reason
        if mlp_pre_linear is None:
            absent["blocks.{l}.mlp.hook_pre_linear"] = reason or "the MLP is not gated"
    # a learned sink, and its form
    sink_form = None
    sinks = [r.sink for r in attention_layers.values() if r.sink is not None]
    if sinks:
        sink_form = _sink_form(record.module if record.sink is not None else next(
            r.module for r in attention_layers.values() if r.sink is not None), sinks[0], qk_dim, v_dim, n_heads,
            next(r.key[1] for r in attention_layers.values() if r.sink is not None))
    for layer, call in attention_layers.items():
        unknown = _unknown_sink_parameters(call.module, call.sink)
        if unknown:
            raise SinkscopeError(f"the attention of the {model_type!r} model (layer {layer}) has the parameter "
                                 f"{unknown[0]!r}, a learned sink the attention interface does not receive; sinkscope "
                                 "refuses to report its phantom mass as 0.")

    quirk = QUIRKS.get(model_type)
    gate_module, gate_reader, gate_unread = (quirk.gate_module, quirk.gate_reader, None) if quirk else (None, None, None)
    if quirk is None and out_proj is not None:
        gate_module, gate_reader, gate_unread = _output_gate(in_layer, attn_call, record, out_proj, first, n_heads)
    gate_call = next((c for c in in_layer if gate_module is not None and _relative(c.path, first) == gate_module), None)
    return Parts(
        model_type=model_type, label=type(model).__name__.replace("ForCausalLM", "") or model_type,
        layers=layers_path, attention=attention,
        out_proj=_relative(out_proj.path, first) if out_proj else None,
        ln1=_relative(ln1.path, first) if ln1 else None,
        attn_out=_relative(end.path, first), attn_out_normalised=normalised,
        ln2=_relative(ln2.path, first) if ln2 else None,
        mlp=_relative(mlp.path, first) if mlp else None,
        parallel=parallel,
        mlp_pre=_relative(mlp_pre.path, first) if mlp_pre else None,
        mlp_pre_linear=_relative(mlp_pre_linear.path, first) if mlp_pre_linear else None,
        out_proj_conv1d=out_proj is not None and type(out_proj.module).__name__ == "Conv1D",
        attention_layers=tuple(sorted(attention_layers)),
        n_heads=n_heads, n_kv_heads=n_kv, head_dim=v_dim, qk_head_dim=qk_dim, hidden_size=int(hidden),
        sink_form=sink_form, interface=interface,
        gate_module=gate_module, gate_reader=gate_reader, gate_unread=gate_unread,
        gate_after_attention=gate_call is not None and gate_call.start > record.done,
        window_kwarg=all(r.window_kwarg for r in attention_layers.values()),
        absent={k: v for k, v in absent.items() if v},
    )


# ---- the eager fallback: attention that does not call the interface ---------------------------------------

#: what the eager fallback reads, for the manifest, the run log and the report.
EAGER_FALLBACK = ("eager output_attentions (the model's attention does not call transformers' attention interface; "
                  "each layer's weights are materialised, memory quadratic in --seq-len)")
#: hook points the eager fallback cannot give, and why.
_NOT_UNDER_FALLBACK = "the attention does not call transformers' attention interface; sinkscope reads only its weights"


def _discover_eager(model: nn.Module, model_type: str, layers_path: str, layers: nn.ModuleList) -> Parts:
    """Parts of a model whose attention computes softmax weights itself (Bloom, Falcon, MPT, GPT-Neo, ...).

    One eager forward pass with ``output_attentions=True`` gives every softmax layer's weights
    (B, H, T, S); a layer's attention module is the module returning that tensor in its output. The
    capture then reads the weights from ``output_attentions`` on every pass (``attention.py``): the
    attention records hold weights only (no q, k, v), so the probes reading queries, keys or values,
    ``hook_v``, ``hook_z`` and the points around the attention module are absent. A model returning
    no attention weights has no softmax attention: one sentence.
    """
    outputs: dict[int, tuple[str, nn.Module]] = {}
    handles = []
    for name, module in layers.named_modules():
        if module is layers:
            continue

        def keep(mod, _args, out, name=name):
            for item in out if isinstance(out, tuple) else ():
                if isinstance(item, Tensor) and item.dim() == 4:
                    outputs.setdefault(item.data_ptr(), (name, mod))
        handles.append(module.register_forward_hook(keep))
    vocab = _vocab(model)
    ids = (torch.arange(DISCOVERY_TOKENS) % max(vocab - 1, 1) + 1).view(1, -1).to(input_device(model))
    try:
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=False, output_attentions=True)
    except Exception as error:  # noqa: BLE001 - a model that cannot return its weights
        raise SinkscopeError(f"the {model_type!r} model neither calls transformers' attention interface nor returns its "
                             f"attention weights ({type(error).__name__}); sinkscope cannot observe its attention."
                             ) from error
    finally:
        for handle in handles:
            handle.remove()
    weights = [w for w in (getattr(out, "attentions", None) or ()) if isinstance(w, Tensor)]
    if not weights:
        raise SinkscopeError(f"the {model_type!r} model has no softmax attention that sinkscope can observe (its layers "
                             "neither call transformers' attention interface nor return attention weights); attention "
                             "sinks are a property of softmax attention.")
    found = [outputs.get(w.data_ptr()) for w in weights]
    if all(f is not None for f in found) and len({f[0].split(".", 1)[0] for f in found}) == len(found):
        attention_layers = tuple(int(f[0].split(".", 1)[0]) for f in found)
        attention = _relative(found[0][0]) or None
    elif len(weights) == len(layers):  # one weight tensor per layer, in order
        attention_layers, attention = tuple(range(len(layers))), None
    else:
        raise SinkscopeError(f"the {model_type!r} model returns {len(weights)} attention weight tensors for {len(layers)} "
                             "layers and sinkscope cannot tell which layer each belongs to.")
    for f, layer in zip(found, attention_layers):
        if f is not None:
            LAYER_OF[f[1]] = layer
    config = text_config(model.config)
    n_heads = int(weights[0].shape[1])
    hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd", 0) or getattr(config, "d_model", 0))
    head_dim = hidden // n_heads if hidden else 0
    absent = {name: _NOT_UNDER_FALLBACK for name in (
        "blocks.{l}.attn.hook_v", "blocks.{l}.attn.hook_z", "blocks.{l}.attn.hook_result", "blocks.{l}.hook_attn_out",
        "blocks.{l}.hook_resid_mid", "blocks.{l}.ln1.hook_normalized", "blocks.{l}.mlp.hook_pre",
        "blocks.{l}.mlp.hook_pre_linear")}
    sinks = [n for n, _ in model.named_parameters() if "sink" in n.lower()]
    if sinks:
        raise SinkscopeError(f"the {model_type!r} model has the parameter {sinks[0]!r}, a learned sink, in attention that "
                             "does not call transformers' attention interface; sinkscope refuses to report its phantom "
                             "mass as 0.")
    return Parts(
        model_type=model_type, label=type(model).__name__.replace("ForCausalLM", "") or model_type,
        layers=layers_path, attention=attention, out_proj=None, ln1=None, attn_out=None, attn_out_normalised=False,
        ln2=None, mlp=None, parallel=False, mlp_pre=None, mlp_pre_linear=None, out_proj_conv1d=False,
        attention_layers=attention_layers, n_heads=n_heads, n_kv_heads=n_heads, head_dim=head_dim,
        qk_head_dim=head_dim, hidden_size=hidden, sink_form=None, interface=False, absent=absent)
