"""One prompt's internals, TransformerLens-style: ``sinkscope.trace(model, text)`` (docs/api.md).

A single forward pass through the same capture every probe uses (``capture/``, ``forward.runner``:
no second implementation of any model) keeps what the named hook points carry, keyed by
TransformerLens's names, on the CPU in float32, with the batch dimension of one prompt:

    blocks.{l}.hook_resid_pre / _mid / _post   (1, T, C)   the residual stream (capture/hooks.py)
    blocks.{l}.ln1.hook_normalized             (1, T, C)
    blocks.{l}.attn.hook_q                     (1, T, H, D)    from the attention record: q after RoPE
    blocks.{l}.attn.hook_k / hook_v            (1, S, Hkv, D)  k after RoPE, v before any gate
    blocks.{l}.attn.hook_attn_scores           (1, H, T, S)    s_ij = scale q_i.k_j (+ mask; -inf where hidden)
    blocks.{l}.attn.hook_pattern               (1, H, T, S)    a_ij over the real keys (rows sum to 1 - phi_i)
    blocks.{l}.attn.hook_phantom               (1, H, T)       phi_i, the learned sink's share (gpt-oss), if any
    blocks.{l}.attn.hook_z                     (1, T, H, D)    each head's output before the output projection
    blocks.{l}.hook_attn_out                   (1, T, C)
    blocks.{l}.mlp.hook_pre / hook_pre_linear  (1, T, F)
    blocks.{l}.hook_mlp_out                    (1, T, C)       resid_post - resid_mid: what the MLP adds

TransformerLens's ``hook_pattern`` is the softmax over the keys; where a model has a learned sink
(a phantom key, SPEC.md "Phantom mass") sinkscope's pattern is the share of the real keys and the
phantom's share is ``hook_phantom``, so the two sum to one. The names a model lacks (an
architecture without ``mlp.hook_pre``, ``hook_phantom`` without a sink) are absent, as
``sinkscope ls hooks MODEL`` says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor

from sinkscope.capture import hooks as hp
from sinkscope.capture.families import ModelSpec
from sinkscope.capture.record import MASKED_BELOW, AttentionRecord
from sinkscope.errors import SinkscopeError, suggest
from sinkscope.probes.base import Probe

#: the record-derived names, per layer (what ``blocks.{l}.attn`` gives a trace)
FROM_RECORD = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores", "attn.hook_pattern",
               "attn.hook_phantom")
#: the names a trace gives, per layer, with the hook point each comes from
TRACE_NAMES: dict[str, str] = {
    "hook_resid_pre": hp.RESID_PRE, "ln1.hook_normalized": hp.LN1_NORMALIZED,
    **{name: hp.ATTN for name in FROM_RECORD},
    "attn.hook_z": hp.ATTN_Z, "hook_attn_out": hp.ATTN_OUT, "hook_resid_mid": hp.RESID_MID,
    "mlp.hook_pre": hp.MLP_PRE, "mlp.hook_pre_linear": hp.MLP_PRE_LINEAR, "hook_mlp_out": hp.RESID_POST,
    "hook_resid_post": hp.RESID_POST,
}


class Trace(Mapping):
    """One prompt's kept tensors by TransformerLens name (a read-only mapping), its token ids and texts.

    ``trace["blocks.0.attn.hook_pattern"]`` is a (1, H, T, S) float32 CPU tensor; ``trace.tokens``
    (1, T) the ids read; ``trace.str_tokens`` each token's text; ``trace.stack("attn.hook_pattern")``
    one name over every layer that has it, stacked on a new first dimension (L, ...);
    ``trace.pattern(l)`` and ``trace.scores(l)`` a layer's weights and scores.
    """

    def __init__(self, tensors: dict[str, Tensor], tokens: Tensor, str_tokens: list[str] | None):
        self._tensors, self.tokens, self.str_tokens = tensors, tokens, str_tokens

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._tensors:
            raise KeyError(f"{name!r} is not in this trace{suggest(name, self._tensors)}")
        return self._tensors[name]

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def stack(self, suffix: str) -> Tensor:
        """``blocks.{l}.<suffix>`` of every layer that has it, stacked (L', ...) in layer order."""
        layers = sorted(int(name.split(".")[1]) for name in self._tensors
                        if name.startswith("blocks.") and name.split(".", 2)[2] == suffix)
        if not layers:
            raise KeyError(f"no layer of this trace has {suffix!r}")
        return torch.stack([self._tensors[f"blocks.{layer}.{suffix}"] for layer in layers])

    def pattern(self, layer: int) -> Tensor:
        """Layer ``layer``'s attention weights (1, H, T, S): ``blocks.{layer}.attn.hook_pattern``."""
        return self[f"blocks.{layer}.attn.hook_pattern"]

    def scores(self, layer: int) -> Tensor:
        """Layer ``layer``'s attention scores (1, H, T, S), -inf where hidden: ``blocks.{layer}.attn.hook_attn_scores``."""
        return self[f"blocks.{layer}.attn.hook_attn_scores"]

    def __repr__(self) -> str:
        return f"Trace({len(self._tensors)} tensors over {self.tokens.shape[-1]} tokens)"


def _wanted(names) -> Callable[[str], bool]:
    """``names``: None (everything), a name or template suffix, a list of them, or a predicate."""
    if names is None:
        return lambda name: True
    if callable(names):
        return names
    given = [names] if isinstance(names, str) else list(names)
    known = set(TRACE_NAMES)
    for name in given:
        suffix = name.split(".", 2)[2] if name.startswith("blocks.") and name.count(".") >= 2 else name
        if suffix not in known:
            raise SinkscopeError(f"a trace has no {name!r}{suggest(suffix, known)}; names: "
                                 f"{', '.join(sorted(known))} (each as blocks.L.NAME or for every layer).")
    return lambda name: any(name == g or name.split(".", 2)[2] == g for g in given)


class _Collector(Probe):
    """Keeps what the hook points carry for one batch (not a registered probe: it writes no rows)."""

    name = "trace"
    metrics: dict = {}

    def setup(self) -> None:
        self.kept: dict[str, Tensor] = {}
        self.mid: dict[int, Tensor] = {}

    def _keep(self, name: str, value: Tensor) -> None:
        if self.wanted(name):
            self.kept[name] = value.detach().float().cpu().clone()

    def point(self, template: str) -> Callable[[int, Tensor], None]:
        suffixes = [s for s, t in TRACE_NAMES.items() if t == template and s not in FROM_RECORD]

        def observe(layer: int, value: Tensor) -> None:
            if template == hp.RESID_MID:
                self.mid[layer] = value.detach().float().cpu()
            for suffix in suffixes:
                if suffix == "hook_mlp_out":
                    if layer in self.mid and self.wanted(f"blocks.{layer}.hook_mlp_out"):
                        self.kept[f"blocks.{layer}.hook_mlp_out"] = value.detach().float().cpu() - self.mid[layer]
                else:
                    self._keep(f"blocks.{layer}.{suffix}", value)
        return observe

    def attention(self, layer: int, record: AttentionRecord) -> None:
        prefix = f"blocks.{layer}.attn."
        if record.weights_only:  # the eager fallback holds the weights only
            self._keep(prefix + "hook_pattern", record.weights)
            return
        self._keep(prefix + "hook_q", record.query.transpose(1, 2))  # (B, T, H, D)
        self._keep(prefix + "hook_k", record.key.transpose(1, 2))  # (B, S, Hkv, D)
        self._keep(prefix + "hook_v", record.value.transpose(1, 2))  # (B, S, Hkv, D)
        if not any(self.wanted(prefix + s) for s in ("hook_attn_scores", "hook_pattern", "hook_phantom")):
            return
        s = record.logits()  # (B, H, T, S) float32, hidden keys at the mask's large negative value
        self._keep(prefix + "hook_attn_scores", s.masked_fill(s <= MASKED_BELOW, float("-inf")))  # hidden: -inf
        real = record.real_mass()  # (B, H, T): 1 - phi_i
        self._keep(prefix + "hook_pattern", torch.softmax(s, dim=-1) * real.unsqueeze(-1))
        if record.has_phantom:
            self._keep(prefix + "hook_phantom", 1 - real)

    def rows(self) -> list:
        return []


def collector(spec: ModelSpec, names=None) -> Probe:
    """A probe instance that keeps the asked names (:func:`_wanted`) of one batch."""
    wanted = _wanted(names)
    templates = {template for suffix, template in TRACE_NAMES.items()
                 if template in spec_points(spec) and any(wanted(f"blocks.{layer}.{suffix}")
                                                          for layer in range(spec.n_layers))}
    if any(wanted(f"blocks.{layer}.hook_mlp_out") for layer in range(spec.n_layers)):
        templates |= {hp.RESID_MID, hp.RESID_POST} & spec_points(spec)
    observers = {t: ("_attention" if t == hp.ATTN else f"_point_{i}") for i, t in enumerate(sorted(templates))}
    cls = type("TraceCollector", (_Collector,), {"observers": observers, "interventions": {},
                                                 "hooks": tuple(sorted(templates))})
    probe = cls(spec)
    probe.wanted = wanted
    for template, method in observers.items():
        setattr(probe, method, probe.attention if template == hp.ATTN else probe.point(template))
    return probe


def spec_points(spec: ModelSpec) -> set[str]:
    """The hook-point templates this model has."""
    return set(hp.HOOK_POINTS) - set(spec.missing_hooks)


def trace_ids(model: torch.nn.Module, ids: Tensor, tokenizer=None, *, names=None, attention: str = "fused",
              device=None) -> Trace:
    """Run ``ids`` (1, T) through ``model`` once with the capture and keep the asked names (module docstring)."""
    from sinkscope.forward.runner import run_probes

    spec = ModelSpec.from_model(model)
    probe = collector(spec, names)
    if not probe.hooks:
        raise SinkscopeError("none of the asked names is a hook point this model has (`sinkscope ls hooks MODEL`).")
    was_training = model.training
    try:
        run_probes(model.eval(), ids.cpu().numpy(), [probe], batch_size=1, device=device, progress=False,
                   attention=attention)
    finally:
        model.train(was_training)
    texts = None
    if tokenizer is not None:
        texts = [tokenizer.decode([int(i)], skip_special_tokens=False, clean_up_tokenization_spaces=False)
                 for i in ids[0].tolist()]
    return Trace(dict(sorted(probe.kept.items(), key=lambda kv: _order(kv[0]))), ids.cpu(), texts)


def _order(name: str) -> tuple:
    parts = name.split(".", 2)
    suffixes = list(TRACE_NAMES)
    return (int(parts[1]), suffixes.index(parts[2]) if parts[2] in suffixes else len(suffixes)) if parts[0] == "blocks" \
        else (-1, 0)


def as_ids(text_or_ids, tokenizer, bos: bool | None = None) -> Tensor:
    """Token ids (1, T) int64 of a prompt: a text (tokenised as the model's tokenizer does, its BOS by its own
    rule) or ids (a list, an array or a tensor, one prompt)."""
    if isinstance(text_or_ids, str):
        if tokenizer is None:
            raise SinkscopeError("a text needs a tokenizer: pass tokenizer=, or token ids.")
        ids = tokenizer(text_or_ids, add_special_tokens=True if bos is None else bos)["input_ids"]
        if not ids:
            raise SinkscopeError("the text gives no tokens.")
        return torch.tensor([ids], dtype=torch.int64)
    ids = torch.as_tensor(text_or_ids.detach().cpu() if isinstance(text_or_ids, Tensor) else list(text_or_ids)
                          if not hasattr(text_or_ids, "shape") else text_or_ids)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 1 or ids.is_floating_point():
        raise SinkscopeError(f"a trace reads one prompt: token ids of shape (T,) or (1, T), not {tuple(ids.shape)}.")
    return ids.long()


def names_of(points: Iterable[str], n_layers: int) -> list[str]:
    """Every concrete trace name of a model with these hook points (for listings)."""
    return [f"blocks.{layer}.{suffix}" for layer in range(n_layers) for suffix, t in TRACE_NAMES.items()
            if t in points]
