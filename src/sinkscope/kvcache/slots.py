"""A quantised cache's slots after each chunk (SPEC.md "Quantised KV caches"): which leave full precision, and which
``--protect`` holds. ``stream.reader`` calls both once per layer, after the policy's eviction; the quantiser
itself is ``kv_quant``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinkscope.kvcache.policies import Policy
from sinkscope.kvcache.quant import KVQuant, complete_groups, quantize_keys, quantize_values


def quantise_slots(keys: Tensor, values: Tensor, pre: Tensor | None, orig: Tensor, exact: Tensor, policy: Policy,
              R: int, guard: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Quantise the slots that leave full precision now (SPEC.md "Quantised KV caches"; ``kv_quant``).

    Candidates: slots held exactly that are not among the document's first ``protect_sinks``
    tokens nor held by ``--protect``'s rule (``guard``, :func:`guard_slots`). ``per-token`` takes them all; ``kivi`` whole groups of ``kv_group`` (oldest first), the
    rest waiting as its full-precision residual. A slot's key and value are quantised together,
    once. The stored key is quantised: the key itself with original positions, its unrotated form
    (``pre``'s rotary part and the key's other channels) with ``--positions cache``, which the
    reader re-rotates. keys (1, H_kv, S, D), values (1, H_kv, S, D_v), pre (1, H_kv, S, R) or None,
    orig and exact (H_kv, S). Returns them updated.
    """
    setting = KVQuant(policy.kv_bits, policy.kv_group, policy.kv_scheme)
    candidates = exact & (orig >= policy.protect_sinks)  # (H_kv, S)
    if guard is not None:
        candidates = candidates & ~guard
    if not candidates.any():
        return keys, values, pre, exact
    keys, values, exact = keys.clone(), values.clone(), exact.clone()
    pre = None if pre is None else pre.clone()
    for head in range(keys.shape[1]):
        slots = candidates[head].nonzero().squeeze(1)  # (n,) ascending: reading order
        slots = slots[:complete_groups(slots.numel(), setting)]
        if not slots.numel():
            continue
        stored = keys[:, head:head + 1, slots]  # (1, 1, n, D)
        if pre is not None:
            stored = torch.cat([pre[:, head:head + 1, slots].to(keys.dtype), stored[..., R:]], dim=-1)
        stored = quantize_keys(stored, setting)  # (1, 1, n, D)
        if pre is not None:
            pre[:, head:head + 1, slots] = stored[..., :R].float()
        keys[:, head:head + 1, slots] = stored
        values[:, head:head + 1, slots] = quantize_values(values[:, head:head + 1, slots], setting)
        exact[head, slots] = False
    return keys, values, pre, exact


def guard_slots(rule: tuple[str, int], exact: Tensor, orig: Tensor, protect_sinks: int, mass: Tensor | None,
           held: Tensor | None, generator: torch.Generator) -> Tensor:
    """The slots ``--protect`` holds in full precision after this chunk, (H_kv, S) bool, per key-value head.

    The pool is the slots not yet quantised and not among the first ``protect_sinks`` tokens (a
    quantised key is never restored). ``top-p0:N``: the N of the pool with the highest accumulated
    attention ``mass`` (as H2O's score: each key's attention weight summed over every query that has
    seen it and over the query heads of its key-value head; ties to the earlier slot); a key that
    falls out of the N is quantised then. ``random:N`` (the control): the slots ``held`` before stay
    held, and the free places are filled uniformly from the rest of the pool (``generator``).
    """
    kind, n = rule
    pool = exact & (orig >= protect_sinks)  # (H_kv, S)
    if kind == "top-p0":
        ranked = torch.where(pool, mass, torch.full_like(mass, -1.0))  # (H_kv, S)
        order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[:, :n]  # (H_kv, <= n)
        chosen = torch.zeros_like(pool).scatter_(1, order, True)
        return chosen & pool
    chosen = pool & held if held is not None else torch.zeros_like(pool)
    for head in range(pool.shape[0]):
        free = n - int(chosen[head].sum())
        rest = (pool[head] & ~chosen[head]).nonzero().squeeze(1)  # (m,)
        if free > 0 and rest.numel():
            pick = torch.randperm(rest.numel(), generator=generator)[:free].to(rest.device)
            chosen[head, rest[pick]] = True
    return chosen
