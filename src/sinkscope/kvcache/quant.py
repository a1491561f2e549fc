"""b-bit quantisation of a key-value cache (SPEC.md "Quantised KV caches"; KIVI, Liu et al. 2024).

Asymmetric uniform quantisation per group of ``g`` elements (SPEC.md)::

    scale = (max - min) / (2^b - 1)      over the group
    q     = round((x - min) / scale)     an integer in 0 .. 2^b - 1 (round half to even, torch.round)
    x'    = q * scale + min              what the cache gives back

computed in float32 and returned in the input's dtype. A group whose elements are all equal
(scale 0) gives them back exactly. Round-to-nearest bounds the round trip:
``|x - x'| <= scale / 2`` per element (plus float32 rounding), :func:`error_bound`.

Group layouts (``scheme``), on a cache of shape (B, H_kv, S, D) (S slots, D channels):

- ``kivi`` (KIVI's cache, ``models/llama_kivi.py``, with a residual length ``R``, a multiple of
  ``g``; default ``R = g``): keys per channel along the token axis (each channel of ``g``
  consecutive tokens is a group: keys have outlier *channels*); new keys wait in full precision
  until ``R`` have gathered, then those ``R`` are quantised (:func:`complete_groups`). Values per
  token along the channel axis (``g`` consecutive channels of one token); the values of the ``R``
  most recent tokens always stay in full precision, a sliding window, and a value is quantised
  when it leaves it (``slots.quantise_slots``).
- ``kivi-grouped`` (sinkscope's variant, the rule before KIVI's residual): keys as ``kivi`` with
  ``R = g``, and each value is quantised together with its key, so just after a group completes no
  recent value is exact.
- ``per-token``: keys and values both per token along the channel axis, every token at once.

Along the channel axis a group longer than D is the whole head (D channels); a D that ``g`` does
not divide ends in one shorter group. 16 bits means no quantisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sinkscope.errors import SinkscopeError, option

#: how far a quantised perplexity moved when every input embedding moved by one float32 ulp: the largest change
#: of one document's perplexity, SmolLM2-135M-Instruct, 4 documents x 512 tokens, full cache, group 64
#: (``benchmarks/bench_kv_noise.py``; SPEC.md "Quantised KV caches", noise). A smaller difference is not an effect.
LAST_BIT_SENSITIVITY = "0.006% at 8 bits, 0.2% at 4 bits and 4% at 2 bits (per-token; kivi 0.003%, 0.012%, 0.4%)"

#: the bit widths a run may ask for; 16 = not quantised (the reference).
BITS = (16, 8, 4, 3, 2)
#: group layouts (module docstring).
SCHEMES = ("kivi", "kivi-grouped", "per-token")
#: the layouts that group keys per channel along the token axis.
ALONG_TOKENS = ("kivi", "kivi-grouped")
#: 16 bits: the cache as the model keeps it.
FULL_PRECISION = 16


@dataclass(frozen=True)
class KVQuant:
    """One quantisation setting: ``bits`` per element, groups of ``group`` elements, the ``scheme`` layout,
    and ``kivi``'s residual length ``residual`` (0: the group size)."""

    bits: int = FULL_PRECISION
    group: int = 64
    scheme: str = "kivi"
    residual: int = 0

    def __post_init__(self):
        if self.bits not in BITS:
            raise SinkscopeError(f"the cache quantises to {', '.join(map(str, BITS[1:]))} bits, or 16 (none); not {self.bits}.")
        if self.group < 2:
            raise SinkscopeError(f"a quantisation group holds at least 2 elements (got {self.group}).")
        if self.scheme not in SCHEMES:
            raise SinkscopeError(f"unknown quantisation scheme {self.scheme!r}; use {' or '.join(SCHEMES)}.")
        if self.scheme == "kivi":
            check_residual(self.residual, self.group)

    @property
    def residual_length(self) -> int:
        """KIVI's ``R``: the full-precision keys that gather before a quantisation step, and the recent
        values held exact (``kivi``); the group size for ``kivi-grouped``; 0 (none) for ``per-token``."""
        if self.scheme == "kivi":
            return self.residual or self.group
        return self.group if self.scheme == "kivi-grouped" else 0

    @property
    def values_follow_keys(self) -> bool:
        """``kivi-grouped`` and ``per-token`` quantise a value with its key; ``kivi`` by its own window."""
        return self.scheme != "kivi"

    @property
    def active(self) -> bool:
        """False at 16 bits: nothing is quantised."""
        return self.bits != FULL_PRECISION

    @property
    def keys_along_tokens(self) -> bool:
        """KIVI groups keys per channel along the token axis; ``per-token`` along the channels."""
        return self.scheme in ALONG_TOKENS

    @property
    def label(self) -> str:
        return "16-bit" if not self.active else f"{self.bits}-bit {self.scheme} g{self.group}"


def check_residual(residual: int, group: int) -> None:
    """KIVI's residual length is a whole number of key groups (0: the group size); else one sentence."""
    if residual < 0 or residual % group:
        raise SinkscopeError(f"kivi's residual length ({option('kv_residual')}) must be a multiple of the group size "
                             f"{group} (got {residual}): KIVI quantises whole groups of keys.")


def fake_quantize(x: Tensor, bits: int, group: int, dim: int = -1) -> Tensor:
    """``x`` quantised to ``bits`` and back, per group of ``group`` consecutive elements along ``dim``.

    The length of ``dim`` need not be a multiple of ``group``: the last group is shorter. Returns a
    tensor of ``x``'s shape and dtype (module docstring for the formula).
    """
    if bits >= FULL_PRECISION:
        return x
    grouped, low, scale = _groups(x, bits, group, dim)  # (..., n_groups, g), (..., n_groups, 1) twice
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((grouped - low) / safe).clamp_(0, 2 ** bits - 1)  # (..., n_groups, g)
    back = torch.where(scale > 0, q * scale + low, grouped)  # (..., n_groups, g)
    return _ungroup(back, x, dim).to(x.dtype)


def group_scales(x: Tensor, bits: int, group: int, dim: int = -1) -> Tensor:
    """Each element's group scale ``(max - min) / (2^b - 1)``, float32, ``x``'s shape (for :func:`error_bound`)."""
    grouped, _, scale = _groups(x, bits, group, dim)
    return _ungroup(scale.expand_as(grouped), x, dim)


def _groups(x: Tensor, bits: int, group: int, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """``x`` in float32 as groups of ``group`` along ``dim`` (moved last), (..., n_groups, g), with each group's
    minimum and scale (..., n_groups, 1). A shorter last group is padded with its own last element, so its
    minimum and maximum are its own."""
    moved = x.movedim(dim, -1).float()  # (..., n)
    pad = -moved.shape[-1] % group
    if pad:
        moved = torch.cat([moved, moved[..., -1:].expand(*moved.shape[:-1], pad)], dim=-1)
    grouped = moved.reshape(*moved.shape[:-1], -1, group)  # (..., n_groups, g)
    low = grouped.amin(-1, keepdim=True)  # (..., n_groups, 1)
    return grouped, low, (grouped.amax(-1, keepdim=True) - low) / (2 ** bits - 1)


def _ungroup(grouped: Tensor, like: Tensor, dim: int) -> Tensor:
    """:func:`_groups`' layout back to ``like``'s shape (padding dropped, ``dim`` in place)."""
    n = like.shape[dim]
    return grouped.reshape(*grouped.shape[:-2], -1)[..., :n].movedim(-1, dim)


def error_bound(x: Tensor, bits: int, group: int, dim: int = -1) -> Tensor:
    """The round trip's bound per element: half the group's scale (float32, ``x``'s shape)."""
    return group_scales(x, bits, group, dim) / 2


def quantize_values(values: Tensor, setting: KVQuant) -> Tensor:
    """Values (B, H_kv, S, D) quantised per token along the channels (both schemes)."""
    return fake_quantize(values, setting.bits, min(setting.group, values.shape[-1]), dim=-1)


def quantize_keys(keys: Tensor, setting: KVQuant) -> Tensor:
    """Keys (B, H_kv, S, D): per channel along the S tokens (``kivi``; S a multiple of the group, :func:`complete_groups`)
    or per token along the channels (``per-token``)."""
    if setting.keys_along_tokens:
        if keys.shape[-2] % setting.group:
            raise ValueError(f"kivi's key groups are {setting.group} tokens; got {keys.shape[-2]}")
        return fake_quantize(keys, setting.bits, setting.group, dim=-2)
    return fake_quantize(keys, setting.bits, min(setting.group, keys.shape[-1]), dim=-1)


#: bit widths transformers' quanto KV layer takes (``stream.hf_quant``).
TRANSFORMERS_BITS = (2, 4)


def transformers_serves(policy) -> bool:
    """Can transformers' ``QuantizedCache`` read this reading condition (a ``cache.Policy``) as sinkscope's
    quantiser does: the full cache, ``per-token``, 2 or 4 bits, nothing protected (``stream.hf_quant``)."""
    return (policy.name == "full" and policy.kv_scheme == "per-token" and policy.kv_bits in TRANSFORMERS_BITS
            and not policy.protect_sinks and not policy.protect)


def transformers_why_not(policy) -> str:
    """Why a quantised condition is read by sinkscope's quantiser instead (one phrase)."""
    if policy.name != "full":
        return "a bounded cache (transformers' quantised layer cannot evict)"
    if policy.kv_scheme != "per-token":
        return f"{policy.kv_scheme} (quanto groups keys along channels only)"
    if policy.kv_bits not in TRANSFORMERS_BITS:
        return f"{policy.kv_bits} bits (quanto's KV layer takes 2 and 4)"
    return "protected tokens (transformers' cache quantises every token)"


def complete_groups(pending: int, setting: KVQuant) -> int:
    """How many of ``pending`` full-precision keys a quantisation step takes now (oldest first).

    ``per-token``: all of them. ``kivi`` and ``kivi-grouped``: whole blocks of ``R`` keys
    (:attr:`KVQuant.residual_length`) only, as KIVI's cache quantises its ``R`` residual keys once
    they have gathered (or, on a first chunk of ``n`` tokens, all but the last ``n mod R``); the
    rest (fewer than ``R``) stay in full precision. A block of ``R`` is ``R / g`` key groups.
    """
    if not setting.keys_along_tokens:
        return pending
    return pending - pending % setting.residual_length

