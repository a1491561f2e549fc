"""The model families sinkscope can observe, declared in one table.

Attention itself is observed through transformers' attention interface (``attention.py``),
the one seam every family below shares. What lives *outside* the attention function is
declared here per family: the module paths behind the named hook points (``hooks.py``: the
residual stream, the norms, the output projection, the MLP's first projection), which layers
have softmax attention at all, and where an output gate is computed (Qwen3-Next packs it into
``q_proj``). To add a family: add a row to ``FAMILIES`` and a tiny config to
``tests/tiny_models.py``; the conformance tests (tests/test_hooks.py and the probe references)
then cover it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from sinkscope.errors import SinkscopeError

if TYPE_CHECKING:  # torch is imported where it is used, so `sinkscope ls families` starts in a blink
    from torch import Tensor, nn


def _qwen3_next_gate(q_proj_out: Tensor, n_heads: int, head_dim: int) -> Tensor:
    """Qwen3-Next's output gate, read from ``q_proj``'s output, as ``sigmoid(gate)``.

    ``q_proj`` emits [query, gate] per head: (B, T, H * 2D) -> view (B, T, H, 2D) -> second
    half (modeling_qwen3_next.Qwen3NextAttention.forward, which then applies
    ``attn_output * sigmoid(gate)`` before ``o_proj``).
    """
    import torch

    b, t, _ = q_proj_out.shape
    gate = q_proj_out.view(b, t, n_heads, 2 * head_dim)[..., head_dim:]  # (B, T, H, D)
    return torch.sigmoid(gate.float())


@dataclass(frozen=True)
class Family:
    """Where a family keeps the parts the named hook points read (``capture/hooks.py``).

    Paths are dotted attribute paths. ``layers`` is relative to the CausalLM; the others are
    relative to one decoder layer. A path that a layer lacks (a linear-attention layer's
    ``self_attn``, a mixture-of-experts MLP's ``gate_proj``) means the point does not exist there.

    Attributes:
        model_type: ``config.model_type`` this row describes.
        label: human name used in messages.
        layers: the ``ModuleList`` of decoder layers.
        ln1: the attention's input norm (``ln1.hook_normalized`` is its output).
        attention: the attention module (its output, item 0, is the attention output).
        out_proj: the output projection W_O; its input is ``hook_z``, (B, T, H*D).
        attn_out: the module whose output is what the block adds to the residual stream
            (the attention module, or a post-attention norm/dropout after it).
        ln2: the MLP's input norm; its input is ``hook_resid_mid`` for sequential blocks.
        parallel_residual: config attribute that, when true, makes attention and MLP read the
            same ``resid_pre`` (GPT-NeoX ``use_parallel_residual``).
        mlp_pre: the module whose output is ``mlp.hook_pre`` (the activation's input).
        mlp_pre_linear: gated MLPs: the up projection (``mlp.hook_pre_linear``).
        out_proj_conv1d: W_O is a GPT-2 ``Conv1D`` (weight (in, out)) rather than ``nn.Linear``.
        attention_layer_type: if set, only layers whose ``config.layer_types[i]`` equals it
            have softmax attention (the others, e.g. Qwen3-Next's linear attention, emit no record).
        gate_module: path of the module whose output holds the output gate; ``gate_reader``
            turns that output into (B, T, H, D) gate values in (0, 1).
    """

    model_type: str
    label: str
    layers: str
    ln1: str = "input_layernorm"
    attention: str = "self_attn"
    out_proj: str = "self_attn.o_proj"
    attn_out: str = "self_attn"
    ln2: str = "post_attention_layernorm"
    parallel_residual: str | None = None
    mlp_pre: str | None = "mlp.gate_proj"
    mlp_pre_linear: str | None = "mlp.up_proj"
    out_proj_conv1d: bool = False
    attention_layer_type: str | None = None
    gate_module: str | None = None
    gate_reader: Callable[[Tensor, int, int], Tensor] | None = None


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in [
        Family("llama", "Llama (SmolLM2, Llama 2/3)", "model.layers"),
        Family("mistral", "Mistral", "model.layers"),
        Family("qwen2", "Qwen2", "model.layers"),
        Family("qwen3", "Qwen3", "model.layers"),
        Family("gemma3_text", "Gemma 3", "model.layers", attn_out="post_attention_layernorm",
               ln2="pre_feedforward_layernorm"),
        Family("gpt_neox", "GPT-NeoX (Pythia)", "gpt_neox.layers", attention="attention", out_proj="attention.dense",
               attn_out="post_attention_dropout", parallel_residual="use_parallel_residual",
               mlp_pre="mlp.dense_h_to_4h", mlp_pre_linear=None),
        Family("gpt2", "GPT-2", "transformer.h", ln1="ln_1", attention="attn", out_proj="attn.c_proj",
               attn_out="attn", ln2="ln_2", mlp_pre="mlp.c_fc", mlp_pre_linear=None, out_proj_conv1d=True),
        Family("gpt_oss", "gpt-oss (learned sinks)", "model.layers", mlp_pre=None, mlp_pre_linear=None),
        Family(
            "qwen3_next",
            "Qwen3-Next (output gate)",
            "model.layers",
            attention_layer_type="full_attention",
            gate_module="self_attn.q_proj",
            gate_reader=_qwen3_next_gate,
        ),
    ]
}


def supported_families() -> str:
    """A readable list of supported ``model_type`` values, for error messages."""
    return ", ".join(sorted(FAMILIES))


def family_of(model: nn.Module) -> Family:
    """The :class:`Family` row for a loaded model, or a one-sentence error."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FAMILIES:
        raise SinkscopeError(
            f"sinkscope does not support the architecture {model_type!r}; "
            f"supported model types are: {supported_families()}."
        )
    return FAMILIES[model_type]


def get_submodule(root: nn.Module, dotted: str) -> nn.Module:
    """``root.a.b.c`` for ``dotted == "a.b.c"``."""
    module = root
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


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


@dataclass(frozen=True)
class ModelSpec:
    """Sizes every probe needs, read once from the model's config.

    Attributes:
        family: ``config.model_type``.
        n_layers: L, decoder layers (including ones without softmax attention).
        n_heads: H, query heads.
        n_kv_heads: Hkv, key/value heads (value heads).
        head_dim: D.
        hidden_size: C, residual-stream width.
        attention_layers: indices of layers that emit an attention record.
        has_phantom: whether attention has a learned phantom key (gpt-oss sinks).
        has_output_gate: whether heads are gated before the output projection.
        has_value_gate: whether each value read is gated, g_j v_j (the trainer's ``normgate``,
            ``projgate``, ``sink+*``; ``routing-norm`` holds the same gate in the routing slot).
        vocab_size: rows of the input embedding (token ids are below it), when known.
    """

    family: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_size: int
    attention_layers: tuple[int, ...]
    has_phantom: bool
    has_output_gate: bool
    has_value_gate: bool = False
    vocab_size: int | None = None

    @classmethod
    def from_model(cls, model: nn.Module) -> "ModelSpec":
        """The spec of a transformers model, or the bundled trainer's own ``model_spec()``."""
        if hasattr(model, "model_spec"):
            return model.model_spec()
        family = family_of(model)
        config = model.config
        n_layers = config.num_hidden_layers
        n_heads = config.num_attention_heads
        n_kv = getattr(config, "num_key_value_heads", None) or n_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
        if family.attention_layer_type is not None:
            types = list(config.layer_types)
            layers = tuple(i for i, kind in enumerate(types) if kind == family.attention_layer_type)
        else:
            layers = tuple(range(n_layers))
        return cls(
            family=family.model_type,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=head_dim,
            hidden_size=config.hidden_size,
            attention_layers=layers,
            has_phantom=family.model_type == "gpt_oss",
            has_output_gate=family.gate_module is not None,
            vocab_size=getattr(config, "vocab_size", None),
        )


def layer_windows(model: nn.Module, n_layers: int) -> list[int | None]:
    """The sliding window W of each decoder layer (None: full attention), from the model's config.

    Trainer models: ``config.layer_window(l)`` (``layer_pattern``). Hugging Face models:
    ``config.layer_types`` (Gemma 3, gpt-oss: ``"sliding_attention"`` layers get
    ``config.sliding_window``); without ``layer_types`` every layer has ``sliding_window`` when
    it is set and not switched off (``use_sliding_window = False``, Qwen2), e.g. Mistral.
    """
    config = getattr(model, "config", None)
    if hasattr(config, "layer_window"):
        return [config.layer_window(layer) for layer in range(n_layers)]
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return [window if window and "sliding" in str(kind) else None for kind in list(types)[:n_layers]]
    if window and getattr(config, "use_sliding_window", True) is not False:
        return [int(window)] * n_layers
    return [None] * n_layers
