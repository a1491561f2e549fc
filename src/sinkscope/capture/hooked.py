"""A TransformerLens ``HookedTransformer`` (or SAELens's ``HookedSAETransformer``) measured through its own hooks.

TransformerLens 3 re-implements each architecture in its own modules, so transformers' attention
interface (sinkscope's capture) never runs. Its hook points carry TransformerLens's names, which are
sinkscope's (``capture/hooks.py``), so :class:`HookedModel` wraps the model in the protocol the
bundled trainer's model speaks (``model_spec()``, ``forward(ids, hooks=...)``: ``forward/runner.py``'s
native path) and, per forward pass, adds TransformerLens hooks for exactly the points the probes ask
for:

- ``blocks.{l}.attn`` (the :class:`~sinkscope.capture.record.AttentionRecord`): the weights are
  TransformerLens's own ``attn.hook_pattern`` (B, H, T, S), exactly as the model computed them;
  the queries and keys are ``attn.hook_rot_q``/``hook_rot_k`` (rotary) or ``hook_q``/``hook_k``
  (learned or sinusoidal positions), the values ``attn.hook_v``, the scale ``1 / cfg.attn_scale``,
  the window ``cfg.window_size`` on a local layer, the soft cap ``cfg.attn_scores_soft_cap``. With
  another position scheme (ALiBi) the record holds the weights only.
- ``attn.hook_v`` and ``attn.hook_z`` (observed and replaced: the value-read injection and head
  ablations act through TransformerLens hooks), ``hook_resid_pre/mid/post``, ``hook_attn_out``,
  ``ln1.hook_normalized``, ``mlp.hook_pre``, ``mlp.hook_pre_linear``, ``attn.hook_result`` (when
  ``cfg.use_attn_result``): the hook's own tensor, same names and shapes.

A point the model lacks is in ``ModelSpec.missing_hooks``, so a probe that reads it is left out of a
command's run with one line naming it (``run/measuring.available_probes``). A model with SAEs
attached (SAELens) is measured as it runs, SAEs included: they sit behind the same hook names.
The tokens go in as given (no BOS is prepended: ``return_type="logits"`` on token ids).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from sinkscope.capture import hooks as hp
from sinkscope.capture.families import ModelSpec
from sinkscope.capture.record import AttentionRecord
from sinkscope.errors import SinkscopeError, option

#: sinkscope's hook points that a HookedTransformer hook gives as they are (same name, same shape).
DIRECT = (hp.RESID_PRE, hp.RESID_MID, hp.RESID_POST, hp.ATTN_OUT, hp.LN1_NORMALIZED, hp.MLP_PRE, hp.MLP_PRE_LINEAR,
          hp.ATTN_RESULT, hp.ATTN_V, hp.ATTN_Z)
#: position schemes whose q and k hooks give the record's queries and keys (with their rotation).
_QK_SCHEMES = ("standard", "shortformer", "rotary")


#: TransformerLens's weight processing, with ``HookedTransformer.from_pretrained``'s defaults.
PROCESSING = {"fold_ln": True, "center_writing_weights": True, "center_unembed": True, "fold_value_biases": True,
              "refactor_factored_attn_matrices": False}


def processing_options(pairs) -> dict[str, bool]:
    """``--loader-option KEY=VALUE`` pairs as TransformerLens's processing keywords (true/false), or one sentence."""
    chosen = dict(PROCESSING)
    for pair in pairs or ():
        key, sep, value = str(pair).partition("=")
        key, value = key.strip().replace("-", "_"), value.strip().lower()
        if not sep or key not in PROCESSING or value not in ("true", "false", "1", "0"):
            raise SinkscopeError(f"{option('loader_option')} takes KEY=true|false with KEY one of "
                                 f"{', '.join(PROCESSING)} (got {pair!r}).")
        chosen[key] = value in ("true", "1")
    return chosen


def is_hooked_transformer(model) -> bool:
    """A TransformerLens ``HookedTransformer``-like model (its ``cfg``, ``hook_dict`` and ``blocks``), not a bridge."""
    if type(model).__name__ == "TransformerBridge":
        return False
    return all(hasattr(model, name) for name in ("cfg", "hook_dict", "blocks", "hooks")) and \
        isinstance(model, nn.Module) and hasattr(model.cfg, "n_layers") and hasattr(model.cfg, "d_head")


def attached_saes(model) -> list[str]:
    """The hook names an SAE is attached at (SAELens's ``HookedSAETransformer.acts_to_saes``), sorted."""
    return sorted(getattr(model, "acts_to_saes", {}) or {})


def is_wrapped(model) -> bool:
    """A :class:`HookedModel` (a HookedTransformer as sinkscope runs it)."""
    return isinstance(model, HookedModel)


class HookedModel(nn.Module):
    """A HookedTransformer in the trainer model's protocol (module docstring); ``tl`` is the model as given."""

    def __init__(self, tl: nn.Module):
        super().__init__()
        self.tl = tl
        cfg = tl.cfg
        self._rotary = getattr(cfg, "positional_embedding_type", "standard") == "rotary"
        self._qk = getattr(cfg, "positional_embedding_type", "standard") in _QK_SCHEMES
        self._names = set(tl.hook_dict)
        self.train(tl.training)  # the wrapper's mode is the model's (a run restores the mode it came in)

    # ---- what the model is ---------------------------------------------------------------------------------------
    def has_point(self, template: str, layer: int = 0) -> bool:
        """Whether the model has ``template``'s hook at ``layer`` (the attention record: its pattern)."""
        name = "blocks.{l}.attn.hook_pattern" if template == hp.ATTN else template
        return hp.name_at(name, layer) in self._names

    def model_spec(self) -> ModelSpec:
        """The sizes probes need, from ``cfg``; the points it lacks in ``missing_hooks``."""
        cfg = self.tl.cfg
        missing = tuple(t for t in (hp.ATTN, *DIRECT) if not self.has_point(t))
        mlp_kind = "gated" if self.has_point(hp.MLP_PRE_LINEAR) else "dense" if self.has_point(hp.MLP_PRE) else None
        n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        return ModelSpec(
            family=f"transformer_lens:{getattr(cfg, 'original_architecture', None) or type(self.tl).__name__}",
            n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=n_kv, head_dim=cfg.d_head,
            hidden_size=cfg.d_model, attention_layers=tuple(range(cfg.n_layers)), has_phantom=False,
            has_output_gate=False, vocab_size=cfg.d_vocab, mlp_kind=mlp_kind,
            missing_hooks=missing, mlp_width=getattr(cfg, "d_mlp", None) if mlp_kind else None,
            attention_path="interface" if self._qk else "transformer_lens_weights")

    def layer_windows(self, n_layers: int) -> list[int | None]:
        """Each layer's sliding window (``cfg.window_size`` on a ``"local"`` layer of ``cfg.attn_types``), else None."""
        cfg = self.tl.cfg
        kinds = list(getattr(cfg, "attn_types", None) or [None] * cfg.n_layers)
        window = getattr(cfg, "window_size", None)
        return [int(window) if window and kinds[layer] == "local" else None for layer in range(n_layers)]

    def record(self) -> dict:
        """What the manifest says of the model (``model.transformer_lens``): its class, and the hook names an SAE
        was attached at (SAELens), which the measurement saw."""
        return {"class": type(self.tl).__name__, "saes_at": attached_saes(self.tl)}

    @property
    def config(self):
        """``cfg`` (what ``run/`` reads a context from: ``n_ctx``)."""
        return self.tl.cfg

    def get_input_embeddings(self):
        """The token embedding (``embed``), for the device the ids go to and the vocabulary size."""
        return None

    # ---- one forward pass ------------------------------------------------------------------------------------------
    def forward(self, ids: Tensor, *, hooks: hp.HookSink | None = None, attention: str = "fused",
                tap=None) -> tuple[Tensor, None]:
        """Logits (B, T, V) of ``ids`` (B, T) with the hooks ``hooks`` asks for; ``attention`` is unused (the model
        computes its own attention, and the record holds its weights)."""
        fwd: list[tuple[str, Callable]] = []
        if hooks is not None:
            fwd = self._hooks(hooks)
        with self.tl.hooks(fwd_hooks=fwd):
            logits = self.tl(ids, return_type="logits")  # (B, T, V)
        return logits, None

    def _hooks(self, sink: hp.HookSink) -> list[tuple[str, Callable]]:
        observed, intervened = sink.observed, sink.intervened
        fwd: list[tuple[str, Callable]] = []
        cfg = self.tl.cfg
        for layer in range(cfg.n_layers):
            for template in DIRECT:
                if template in observed or template in intervened:
                    if template in (hp.ATTN_V,) and hp.ATTN in observed:
                        continue  # the record's hooks below handle the values too
                    fwd.append((hp.name_at(template, layer), self._point(sink, template, layer)))
            if hp.ATTN in observed:
                fwd += self._record_hooks(sink, layer)
        return fwd

    @staticmethod
    def _point(sink: hp.HookSink, template: str, layer: int) -> Callable:
        def hook(value: Tensor, hook=None) -> Tensor:
            if template in sink.intervened:
                replaced = sink.replace(template, layer, value)
                if tuple(replaced.shape) != tuple(value.shape):
                    raise ValueError(f"a {template} replacement must keep the shape {tuple(value.shape)}")
                value = replaced
            if template in sink.observed:
                sink.emit(template, layer, value.detach())
            return value
        return hook

    def _record_hooks(self, sink: hp.HookSink, layer: int) -> list[tuple[str, Callable]]:
        """Hooks that gather one layer's q, k, v and pattern and emit its record when the pattern arrives."""
        parts: dict[str, Tensor] = {}
        cfg = self.tl.cfg
        prefix = f"blocks.{layer}.attn."

        def keep(name: str) -> Callable:
            def hook(value: Tensor, hook=None) -> Tensor:
                parts[name] = value.detach()
                return value
            return hook

        def values(value: Tensor, hook=None) -> Tensor:  # (B, S, Hkv, D)
            if hp.ATTN_V in sink.intervened:
                value = sink.replace(hp.ATTN_V, layer, value)
            if hp.ATTN_V in sink.observed:
                sink.emit(hp.ATTN_V, layer, value.detach())
            parts["v"] = value.detach()
            return value

        def pattern(weights: Tensor, hook=None) -> Tensor:  # (B, H, T, S)
            sink.emit(hp.ATTN, layer, self._record(layer, weights, parts, cfg))
            parts.clear()
            return weights

        q, k = ("hook_rot_q", "hook_rot_k") if self._rotary else ("hook_q", "hook_k")
        fwd = [(prefix + "hook_v", values)]
        if self._qk:
            fwd += [(prefix + q, keep("q")), (prefix + k, keep("k"))]
        return fwd + [(prefix + "hook_pattern", pattern)]

    def _record(self, layer: int, weights: Tensor, parts: dict[str, Tensor], cfg) -> AttentionRecord:
        """The layer's record: TransformerLens's pattern as the weights, with q, k (B, H|Hkv, T|S, D) and v."""
        value = parts.get("v")
        value = None if value is None else value.transpose(1, 2)  # (B, Hkv, S, D)
        if not self._qk or "q" not in parts or "k" not in parts:
            return AttentionRecord(layer=layer, query=None, key=None, value=None, scale=float("nan"), mask=None,
                                   weights=weights.float())
        window = self.layer_windows(cfg.n_layers)[layer]
        softcap = getattr(cfg, "attn_scores_soft_cap", -1.0)
        scale = 1.0 / float(cfg.attn_scale) if getattr(cfg, "use_attn_scale", True) else 1.0
        return AttentionRecord(
            layer=layer, query=parts["q"].transpose(1, 2), key=parts["k"].transpose(1, 2), value=value,  # (B, H, T, D)
            scale=scale, mask=None, weights=weights.float(),
            sliding_window=window,
            softcap=float(softcap) if softcap and softcap > 0 and math.isfinite(softcap) else None)
