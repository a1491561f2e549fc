"""Which keys a bounded cache keeps (SPEC.md "Streaming"): full, window, sinks (StreamingLLM), h2o (H2O).

A policy decides which cached keys to keep, nothing else (DESIGN.md); ``stream/`` reads a text
through the cache, and the ``stream`` probe (``probes/stream_nll.py``) lists the conditions.

A policy acts on one layer's cache after a chunk is read: the cache holds ``S`` slots in the order
the tokens were read (slot order is reading order), and the policy returns the slots to keep,
ascending, per key-value head. The budget ``cache`` counts the past keys a query sees: read token by
token, the cache holds ``cache`` keys when a token arrives and its query sees them and itself (as
StreamingLLM's evaluation, whose cache of 4 + 508 is pruned after each token is appended). Read in
chunks, each query is masked to exactly those keys (:func:`visible`), so the chunk is a speed
setting only, for ``window`` and ``sinks``; ``h2o`` evicts after each chunk (SPEC.md).

- ``full``: every key (the dense reference).
- ``window``: the ``cache`` most recent keys.
- ``sinks``: the first ``sink_tokens`` tokens of the document plus the ``cache - sink_tokens`` most
  recent keys (Xiao et al. 2023, "Efficient streaming language models with attention sinks").
- ``h2o``: the ``recent`` most recent keys plus the ``cache - recent`` others of highest
  accumulated attention (Zhang et al. 2023, "H2O: heavy-hitter oracle"): a key's score is the sum,
  over every query that has seen it (its own chunk's included) and over the query heads sharing its
  key-value head, of its attention weight a_ij (the phantom's share, on a learned-sink model, in the
  normaliser). Chosen per layer and key-value head; ties go to the earlier key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sinkscope.errors import SinkscopeError, option, whole_number
from sinkscope.kvcache.quant import check_residual

POLICIES = ("full", "window", "sinks", "h2o")
POSITIONS = ("cache", "original")


@dataclass(frozen=True)
class Policy:
    """One reading condition: the policy, its budget, sink tokens, the position convention.

    Attributes:
        name: ``full`` | ``window`` | ``sinks`` | ``h2o``.
        cache: the keys the cache holds when a token arrives (None for ``full``); its query sees them and itself.
        sink_tokens: the first tokens ``sinks`` always keeps (0 otherwise).
        positions: ``cache`` (positions counted within the cache, keys re-rotated: StreamingLLM) or
            ``original`` (every token keeps its position in the document: kvpress).
        recent: ``h2o``'s recent keys (the rest of the budget goes to heavy hitters).
        kv_bits: the bits each cached key and value is stored in (16: not quantised; ``kv_quant``).
        kv_group: elements per quantisation group.
        kv_scheme: the group layout, ``kivi``, ``kivi-grouped`` or ``per-token`` (``kv_quant``).
        kv_residual: ``kivi``'s residual length R, a multiple of ``kv_group`` (0: the group size): keys wait in
            full precision until R have gathered, and the values of the R most recent tokens stay exact.
        protect_sinks: the document's first tokens the cache keeps in full precision.
        protect: ``""``, or keys chosen to stay in full precision: ``top-p0:N`` (the N of highest
            accumulated attention, as KVSink proposes) or ``random:N`` (its control); per layer and
            key-value head (``stream.reader``).
        kv_backend: which quantiser reads it: ``sinkscope`` (``kv_quant``) or ``transformers``
            (its ``QuantizedCache``, ``stream.hf_quant``; only where it can).
    """

    name: str
    cache: int | None = None
    sink_tokens: int = 0
    positions: str = "original"
    recent: int = 0
    kv_bits: int = 16
    kv_group: int = 64
    kv_scheme: str = "kivi"
    kv_residual: int = 0
    protect_sinks: int = 0
    protect: str = ""
    kv_backend: str = "sinkscope"

    def __post_init__(self):
        if self.name not in POLICIES:
            raise SinkscopeError(f"unknown policy {self.name!r}; use one or more of {', '.join(POLICIES)}.")
        if self.name != "full" and (self.cache is None or self.cache < 1):
            raise SinkscopeError(f"the {self.name} policy needs a cache of at least 1 key (got {self.cache}).")
        if self.name == "sinks" and not 0 < self.sink_tokens < self.cache:
            raise SinkscopeError(f"sinks keeps 1 to cache - 1 sink tokens; {self.sink_tokens} with a cache of "
                                 f"{self.cache} leaves no recent keys.")
        if self.protect and not parse_protect(self.protect):
            raise SinkscopeError(f"{option('protect')} takes top-p0:N or random:N with N >= 1 (got {self.protect!r}).")
        if self.quantised and self.kv_scheme == "kivi":
            check_residual(self.kv_residual, self.kv_group)
        if self.positions not in POSITIONS:
            raise SinkscopeError(f"unknown {option('positions')} {self.positions!r}; use cache, original or both.")

    @property
    def label(self) -> str:
        """``full``, ``window 256``, ``sinks 4+252``, ``h2o 128+128`` (heavy + recent); and the positions."""
        if self.name == "full":
            return "full" + self.kv_label
        budget = {"window": f"{self.cache}", "sinks": f"{self.sink_tokens}+{self.cache - self.sink_tokens}",
                  "h2o": f"{self.cache - self.recent}+{self.recent}"}[self.name]
        return f"{self.name} {budget} ({self.positions} positions)" + self.kv_label

    @property
    def quantised(self) -> bool:
        return self.kv_bits != 16

    @property
    def kv_label(self) -> str:
        """``""`` at 16 bits; else ``, 4-bit kivi g64`` (``, 4-bit kivi g64 r128`` when kivi's residual length
        is not the group size) and ``, first 4 exact`` when tokens are protected."""
        if not self.quantised:
            return ""
        return f", {self.kv_bits}-bit {self.kv_scheme} g{self.kv_group}{self.residual_label}" + (
            f", first {self.protect_sinks} exact" if self.protect_sinks else "") + (
            f", {self.protect} exact" if self.protect else "") + (
            ", transformers QuantizedCache" if self.kv_backend == "transformers" else "")

    @property
    def residual_label(self) -> str:
        """`` r128`` for ``kivi`` with a residual length other than the group size; else ``""``."""
        shown = self.kv_scheme == "kivi" and self.kv_residual and self.kv_residual != self.kv_group
        return f" r{self.kv_residual}" if shown else ""

    @property
    def protect_rule(self) -> tuple[str, int] | None:
        """``protect`` as (``top-p0`` | ``random``, N), or None."""
        return parse_protect(self.protect) if self.protect else None

    def conditions(self, kv: bool = False) -> tuple[tuple[str, object], ...]:
        """The table's condition columns of this policy's rows; ``kv`` adds the quantisation's (a run that quantises)."""
        columns = (("policy", self.name), ("cache", self.cache), ("sink_tokens", self.sink_tokens),
                   ("positions", self.positions))
        if not kv:
            return columns
        return (*columns, ("kv_bits", self.kv_bits), ("kv_group", self.kv_group if self.quantised else None),
                ("kv_scheme", self.kv_scheme if self.quantised else None),
                ("kv_residual", (self.kv_residual or self.kv_group) if self.quantised and self.kv_scheme == "kivi"
                 else None),
                ("protect_sinks", self.protect_sinks if self.quantised else None),
                ("protect", (self.protect or None) if self.quantised else None),
                ("kv_backend", self.kv_backend if self.quantised else None))


def parse_protect(text: str) -> tuple[str, int] | None:
    """``top-p0:N`` / ``random:N`` (N >= 1) as (rule, N); None when malformed."""
    rule, _, count = str(text).partition(":")
    n = whole_number(count)
    if rule not in ("top-p0", "random") or n is None or n < 1:
        return None
    return rule, n


def keep_slots(policy: Policy, n_slots: int, n_kv: int, device, scores: Tensor | None = None) -> Tensor | None:
    """The slots to keep, ascending, (H_kv, S_keep) int64; None when every slot stays.

    Args:
        policy: the reading condition (its ``cache`` budget; ``full`` keeps everything).
        n_slots: S, the keys in the cache now (the chunk just read included).
        n_kv: key-value heads.
        scores: ``h2o``'s accumulated attention per slot, (H_kv, S).
    """
    if policy.name == "full" or n_slots <= policy.cache:
        return None
    C = policy.cache
    if policy.name == "window":
        slots = torch.arange(n_slots - C, n_slots, device=device)  # (C,)
    elif policy.name == "sinks":
        n = policy.sink_tokens
        slots = torch.cat([torch.arange(n, device=device), torch.arange(n_slots - (C - n), n_slots, device=device)])
    else:
        return heavy_and_recent(scores, C, policy.recent)
    return slots.unsqueeze(0).expand(n_kv, -1)  # (H_kv, C)


def heavy_and_recent(scores: Tensor, budget: int, recent: int) -> Tensor:
    """H2O's choice: the last ``recent`` slots plus the ``budget - recent`` highest-scoring others, ascending.

    scores: (H_kv, S) accumulated attention, S > budget. Ties go to the earlier slot (a stable sort).
    """
    n_kv, S = scores.shape
    recent = min(recent, budget)
    heavy = budget - recent
    older = scores[:, :S - recent]  # (H_kv, S - recent)
    order = torch.sort(older, dim=-1, descending=True, stable=True).indices[:, :heavy]  # (H_kv, heavy)
    tail = torch.arange(S - recent, S, device=scores.device).unsqueeze(0).expand(n_kv, -1)  # (H_kv, recent)
    return torch.sort(torch.cat([order, tail], dim=-1), dim=-1).values  # (H_kv, budget)


def last_slots(n_slots: int, keep: int, n_kv: int, device) -> Tensor | None:
    """A sliding-window layer's rule (the model's own): its last ``keep`` = W - 1 slots; None if all stay."""
    if n_slots <= keep:
        return None
    return torch.arange(n_slots - keep, n_slots, device=device).unsqueeze(0).expand(n_kv, -1)


def visible(policy: Policy, queries: Tensor, keys: Tensor) -> Tensor:
    """Which keys each query sees when read token by token under a static policy (SPEC.md "A bounded cache
    of N keys (exact)"): the ``cache`` keys the cache holds when the query's token arrives, and itself.

    queries (k,) and keys (S,) are original positions; returns (k, S) bool. ``window``: the ``C`` keys
    before the query, ``t - C <= p <= t``; ``sinks``: the first ``n`` and the ``C - n`` before it,
    ``p < n or t - (C - n) <= p <= t``; ``full``: every ``p <= t``. Before the cache fills (``t <= C``)
    every earlier key is visible under each rule. A chunk's mask is this, whatever the chunk's size.
    """
    t, p = queries.unsqueeze(1), keys.unsqueeze(0)  # (k, 1), (1, S)
    causal = p <= t  # (k, S)
    if policy.name == "full":
        return causal
    if policy.name == "window":
        return causal & (p >= t - policy.cache)
    if policy.name == "sinks":
        n = policy.sink_tokens
        return causal & ((p < n) | (p >= t - (policy.cache - n)))
    raise SinkscopeError("h2o's cache depends on the attention it reads, so it has no per-query mask; "
                         "use the streaming mode.")
