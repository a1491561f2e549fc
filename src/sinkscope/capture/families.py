"""A model's discovered parts (``family_of``) and the sizes every probe needs (``ModelSpec``).

Attention is observed through transformers' attention interface (``attention.py``); the parts
outside it (the decoder layers, the attention module, its output projection, the norms, the
residual order, the MLP's first projections, the softmax-attention layers, a learned sink and its
form) are **found** by watching one forward pass (``discover.py``, which also declares the true
quirks, ``discover.QUIRKS``, each with the reason it cannot be found; none is left today). This module is
discovery's facade for the rest of sinkscope: :func:`family_of`, :class:`ModelSpec` (the sizes every
probe needs) and the sliding windows per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinkscope.errors import SinkscopeError

if TYPE_CHECKING:  # torch is imported where it is used, so `sinkscope ls families` starts in a blink
    from torch import nn


#: the model types sinkscope was first written for (named in messages; every causal LM is tried).
FIRST_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gpt_neox", "gpt2", "gpt_oss", "qwen3_next")

def supported_families() -> str:
    """What sinkscope measures, for messages: any causal LM whose attention it can observe."""
    return ("any transformers causal LM with softmax attention (found by watching one forward pass; "
            "`sinkscope ls families` lists the verified model types)")


def family_of(model: nn.Module):
    """The :class:`~sinkscope.capture.discover.Parts` of a loaded transformers model, or a one-sentence error."""
    from sinkscope.capture.discover import discover

    if getattr(model, "config", None) is None:
        raise SinkscopeError(f"a {type(model).__name__} is not a transformers model (it has no config); sinkscope "
                             "measures transformers causal LMs and its own trainer's checkpoints.")
    return discover(model)


def get_submodule(root: nn.Module, dotted: str) -> nn.Module:
    """``root.a.b.c`` for ``dotted == "a.b.c"``."""
    module = root
    for part in dotted.split("."):
        module = getattr(module, part)
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
        mlp_kind: ``"gated"`` (``mlp.hook_pre`` and ``hook_pre_linear``), ``"dense"`` (``hook_pre``
            only) or None (no pre-activation point: a mixture of experts, a fused projection).
        attn_out_normalised: the block normalises the attention output before adding it (Gemma's
            post-attention norm), so removing a head from ``hook_attn_out`` is not a subtraction.
        missing_hooks: hook-point templates the model lacks (``discover.Parts.absent``).
        attention_path: ``"interface"`` (the attention calls transformers' attention interface:
            fused and explicit records) or ``"eager"`` (``discover.EAGER_FALLBACK``: records hold the
            model's weights from ``output_attentions`` only, memory quadratic in the sequence length).
        output_gate_unread: why sinkscope cannot read an output gate the model has: W_O reads the
            attention output changed by something that is not ``sigmoid`` of one projection
            (``discover.Parts.gate_unread``); None when there is none or it is read.
        mlp_width: F, the width of ``mlp.hook_pre`` (the first layer's projection's output features), when
            known: ``mlp_pca`` states its memory from it before the first window (None: at the first window).
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
    mlp_kind: str | None = "dense"
    attn_out_normalised: bool = False
    missing_hooks: tuple[str, ...] = ()
    attention_path: str = "interface"
    output_gate_unread: str | None = None
    mlp_width: int | None = None

    @classmethod
    def from_model(cls, model: nn.Module) -> "ModelSpec":
        """The spec of a transformers model (its discovered parts), or the bundled trainer's ``model_spec()``."""
        if hasattr(model, "model_spec"):
            return model.model_spec()
        from sinkscope.capture.discover import text_config

        parts = family_of(model)
        return cls(
            family=parts.model_type,
            n_layers=len(get_submodule(model, parts.layers)),
            n_heads=parts.n_heads,
            n_kv_heads=parts.n_kv_heads,
            head_dim=parts.head_dim,
            hidden_size=parts.hidden_size,
            attention_layers=parts.attention_layers,
            has_phantom=parts.sink_form is not None,
            has_output_gate=parts.gate_module is not None,
            vocab_size=getattr(text_config(model.config), "vocab_size", None),
            mlp_kind="gated" if parts.mlp_pre_linear else "dense" if parts.mlp_pre else None,
            attn_out_normalised=parts.attn_out_normalised,
            missing_hooks=tuple(sorted(parts.absent)),
            attention_path="interface" if parts.interface else "eager",
            output_gate_unread=parts.gate_unread,
            mlp_width=_mlp_width(model, parts.layers, parts.mlp_pre),
        )


def _mlp_width(model: nn.Module, layers: str, pre: str | None) -> int | None:
    """The output width of the first layer's ``mlp.hook_pre`` module (``out_features``; GPT-2's Conv1D: ``nf``)."""
    if pre is None:
        return None
    try:
        module = get_submodule(get_submodule(model, layers)[0], pre)
    except (AttributeError, IndexError, TypeError):
        return None
    width = getattr(module, "out_features", None) or getattr(module, "nf", None)
    return int(width) if isinstance(width, int) else None


def layer_windows(model: nn.Module, n_layers: int) -> list[int | None]:
    """The sliding window W of each decoder layer (None: full attention), from the model's config.

    Trainer models: ``config.layer_window(l)`` (``layer_pattern``). Hugging Face models:
    ``config.layer_types`` (Gemma 3, gpt-oss: ``"sliding_attention"`` layers get
    ``config.sliding_window``); without ``layer_types`` every layer has ``sliding_window`` when
    it is set and not switched off (``use_sliding_window = False``, Qwen2), e.g. Mistral.
    """
    if callable(getattr(model, "layer_windows", None)):  # a HookedTransformer (capture/hooked.py) says itself
        return model.layer_windows(n_layers)
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
