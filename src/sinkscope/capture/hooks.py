"""The named hook points a probe can ask for, with their shapes (TransformerLens's names).

Every model sinkscope measures exposes the same points, declared once per Hugging Face family
(``families.py``) and emitted natively by the bundled trainer. A probe lists the points it
reads (and the ones it intervenes on); the capture installs only those hooks and keeps nothing
that no probe asked for. ``{l}`` stands for the decoder layer index.

Shape letters: B windows, T positions (queries), S key positions (S == T), H query heads,
Hkv key/value heads, D head dim, C residual width, F MLP width.

Intervention points (``INTERVENABLE``): a probe may return a replacement of the same shape,
which the model then uses inside the same forward pass:

- ``blocks.{l}.attn.hook_v``: the value vectors before they are mixed (and before any value
  gate of the trainer's variants, so the gate sees the replacement);
- ``blocks.{l}.attn.hook_z``: each head's output before the output projection (zeroing a
  head's slice removes exactly that head's contribution ``hook_result[..., h, :]``);
- ``blocks.{l}.hook_resid_post``: the residual stream leaving block l, which every later block
  reads (setting massive activations to zero or to their mean, Sun et al. 2024).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sinkscope.errors import SinkscopeError, suggest

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class HookPoint:
    """One named hook point.

    Attributes:
        name: the template, e.g. ``blocks.{l}.hook_resid_pre`` (``tokens`` and ``loss`` have no layer).
        shape: the shape of what a probe receives.
        what: one line saying what it is.
        per_layer: whether the name carries a layer index.
    """

    name: str
    shape: str
    what: str

    @property
    def per_layer(self) -> bool:
        return "{l}" in self.name


TOKENS = "tokens"
LOSS = "loss"
RESID_PRE = "blocks.{l}.hook_resid_pre"
RESID_MID = "blocks.{l}.hook_resid_mid"
RESID_POST = "blocks.{l}.hook_resid_post"
LN1_NORMALIZED = "blocks.{l}.ln1.hook_normalized"
ATTN = "blocks.{l}.attn"
ATTN_V = "blocks.{l}.attn.hook_v"
ATTN_Z = "blocks.{l}.attn.hook_z"
ATTN_RESULT = "blocks.{l}.attn.hook_result"
ATTN_OUT = "blocks.{l}.hook_attn_out"
MLP_PRE = "blocks.{l}.mlp.hook_pre"
MLP_PRE_LINEAR = "blocks.{l}.mlp.hook_pre_linear"

HOOK_POINTS: dict[str, HookPoint] = {p.name: p for p in [
    HookPoint(TOKENS, "(B, T) int64", "the token ids of the batch"),
    HookPoint(RESID_PRE, "(B, T, C)", "residual stream entering block l"),
    HookPoint(LN1_NORMALIZED, "(B, T, C)", "the attention's normalised input (output of the block's first norm)"),
    HookPoint(ATTN, "AttentionRecord", "the attention record: q, k after RoPE, v, scale, mask/window, phantom logit, "
                                       "value gate, output gate, LSE (capture/record.py)"),
    HookPoint(ATTN_V, "(B, S, Hkv, D)", "value vectors before mixing and before any value gate"),
    HookPoint(ATTN_Z, "(B, T, H, D)", "per-head output before the output projection, after any output gate "
                                      "(zero a head here to remove it)"),
    HookPoint(ATTN_RESULT, "(B, T, H, C)", "per-head contribution z_h W_O[h] to the output projection; the sum over "
                                           "heads plus the projection's bias is its output (exact head subtraction)"),
    HookPoint(ATTN_OUT, "(B, T, C)", "the attention output added to the residual stream (after Gemma 3's "
                                     "post-attention norm)"),
    HookPoint(RESID_MID, "(B, T, C)", "residual stream after attention: resid_pre + attn_out (for parallel-residual "
                                      "blocks, GPT-NeoX/Pythia, this sum, though the MLP reads resid_pre)"),
    HookPoint(MLP_PRE, "(B, T, F)", "MLP pre-activation: the activation's input (GPT-2 c_fc, NeoX dense_h_to_4h, "
                                    "gated MLPs gate_proj); absent for mixture-of-experts MLPs"),
    HookPoint(MLP_PRE_LINEAR, "(B, T, F)", "gated MLPs only: the up projection up_proj"),
    HookPoint(RESID_POST, "(B, T, C)", "residual stream leaving block l (= resid_pre of block l + 1)"),
    HookPoint(LOSS, "(B, T-1) float32", "next-token cross-entropy at each position i, predicting token i + 1"),
]}

#: the points whose value a probe may replace inside the forward pass.
INTERVENABLE = frozenset({ATTN_V, ATTN_Z, RESID_POST})

_LAYER_NAME = re.compile(r"^blocks\.(\d+)\.(.+)$")


def name_at(template: str, layer: int | None) -> str:
    """The concrete name of a template at a layer: ``name_at(RESID_PRE, 3) == 'blocks.3.hook_resid_pre'``."""
    return template.replace("{l}", str(layer)) if layer is not None else template


def parse(name: str) -> tuple[str, int | None]:
    """(template, layer) of a concrete or template name; a one-sentence error for unknown names."""
    if name in HOOK_POINTS:
        return name, None
    match = _LAYER_NAME.match(name)
    if match and f"blocks.{{l}}.{match.group(2)}" in HOOK_POINTS:
        return f"blocks.{{l}}.{match.group(2)}", int(match.group(1))
    raise SinkscopeError(f"unknown hook point {name!r}{suggest(name, HOOK_POINTS)}; see `sinkscope ls hooks`.")


class HookSink(Protocol):
    """What receives the hook points: the runner's dispatcher, for a captured model and for the trainer's.

    ``observed`` and ``intervened`` are the hook-point templates (above) asked for; ``emit``
    receives an observed point's value, ``replace`` returns the value to use in place of an
    intervened one (the same object when nothing changes). A sink that runs several passes
    through one capture (the runner's pass switch) may also have ``live_observed`` and
    ``live_intervened``, the current pass's subsets: the capture installs hooks for ``observed``
    but computes a point, or builds an attention record, only where the current pass reads it.
    A sink with ``attention_function`` set runs sinkscope's attention function even when it
    observes no record (a command's second stage, whose loss is compared with the first stage's).
    ``record_columns`` (optional) names the extra columns a fused attention record should carry
    (``"value_gate"``, ``"quiet"``).
    """

    observed: frozenset[str]
    intervened: frozenset[str]

    def emit(self, template: str, layer: int | None, value) -> None: ...

    def replace(self, template: str, layer: int, value: Tensor) -> Tensor: ...


#: the names ``sinkscope.trace`` derives from the attention record and the residual stream, by TransformerLens's
#: names, with their shape and what each is (``sinkscope ls hooks``; ``forward/trace.py`` gives them)
TRACE_DERIVED = {
    "blocks.{l}.attn.hook_q": ("(B, T, H, D)", "queries after RoPE, from the attention record (sinkscope.trace)"),
    "blocks.{l}.attn.hook_k": ("(B, S, Hkv, D)", "keys after RoPE, from the attention record (sinkscope.trace)"),
    "blocks.{l}.attn.hook_v": ("(B, S, Hkv, D)", "values before any gate, from the attention record (sinkscope.trace)"),
    "blocks.{l}.attn.hook_attn_scores": ("(B, H, T, S)", "scale q.k plus the mask, -inf where hidden (sinkscope.trace)"),
    "blocks.{l}.attn.hook_pattern": ("(B, H, T, S)", "the attention weights over the real keys (sinkscope.trace)"),
    "blocks.{l}.attn.hook_phantom": ("(B, H, T)", "a learned sink's share of each row, where there is one "
                                                  "(sinkscope.trace)"),
    "blocks.{l}.hook_mlp_out": ("(B, T, C)", "what the MLP adds to the residual stream: resid_post - resid_mid "
                                             "(sinkscope.trace)"),
}
