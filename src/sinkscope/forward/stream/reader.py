"""Read one document through a bounded key-value cache; the per-token negative log-likelihood (SPEC.md "Streaming").

Streaming (:func:`read_stream`): the document's tokens are read ``chunk`` at a time through
transformers' ``DynamicCache``. Each query of a chunk sees exactly the keys token-by-token reading
would show it (``cache.visible``: the keys an N-key cache holds when its token arrives, and
itself), through a 4D mask handed to the model, which transformers passes through unchanged; so the
chunk is a speed setting only (``h2o`` excepted: it evicts after each chunk, SPEC.md). After the
chunk, every layer's cache is cut back to the policy's budget (``cache.keep_slots``). Memory is
bounded by the cache and the chunk, never by the text.

Layers with a sliding window W shorter than the document keep the model's own rule, their last
W - 1 keys, whatever the policy (the model never reads further back on them); the policy acts on
the other layers (SPEC.md "Streaming", a decision of this project). Positions: ``original`` gives
every token its position in the document; ``cache`` gives the query the position equal to the
number of keys the full layers hold and re-rotates every cached key to its slot (``rotary.py``);
a sliding layer's keys are placed right-aligned with the full layers' slots, so their distances to
the query stay the document's.

Every condition's forward passes run under sinkscope's fused attention (``capture``, the kernel
``sinks`` uses: learned sinks applied exactly, memory linear in the keys); ``h2o`` reads the
attention records it makes (each key's attention summed over the chunk's queries).

Mask-based (:func:`read_masked`): one dense forward pass whose mask shows each query exactly the
keys the streaming cache would show it (``cache.visible``), with original positions. It is
the reference the streaming mode must equal (tests: at chunk 1 and at larger chunks), for the
static policies only (full, window, sinks).

The NLL of position i is the cross-entropy of the logits read at token i predicting token i + 1,
in float32: a document of L tokens gives L - 1 values.
"""

from __future__ import annotations

import inspect
import zlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sinkscope.runtime import heap
from sinkscope.capture import hooks as hp
from sinkscope.capture.families import layer_windows
from sinkscope.errors import SinkscopeError, option
from sinkscope.forward.runner import DiscardRecords
from sinkscope.forward.stream import rotary
from sinkscope.kvcache.policies import Policy, keep_slots, last_slots, visible
from sinkscope.kvcache.slots import guard_slots, quantise_slots


@dataclass
class Layout:
    """What reading needs to know about a model, found once (:func:`layout_of`).

    Attributes:
        windows: each layer's binding sliding window W (None: full attention, or W >= the document).
        layer_types: ``config.layer_types`` when the model takes a mask per layer type (a dict).
        inv_freq: the rotary table for ``--positions cache`` (None: not re-rotatable).
        rotary_problem: why there is none (one sentence), when a rotary model has several tables.
        cache_kwarg: the forward's name for the cache (``cache`` in transformers 5.2x).
    """

    windows: list[int | None]
    layer_types: list[str] | None
    inv_freq: Tensor | None
    cache_kwarg: str
    rotary_problem: str | None = None

    @property
    def full_layers(self) -> list[int]:
        return [layer for layer, w in enumerate(self.windows) if w is None]

    @property
    def sliding_window(self) -> int | None:
        sizes = {w for w in self.windows if w is not None}
        return next(iter(sizes)) if sizes else None


def layout_of(model: nn.Module, n_layers: int, length: int) -> Layout:
    """The model's :class:`Layout` for documents of ``length`` tokens, or one sentence why it cannot stream."""
    name = getattr(model.config, "model_type", type(model).__name__)
    windows = [w if w is not None and w < length else None for w in layer_windows(model, n_layers)]
    if not any(w is None for w in windows):
        raise SinkscopeError(f"every layer of the {name!r} model has a sliding window ({max(windows)}) shorter than "
                             f"{option('length')}, so no cache policy has a layer to act on; use a {option('length')} within its window.")
    if len({w for w in windows if w is not None}) > 1:
        raise SinkscopeError(f"the {name!r} model's layers have sliding windows of several sizes; stream reads "
                             "models with one window size.")
    layer_types = list(getattr(model.config, "layer_types", None) or []) or None
    if any(w is not None for w in windows):
        source = inspect.getsource(inspect.getmodule(type(_base(model))))
        if "attention_mask, dict)" not in source or layer_types is None:
            raise SinkscopeError(f"the {name!r} model has sliding-window layers and takes no mask per layer type, so "
                                 f"stream cannot hand it the cache's masks; use a {option('length')} within its window.")
    problem = None
    try:
        inv_freq = rotary.model_inv_freq(model)
    except SinkscopeError as error:
        inv_freq, problem = None, str(error)
    params = inspect.signature(model.forward).parameters
    cache_kwarg = "cache" if "cache" in params else "past_key_values"
    return Layout(windows, layer_types, inv_freq, cache_kwarg, problem)


def _base(model: nn.Module) -> nn.Module:
    """The decoder inside a ``*ForCausalLM`` (where the masks are built), else the model."""
    return getattr(model, "model", model) if isinstance(getattr(model, "model", None), nn.Module) else model


class _ColumnMass:
    """Observes attention records and keeps, per layer, each key's attention summed over queries: (H_kv, S);
    and, with ``p0``, the position-0 share through the cache (:meth:`_p0_share`)."""

    intervened = frozenset()

    def __init__(self, layers: list[int], p0: bool = False):
        self.observed = frozenset({hp.ATTN})
        #: with layers to sum: the kernel returns each key's received attention with the layer's output
        #: (``kernels.attention_with_received``), not a second product of queries and keys
        self.record_columns = frozenset({"received"}) if layers else frozenset()
        self.layers = set(layers)
        self.columns: dict[int, Tensor] = {}
        self.p0 = p0
        #: per layer, where document position 0 is among this pass's keys: (H_kv,) key indices (-1: not
        #: cached), or (S, n) when each query reads its own copies of the n sink keys at S + i * n
        self.p0_keys: dict[int, Tensor | tuple[int, int]] = {}
        self.p0_first_row = 0  # 1 in the document's first chunk: query 0 is position 0 itself
        self.p0_sum, self.p0_count = 0.0, 0

    def _p0_share(self, layer: int, record) -> None:
        """Add w_i0 = exp(s_i0 - LSE_i) (the share of query i's real-key attention on document position 0,
        p0_mass's formula) over the heads and the queries that see position 0, and count them."""
        where = self.p0_keys.get(layer)
        if where is None:
            return
        T = record.query.shape[2]
        if isinstance(where, tuple):  # query i reads its own copy of sink 0 at S + i * n
            S, n = where
            s0 = record.key_logits(slice(S, S + T * n, n)).diagonal(dim1=-2, dim2=-1)  # (B, H, T)
        else:
            groups = record.n_heads // record.n_kv_heads
            per_head = where.repeat_interleave(groups) if where.numel() == record.n_kv_heads else \
                where.expand(record.n_heads)  # (H,)
            s0 = torch.full_like(record.lse(), float("-inf"))  # (B, H, T)
            for index in torch.unique(per_head[per_head >= 0]).tolist():
                heads = per_head == index
                s0[:, heads] = record.key_logits(int(index))[..., 0][:, heads]  # (B, H', T)
        seen = s0 > -1e30  # (B, H, T): masked keys carry the dtype's minimum
        share = torch.where(seen, torch.exp(s0 - record.lse()), torch.zeros_like(s0))  # (B, H, T)
        self.p0_sum += float(share[..., self.p0_first_row:].double().sum())
        self.p0_count += int(seen[..., self.p0_first_row:].sum())

    def emit(self, template: str, layer: int | None, record) -> None:
        if template == hp.ATTN and self.p0:
            self._p0_share(layer, record)
        if template != hp.ATTN or layer not in self.layers:
            return
        column = record.received_mass()[0]  # (H, S): sum over queries of a_ij
        H, S = column.shape
        self.columns[layer] = column.view(record.n_kv_heads, H // record.n_kv_heads, S).sum(1).double()  # (H_kv, S)

    def replace(self, template: str, layer: int, value: Tensor) -> Tensor:
        return value


@dataclass
class _Slots:
    """One layer's cache bookkeeping: original position, unrotated rotary part, H2O score, and
    whether each slot is still held in full precision (a quantised cache, ``stream.quantise``)."""

    orig: Tensor  # (H_kv, S) int64
    pre: Tensor | None = None  # (1, H_kv, S, R) float32
    score: Tensor | None = None  # (H_kv, S) float64
    exact: Tensor | None = None  # (H_kv, S) bool: key not quantised (yet, or protected)
    mass: Tensor | None = None  # (H_kv, S) float64: accumulated attention (--protect top-p0)
    guard: Tensor | None = None  # (H_kv, S) bool: held exact by --protect's rule now
    value_exact: Tensor | None = None  # (H_kv, S) bool: value not quantised (kivi: its own window)


def _additive(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean visibility (T, S) as the additive mask (1, 1, T, S) the model adds to its logits."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill(~visible, torch.finfo(dtype).min).view(1, 1, *visible.shape)


def _chunk_masks(layout: Layout, slots: list[_Slots | None], t0: int, k: int, dtype, device, policy: Policy,
                 copies: int = 0):
    """The masks for a chunk of ``k`` queries at original positions t0..t0+k-1: a tensor, or a dict per layer type.

    Full layers: under a static policy each query sees exactly the keys token-by-token reading would show
    it (``cache.visible``: the cached keys it may still see, the chunk's keys up to itself); under
    ``h2o`` every cached key and the chunk up to itself. ``copies`` sink keys per query (``--positions
    cache`` with ``sinks``, :func:`_sink_copies`) sit between the cached keys and the chunk's: query i sees
    its own ``copies`` only, and the cached sink slots they stand for are hidden.
    """
    queries = torch.arange(t0, t0 + k, device=device)  # (k,)
    full = layout.full_layers[0]
    cached_pos = queries[:0] if slots[full] is None else slots[full].orig[0]  # (S,) original positions
    if policy.name == "h2o":
        cached = torch.ones(k, cached_pos.numel(), dtype=torch.bool, device=device)  # (k, S)
        own = queries.unsqueeze(0) <= queries.unsqueeze(1)  # (k, k): key b <= query a
    else:
        cached = visible(policy, queries, cached_pos)  # (k, S)
        own = visible(policy, queries, queries)  # (k, k)
    parts = [cached]
    if copies:
        cached = cached & (cached_pos >= copies).unsqueeze(0)  # the sink slots: seen through the copies instead
        parts = [cached, torch.eye(k, dtype=torch.bool, device=device).repeat_interleave(copies, dim=1)]  # (k, k*n)
    full_mask = _additive(torch.cat([*parts, own], dim=1), dtype)
    W = layout.sliding_window
    if W is None:
        return full_mask
    sliding = next(layer for layer, w in enumerate(layout.windows) if w is not None)
    cached = slots[sliding].orig[0] if slots[sliding] is not None else queries[:0]  # (S_s,)
    keys = torch.cat([cached, queries])  # (S_s + k,)
    seen = (keys.unsqueeze(0) <= queries.unsqueeze(1)) & (queries.unsqueeze(1) - keys.unsqueeze(0) < W)
    masks = {"full_attention": full_mask, "sliding_attention": _additive(seen, dtype)}
    return {kind: masks["sliding_attention" if "sliding" in str(kind) else "full_attention"]
            for kind in set(layout.layer_types)}


def _copies_needed(policy: Policy, t0: int, k: int) -> bool:
    """``--positions cache`` with ``sinks``: does a query of this chunk see the sink keys at a distance its
    position in the chunk cannot give (a query past the first ``cache`` tokens)?"""
    return policy.name == "sinks" and policy.positions == "cache" and t0 + k - 1 > policy.cache


def _sink_copies(cache, slots: list[_Slots | None], layout: Layout, policy: Policy, t0: int, k: int,
                 query_positions: Tensor) -> None:
    """Append, to every full layer's cache, one copy of the ``n`` sink keys per query of the chunk.

    Under ``--positions cache`` a query reading token t sees, token by token, ``min(t, C)`` keys in slots
    0..min(t, C) - 1 and sits at position ``min(t, C)``: sink j at distance ``min(t, C) - j``, every other
    key at its document distance ``t - p``. One rotary position per key cannot give the sink distances to
    every query of a chunk at once, so query i reads its own copies, rotated to ``Q_i - (min(t, C) - j)``
    (``Q_i`` its position), masked from the other queries (:func:`_chunk_masks`); the copies are dropped
    after the forward pass (:func:`_drop_copies`). k * n extra keys, n = 4 by default.
    """
    n, C = policy.sink_tokens, policy.cache
    t = torch.arange(t0, t0 + k, device=query_positions.device)  # (k,)
    j = torch.arange(n, device=query_positions.device)  # (n,)
    target = (query_positions.unsqueeze(1) - (t.clamp(max=C).unsqueeze(1) - j.unsqueeze(0))).reshape(-1)  # (k*n,)
    R = 2 * layout.inv_freq.numel()
    for layer in layout.full_layers:
        store, state = cache.layers[layer], slots[layer]
        pre = state.pre[:, :, :n].repeat(1, 1, k, 1)  # (1, H_kv, k*n, R): copy i*n + j of sink j
        rest = store.keys[:, :, :n, R:].repeat(1, 1, k, 1)  # (1, H_kv, k*n, D - R)
        keys = torch.cat([rotary.rotate(pre, target, layout.inv_freq).to(store.keys.dtype), rest], dim=-1)
        store.keys = torch.cat([store.keys, keys], dim=2)
        store.values = torch.cat([store.values, store.values[:, :, :n].repeat(1, 1, k, 1)], dim=2)


def _drop_copies(cache, layout: Layout, n_cached: dict[int, int], n_copies: int) -> None:
    """Remove :func:`_sink_copies`'s keys: each full layer holds [cached][copies][chunk] -> [cached][chunk]."""
    for layer in layout.full_layers:
        store, S = cache.layers[layer], n_cached[layer]
        store.keys = torch.cat([store.keys[:, :, :S], store.keys[:, :, S + n_copies:]], dim=2)
        store.values = torch.cat([store.values[:, :, :S], store.values[:, :, S + n_copies:]], dim=2)


def _fold_copies(columns: dict[int, Tensor], n_cached: dict[int, int], k: int, n: int) -> None:
    """Attention on :func:`_sink_copies`' keys added back to the sink slots they copy: each full layer's
    columns [cached][copies][chunk] (H_kv, S + k*n + k) -> [cached][chunk] (H_kv, S + k)."""
    for layer, S in n_cached.items():
        if layer not in columns:
            continue
        column = columns[layer]
        copies = column[:, S:S + k * n].reshape(column.shape[0], k, n).sum(1)  # (H_kv, n)
        kept = torch.cat([column[:, :S], column[:, S + k * n:]], dim=1)  # (H_kv, S + k)
        kept[:, :n] += copies
        columns[layer] = kept


def _gather(x: Tensor, keep: Tensor, shared: bool) -> Tensor:
    """x (B, H_kv, S, ...) at the slots ``keep`` (H_kv, S') along dim 2."""
    if shared:
        return x.index_select(2, keep[0])
    index = keep.view(1, *keep.shape, *([1] * (x.dim() - 3))).expand(x.shape[0], *keep.shape, *x.shape[3:])
    return x.gather(2, index)


def _evict(cache, slots: list[_Slots | None], policy: Policy, layout: Layout, t0: int, k: int,
           query_positions: Tensor, columns: dict[int, Tensor] | None, generator: torch.Generator | None = None) -> None:
    """Record the chunk's keys in each layer's bookkeeping, cut every layer back to its budget, re-rotate."""
    R = 0 if layout.inv_freq is None else 2 * layout.inv_freq.numel()
    reorder = policy.positions == "cache"
    order = layout.full_layers + [layer for layer in range(len(layout.windows)) if layout.windows[layer] is not None]
    n_full_after = None
    for layer in order:
        store = cache.layers[layer]
        keys, values = store.keys, store.values  # (1, H_kv, S_old + k, D), (1, H_kv, S_old + k, D_v)
        n_kv = keys.shape[1]
        state = slots[layer]
        new_orig = torch.arange(t0, t0 + k, device=keys.device).unsqueeze(0).expand(n_kv, -1)  # (H_kv, k)
        orig = new_orig if state is None else torch.cat([state.orig, new_orig], dim=1)  # (H_kv, S)
        pre = None
        if reorder:
            fresh = rotary.rotate(keys[:, :, -k:, :R].float(), -query_positions, layout.inv_freq)  # (1, H_kv, k, R)
            pre = fresh if state is None else torch.cat([state.pre, fresh], dim=2)
        score = None
        if policy.name == "h2o" and layout.windows[layer] is None:
            column = columns[layer]  # (H_kv, S)
            score = column if state is None else torch.cat([state.score + column[:, :-k], column[:, -k:]], dim=1)
        S = orig.shape[1]
        W = layout.windows[layer]
        keep = last_slots(S, W - 1, n_kv, keys.device) if W is not None else \
            keep_slots(policy, S, n_kv, keys.device, score)
        rule = policy.protect_rule if policy.quantised else None
        mass = held = None
        if rule is not None:
            if rule[0] == "top-p0":
                column = columns[layer]  # (H_kv, S)
                mass = column if state is None else torch.cat([state.mass + column[:, :-k], column[:, -k:]], dim=1)
            elif state is not None:
                held = torch.cat([state.guard, torch.zeros(n_kv, k, dtype=torch.bool, device=keys.device)], dim=1)
        if keep is not None:
            shared = policy.name != "h2o" or W is not None
            keys, values = _gather(keys, keep, shared), _gather(values, keep, shared)
            orig = orig.gather(1, keep)
            pre = None if pre is None else _gather(pre, keep, shared)
            score = None if score is None else score.gather(1, keep)
            mass = None if mass is None else mass.gather(1, keep)
            held = None if held is None else held.gather(1, keep)
        exact = guard = value_exact = None
        if policy.quantised:
            fresh = torch.ones(n_kv, k, dtype=torch.bool, device=keys.device)  # (H_kv, k): the chunk, exact
            exact = fresh if state is None or state.exact is None else torch.cat([state.exact, fresh], dim=1)
            value_exact = fresh if state is None or state.value_exact is None else \
                torch.cat([state.value_exact, fresh], dim=1)
            if keep is not None:
                exact, value_exact = exact.gather(1, keep), value_exact.gather(1, keep)
            if rule is not None:
                guard = guard_slots(rule, exact, orig, policy.protect_sinks, mass, held, generator)
            keys, values, pre, exact, value_exact = quantise_slots(keys, values, pre, orig, exact, policy, R, guard,
                                                                   value_exact)
        S = orig.shape[1]
        if W is None:
            n_full_after = S
        if reorder:
            target = torch.arange(S, device=keys.device) + (0 if W is None else n_full_after - S)  # (S,)
            keys = torch.cat([rotary.rotate(pre, target, layout.inv_freq).to(keys.dtype), keys[..., R:]], dim=-1)
        store.keys, store.values = keys.contiguous(), values.contiguous()
        slots[layer] = _Slots(orig, pre, score, exact, mass, guard, value_exact)


@dataclass
class ChunkRead:
    """What one chunk's reading gave (:func:`iter_chunks`).

    Attributes:
        start: the chunk's first token (original position).
        nll: the NLL of the tokens the chunk predicts, (m,) float32 (m = the chunk's length, one less at the end).
        kept: per layer, the original positions the cache holds after the chunk, (H_kv, S) int64.
        exact: per layer, which of them hold their key in full precision, (H_kv, S) bool; None unquantised.
        cache: the live ``DynamicCache`` after the chunk (its layers' ``keys`` and ``values``).
        p0_sum, p0_count: with ``p0``, the position-0 share summed over the chunk's queries (from
            position 1 on) and heads of every layer that see position 0, and their count.
        tokens: the tokens the chunk read (its length; what a progress bar counts).
        value_exact: per layer, which of them hold their value in full precision (as ``exact``; ``kivi``
            keeps the values of its residual window's tokens exact, SPEC.md "Quantised KV caches").
    """

    start: int
    nll: Tensor
    kept: list[Tensor]
    exact: list[Tensor | None]
    cache: object = None
    p0_sum: float = 0.0
    p0_count: int = 0
    tokens: int = 0
    value_exact: list[Tensor | None] | None = None

    def reduced_precision(self) -> tuple[int, int]:
        """How many of the keys and values the cache holds after this chunk are quantised, and how many it holds:
        ``(quantised, held)`` summed over layers, key-value heads and slots, a key and its value counted apart
        (SPEC.md "Quantised KV caches", ``stream_quantised_share``). A layer with no precision record
        (``exact`` None: nothing quantised) counts its slots as held exact."""
        quantised = held = 0
        values = self.value_exact or [None] * len(self.exact)
        for kept, exact, value_exact in zip(self.kept, self.exact, values):
            if kept is None:
                continue
            held += 2 * kept.numel()
            if exact is not None:
                quantised += int((~exact).sum()) + int((~(exact if value_exact is None else value_exact)).sum())
        return quantised, held


def _p0_keys(slots: list[_Slots | None], layout: Layout, t0: int, n_cached: dict[int, int], copies: int) -> dict:
    """Where document position 0 is among each layer's keys for the next pass (``_ColumnMass.p0_keys``)."""
    where = {}
    for layer, state in enumerate(slots):
        if copies and layer in n_cached:
            where[layer] = (n_cached[layer], copies)
        elif state is None:
            if t0 == 0:
                where[layer] = torch.zeros(1, dtype=torch.long)  # the chunk's first key, every head
        else:
            held = state.orig == 0  # (H_kv, S)
            where[layer] = torch.where(held.any(1), held.float().argmax(1), torch.full_like(held[:, 0], -1, dtype=torch.long))
    return where


def iter_chunks(model: nn.Module, ids: Tensor, policy: Policy, layout: Layout, *, chunk: int, p0: bool = False):
    """Read ``ids`` (1, L) ``chunk`` tokens at a time under ``policy``; yields a :class:`ChunkRead` per chunk.

    With ``p0``, each chunk also gives the position-0 share read through the cache (``ChunkRead.p0_sum``):
    the sink metric of what the cache holds, quantised or not.
    """
    from transformers import DynamicCache

    from sinkscope.capture.attention import capture

    L = ids.shape[1]
    if policy.positions == "cache" and layout.inv_freq is None:
        raise SinkscopeError(layout.rotary_problem or f"{option('positions')} cache needs a rotary model; use {option('positions')} original.")
    heap.fix_mmap_threshold(heap.STREAM_THRESHOLD_BYTES)  # else glibc serves each chunk's logits from a fragmenting heap (runtime/heap.py)
    device = ids.device
    dtype = next(model.parameters()).dtype
    cache = DynamicCache()
    slots: list[_Slots | None] = [None] * len(layout.windows)
    # every condition runs sinkscope's fused attention (one kernel for all, learned sinks exact, linear
    # memory); only h2o reads the records, the others' records are dropped unread
    protect = policy.protect_rule if policy.quantised else None
    observed = list(range(len(layout.windows))) if protect and protect[0] == "top-p0" else \
        layout.full_layers if policy.name == "h2o" else []
    observer = _ColumnMass(observed, p0)
    # --protect random:N draws from the document's own seed: the same document, the same draw
    generator = torch.Generator().manual_seed(zlib.crc32(ids.cpu().numpy().tobytes()))
    with capture(model, observer, mode="fused"):
        t0 = 0
        while t0 < L:
            k = min(chunk, L - t0)
            if _copies_needed(policy, t0, k) and t0 < policy.sink_tokens:
                k = policy.cache + 1 - t0  # the sinks enter the cache first: this chunk's queries see them in place
            full = slots[layout.full_layers[0]]
            n_full = 0 if full is None else full.orig.shape[1]
            start = t0 if policy.positions == "original" else n_full
            positions = torch.arange(start, start + k, device=device)  # (k,)
            copies = policy.sink_tokens if _copies_needed(policy, t0, k) else 0
            n_cached = {layer: cache.layers[layer].keys.shape[2] for layer in layout.full_layers} if copies else {}
            if copies:
                _sink_copies(cache, slots, layout, policy, t0, k, positions)
            masks = _chunk_masks(layout, slots, t0, k, dtype, device, policy, copies)
            if p0:
                observer.p0_keys = _p0_keys(slots, layout, t0, n_cached, copies)
                observer.p0_first_row = 1 if t0 == 0 else 0
                observer.p0_sum, observer.p0_count = 0.0, 0
            out = model(input_ids=ids[:, t0:t0 + k], attention_mask=masks, position_ids=positions.unsqueeze(0),
                        use_cache=True, **{layout.cache_kwarg: cache})
            targets = ids[0, t0 + 1:t0 + k + 1]  # (m,), m = k or k - 1 at the end
            nll = F.cross_entropy(out.logits[0, :targets.numel()].float(), targets, reduction="none")  # (m,)
            del out
            if copies:
                _drop_copies(cache, layout, n_cached, k * copies)
                _fold_copies(observer.columns, n_cached, k, copies)
            _evict(cache, slots, policy, layout, t0, k, positions, observer.columns, generator)
            observer.columns.clear()
            yield ChunkRead(t0, nll, [state.orig for state in slots], [state.exact for state in slots], cache,
                            observer.p0_sum, observer.p0_count, k, [state.value_exact for state in slots])
            t0 += k


def _counted(reads, on_chunk: Callable[[int], None] | None) -> list[ChunkRead]:
    """Every chunk's :class:`ChunkRead`, ``on_chunk(tokens)`` called as each is read."""
    out = []
    for read in reads:
        out.append(read)
        if on_chunk is not None:
            on_chunk(read.tokens)
    return out


def read_stream(model: nn.Module, ids: Tensor, policy: Policy, layout: Layout, *, chunk: int,
                on_chunk: Callable[[int], None] | None = None) -> Tensor:
    """Per-token NLL (L - 1,) float32 of ``ids`` (1, L) read ``chunk`` tokens at a time under ``policy``
    (transformers' own quantised cache where the policy asks for it: ``stream.hf_quant``);
    ``on_chunk(tokens)`` after each chunk (a progress bar)."""
    if policy.kv_backend == "transformers":
        from sinkscope.forward.stream.hf_quant import read_quantised_cache

        return read_quantised_cache(model, ids, policy, layout.cache_kwarg, chunk=chunk, on_chunk=on_chunk)
    return torch.cat([read.nll for read in _counted(iter_chunks(model, ids, policy, layout, chunk=chunk), on_chunk)])


@dataclass
class QuantisedReading:
    """One document read through a quantised cache (:func:`read_stream_p0`).

    Attributes:
        nll: per-token NLL (L - 1,) float32.
        p0_sum, p0_count: the position-0 share summed over the queries from position 1 on, heads and
            layers that see position 0, and their count.
        quantised, held: after every chunk, the keys and values the cache holds in reduced precision and
            all it holds, summed over chunks (:meth:`ChunkRead.reduced_precision`): their ratio is the
            reading's ``stream_quantised_share``.
    """

    nll: Tensor
    p0_sum: float
    p0_count: int
    quantised: int
    held: int


def read_stream_p0(model: nn.Module, ids: Tensor, policy: Policy, layout: Layout, *, chunk: int,
                   on_chunk: Callable[[int], None] | None = None) -> QuantisedReading:
    """:func:`read_stream` plus the position-0 share through the cache and the share of the cache held in reduced
    precision (:class:`QuantisedReading`)."""
    nll, p0_sum, p0_count, quantised, held = [], 0.0, 0, 0, 0
    for read in iter_chunks(model, ids, policy, layout, chunk=chunk, p0=True):
        nll.append(read.nll)
        p0_sum, p0_count = p0_sum + read.p0_sum, p0_count + read.p0_count
        reduced, cached = read.reduced_precision()
        quantised, held = quantised + reduced, held + cached
        if on_chunk is not None:
            on_chunk(read.tokens)
    return QuantisedReading(torch.cat(nll), p0_sum, p0_count, quantised, held)


def read_masked(model: nn.Module, ids: Tensor, policy: Policy, layout: Layout, *, chunk: int) -> Tensor:
    """The exact reference: per-token NLL (L - 1,) from one dense pass whose mask is the cache's (original positions)."""
    if policy.positions != "original":
        raise SinkscopeError(f"the mask-based reading keeps original positions; {option('positions')} cache needs streaming.")
    if policy.quantised:
        raise SinkscopeError(f"the mask-based reading has no cache to quantise; {option('kv_bits')} needs streaming.")
    L = ids.shape[1]
    device = ids.device
    dtype = next(model.parameters()).dtype
    positions = torch.arange(L, device=device)
    full_mask = _additive(visible(policy, positions, positions), dtype)  # (1, 1, L, L): exact at any chunk
    masks = full_mask
    W = layout.sliding_window
    if W is not None:
        positions = torch.arange(L, device=device)
        gap = positions.unsqueeze(1) - positions.unsqueeze(0)  # (query, key)
        sliding = _additive((gap >= 0) & (gap < W), dtype)
        masks = {kind: sliding if "sliding" in str(kind) else full_mask for kind in set(layout.layer_types)}
    from sinkscope.capture.attention import capture

    with capture(model, DiscardRecords(), mode="fused"):
        out = model(input_ids=ids, attention_mask=masks, position_ids=torch.arange(L, device=device).unsqueeze(0),
                    use_cache=False)
    return F.cross_entropy(out.logits[0, :-1].float(), ids[0, 1:], reduction="none")


def read_native(model: nn.Module, ids: Tensor, policy: Policy, layout: Layout | None = None, *, chunk: int = 0) -> Tensor:
    """A sinkscope trainer model read under a static policy: per-token NLL (L - 1,) from one dense pass.

    The trainer's model keeps no key-value cache, so it is read the mask-based way: the cache's
    visibility (``cache.visible``, original positions) goes to ``GPT.forward(visible=...)``, which
    every layer applies on top of its own rule. ``sinktoken``'s learned token is the first position
    the layers see, so it is the first key a cache holds: a cache of N keys counts it among its N,
    ``sinks`` with n sink tokens keeps it and the document's first n - 1 tokens, and ``window``
    evicts it once N tokens follow (StreamingLLM's learnable sink token, its "1+1023"; SPEC.md
    "Streaming", a decision of this project). ``offbyone``'s and ``sinklogit``'s phantom is a logit,
    not a key: every policy keeps it. ``layout`` and ``chunk`` are unused (one signature with
    :func:`read_masked`).
    """
    if policy.positions != "original" or policy.quantised:
        raise SinkscopeError(f"a sinkscope trainer model keeps no cache: it is read with {option('positions')} original, unquantised.")
    extra = 0 if getattr(model, "sink_token", None) is None else 1  # sinktoken's learned token, position 0
    positions = torch.arange(ids.shape[1] + extra, device=ids.device)  # (T',)
    logits, _ = model(ids, visible=visible(policy, positions, positions))  # (1, L, V)
    return F.cross_entropy(logits[0, :-1].float(), ids[0, 1:], reduction="none")


def plain_nll(model: nn.Module, ids: Tensor) -> Tensor:
    """The model's own dense forward pass: per-token NLL (L - 1,) float32 (the ``full`` reference)."""
    out = model(input_ids=ids, use_cache=False)
    return F.cross_entropy(out.logits[0, :-1].float(), ids[0, 1:], reduction="none")


def first_layer_keys(model: nn.Module, layout: Layout, ids: Tensor):
    """For ``rotary.check_rerotation``: the first layer's cached keys (1, H_kv, T, D) of ``ids`` read at offset positions.

    The first layer's keys depend on the tokens and their positions only (its input is the embedding).
    """
    from transformers import DynamicCache

    def keys(offset: int) -> Tensor:
        cache = DynamicCache()
        positions = torch.arange(offset, offset + ids.shape[1], device=ids.device).unsqueeze(0)
        model(input_ids=ids, position_ids=positions, use_cache=True, **{layout.cache_kwarg: cache})
        return cache.layers[0].keys
    return keys
