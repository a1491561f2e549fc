"""Read one document through a bounded key-value cache; the per-token negative log-likelihood (SPEC.md "Streaming").

Streaming (:func:`read_stream`): the document's tokens are read ``chunk`` at a time through
transformers' ``DynamicCache``. Each chunk's queries see the keys the cache holds plus the chunk's
own keys up to themselves (a 4D mask handed to the model, which transformers passes through
unchanged); after the chunk, every layer's cache is cut back to the policy's budget
(``policies.keep_slots``). Memory is bounded by the cache and the chunk, never by the text.

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
keys the streaming cache would hold (``policies.masked_keep``), with original positions. It is
the reference the streaming mode must equal (tests: at chunk 1 and at larger chunks), for the
static policies only (full, window, sinks).

The NLL of position i is the cross-entropy of the logits read at token i predicting token i + 1,
in float32: a document of L tokens gives L - 1 values.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sinkscope.capture import hooks as hp
from sinkscope.capture.families import layer_windows
from sinkscope.errors import SinkscopeError
from sinkscope.stream import heap, rotary
from sinkscope.stream.policies import Policy, keep_slots, last_slots, masked_keep


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
                             "--length, so no cache policy has a layer to act on; use a --length within its window.")
    if len({w for w in windows if w is not None}) > 1:
        raise SinkscopeError(f"the {name!r} model's layers have sliding windows of several sizes; stream reads "
                             "models with one window size.")
    layer_types = list(getattr(model.config, "layer_types", None) or []) or None
    if any(w is not None for w in windows):
        source = inspect.getsource(inspect.getmodule(type(_base(model))))
        if "attention_mask, dict)" not in source or layer_types is None:
            raise SinkscopeError(f"the {name!r} model has sliding-window layers and takes no mask per layer type, so "
                                 "stream cannot hand it the cache's masks; use a --length within its window.")
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
    """Observes attention records and keeps, per layer, each key's attention summed over queries: (H_kv, S)."""

    intervened = frozenset()
    record_columns = frozenset()

    def __init__(self, layers: list[int]):
        self.observed = frozenset({hp.ATTN})
        self.layers = set(layers)
        self.columns: dict[int, Tensor] = {}

    def emit(self, template: str, layer: int | None, record) -> None:
        if template != hp.ATTN or layer not in self.layers:
            return
        a = torch.exp(record.logits() - record.lse().unsqueeze(-1)) * record.real_mass().unsqueeze(-1)  # (B, H, T, S)
        column = a.sum(2)[0]  # (H, S): sum over queries
        H, S = column.shape
        self.columns[layer] = column.view(record.n_kv_heads, H // record.n_kv_heads, S).sum(1).double()  # (H_kv, S)

    def replace(self, template: str, layer: int, value: Tensor) -> Tensor:
        return value


@dataclass
class _Slots:
    """One layer's cache bookkeeping: original position, unrotated rotary part and H2O score per slot."""

    orig: Tensor  # (H_kv, S) int64
    pre: Tensor | None = None  # (1, H_kv, S, R) float32
    score: Tensor | None = None  # (H_kv, S) float64


def _additive(visible: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean visibility (T, S) as the additive mask (1, 1, T, S) the model adds to its logits."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill(~visible, torch.finfo(dtype).min).view(1, 1, *visible.shape)


def _chunk_masks(layout: Layout, slots: list[_Slots | None], t0: int, k: int, dtype, device):
    """The masks for a chunk of ``k`` queries at original positions t0..t0+k-1: a tensor, or a dict per layer type."""
    queries = torch.arange(t0, t0 + k, device=device)  # (k,)
    causal = queries.unsqueeze(0) <= queries.unsqueeze(1)  # (k, k): key b <= query a
    full = layout.full_layers[0]
    n_full = 0 if slots[full] is None else slots[full].orig.shape[1]
    full_mask = _additive(torch.cat([torch.ones(k, n_full, dtype=torch.bool, device=device), causal], dim=1), dtype)
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


def _gather(x: Tensor, keep: Tensor, shared: bool) -> Tensor:
    """x (B, H_kv, S, ...) at the slots ``keep`` (H_kv, S') along dim 2."""
    if shared:
        return x.index_select(2, keep[0])
    index = keep.view(1, *keep.shape, *([1] * (x.dim() - 3))).expand(x.shape[0], *keep.shape, *x.shape[3:])
    return x.gather(2, index)


def _evict(cache, slots: list[_Slots | None], policy: Policy, layout: Layout, t0: int, k: int,
           query_positions: Tensor, columns: dict[int, Tensor] | None) -> None:
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
        if keep is not None:
            shared = policy.name != "h2o" or W is not None
            keys, values = _gather(keys, keep, shared), _gather(values, keep, shared)
            orig = orig.gather(1, keep)
            pre = None if pre is None else _gather(pre, keep, shared)
            score = None if score is None else score.gather(1, keep)
        S = orig.shape[1]
        if W is None:
            n_full_after = S
        if reorder:
            target = torch.arange(S, device=keys.device) + (0 if W is None else n_full_after - S)  # (S,)
            keys = torch.cat([rotary.rotate(pre, target, layout.inv_freq).to(keys.dtype), keys[..., R:]], dim=-1)
        store.keys, store.values = keys.contiguous(), values.contiguous()
        slots[layer] = _Slots(orig, pre, score)


@dataclass
class ChunkRead:
    """What one chunk's reading gave (:func:`iter_chunks`).

    Attributes:
        start: the chunk's first token (original position).
        nll: the NLL of the tokens the chunk predicts, (m,) float32 (m = the chunk's length, one less at the end).
        kept: per layer, the original positions the cache holds after the chunk, (H_kv, S) int64.
    """

    start: int
    nll: Tensor
    kept: list[Tensor]


def iter_chunks(model: nn.Module, ids: Tensor, policy: Policy, layout: Layout, *, chunk: int):
    """Read ``ids`` (1, L) ``chunk`` tokens at a time under ``policy``; yields a :class:`ChunkRead` per chunk."""
    from transformers import DynamicCache

    from sinkscope.capture.attention import capture

    L = ids.shape[1]
    if policy.positions == "cache" and layout.inv_freq is None:
        raise SinkscopeError(layout.rotary_problem or "--positions cache needs a rotary model; use --positions original.")
    heap.fix_mmap_threshold()  # else glibc serves each chunk's logits from a fragmenting heap (heap.py)
    device = ids.device
    dtype = next(model.parameters()).dtype
    cache = DynamicCache()
    slots: list[_Slots | None] = [None] * len(layout.windows)
    # every condition runs sinkscope's fused attention (one kernel for all, learned sinks exact, linear
    # memory); only h2o reads the records, the others' records are dropped unread
    observer = _ColumnMass(layout.full_layers if policy.name == "h2o" else [])
    with capture(model, observer, mode="fused"):
        for t0 in range(0, L, chunk):
            k = min(chunk, L - t0)
            full = slots[layout.full_layers[0]]
            n_full = 0 if full is None else full.orig.shape[1]
            start = t0 if policy.positions == "original" else n_full
            positions = torch.arange(start, start + k, device=device)  # (k,)
            masks = _chunk_masks(layout, slots, t0, k, dtype, device)
            out = model(input_ids=ids[:, t0:t0 + k], attention_mask=masks, position_ids=positions.unsqueeze(0),
                        use_cache=True, **{layout.cache_kwarg: cache})
            targets = ids[0, t0 + 1:t0 + k + 1]  # (m,), m = k or k - 1 at the end
            nll = F.cross_entropy(out.logits[0, :targets.numel()].float(), targets, reduction="none")  # (m,)
            del out
            _evict(cache, slots, policy, layout, t0, k, positions, observer.columns)
            observer.columns.clear()
            yield ChunkRead(t0, nll, [state.orig for state in slots])


def read_stream(model: nn.Module, ids: Tensor, policy: Policy, layout: Layout, *, chunk: int) -> Tensor:
    """Per-token NLL (L - 1,) float32 of ``ids`` (1, L) read ``chunk`` tokens at a time under ``policy``."""
    return torch.cat([read.nll for read in iter_chunks(model, ids, policy, layout, chunk=chunk)])


def read_masked(model: nn.Module, ids: Tensor, policy: Policy, layout: Layout, *, chunk: int) -> Tensor:
    """The exact reference: per-token NLL (L - 1,) from one dense pass whose mask is the cache's (original positions)."""
    if policy.positions != "original":
        raise SinkscopeError("the mask-based reading keeps original positions; --positions cache needs streaming.")
    L = ids.shape[1]
    device = ids.device
    dtype = next(model.parameters()).dtype
    visible = torch.zeros(L, L, dtype=torch.bool, device=device)  # (query, key)
    for t0 in range(0, L, chunk):
        t1 = min(L, t0 + chunk)
        past = torch.as_tensor(list(masked_keep(policy, t0)), dtype=torch.long, device=device)
        visible[t0:t1, past] = True
        visible[t0:t1, t0:t1] = torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=device).tril()
    full_mask = _additive(visible, dtype)
    masks = full_mask
    W = layout.sliding_window
    if W is not None:
        positions = torch.arange(L, device=device)
        gap = positions.unsqueeze(1) - positions.unsqueeze(0)  # (query, key)
        sliding = _additive((gap >= 0) & (gap < W), dtype)
        masks = {kind: sliding if "sliding" in str(kind) else full_mask for kind in set(layout.layer_types)}
    from sinkscope.capture.attention import capture

    with capture(model, _ColumnMass([]), mode="fused"):
        out = model(input_ids=ids, attention_mask=masks, position_ids=torch.arange(L, device=device).unsqueeze(0),
                    use_cache=False)
    return F.cross_entropy(out.logits[0, :-1].float(), ids[0, 1:], reduction="none")


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
