"""A quantised cache's slots after each chunk (SPEC.md "Quantised KV caches"): which keys and values leave full
precision, and which ``--protect`` holds. ``stream.reader`` calls both once per layer, after the policy's eviction; the quantiser
itself is ``kv_quant``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinkscope.kvcache.policies import Policy
from sinkscope.kvcache.quant import KVQuant, complete_groups, quantize_keys, quantize_values


def quantise_slots(keys: Tensor, values: Tensor, pre: Tensor | None, orig: Tensor, exact: Tensor, policy: Policy,
                   R: int, guard: Tensor | None = None, value_exact: Tensor | None = None
                   ) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """Quantise the keys and values that leave full precision now (SPEC.md "Quantised KV caches"; ``kv_quant``).

    Candidates: slots held exactly that are not among the document's first ``protect_sinks``
    tokens nor held by ``--protect``'s rule (``guard``, :func:`guard_slots`). Keys: ``per-token``
    takes every candidate; ``kivi`` and ``kivi-grouped`` whole blocks of the residual length
    (``complete_groups``, oldest first), the rest waiting in full precision. Values: ``kivi`` takes
    every candidate value not among the ``kv_residual`` most recent tokens of the document (KIVI's
    full-precision window); the other layouts quantise a slot's value together with its key. Each
    is quantised once. The stored key is quantised: the key itself with original positions, its
    unrotated form (``pre``'s rotary part and the key's other channels) with ``--positions cache``,
    which the reader re-rotates. keys (1, H_kv, S, D), values (1, H_kv, S, D_v), pre (1, H_kv, S, R)
    or None, orig, exact (keys held exactly) and value_exact (values held exactly; None: as
    ``exact``) (H_kv, S). Returns keys, values, pre, exact and value_exact, updated.
    """
    setting = KVQuant(policy.kv_bits, policy.kv_group, policy.kv_scheme, policy.kv_residual)
    value_exact = exact if value_exact is None else value_exact
    held = orig >= policy.protect_sinks  # (H_kv, S): not among the first tokens
    if guard is not None:
        held = held & ~guard
    key_candidates = exact & held  # (H_kv, S)
    if setting.values_follow_keys:
        value_candidates = torch.zeros_like(exact)  # quantised with their keys below
    else:
        window_start = int(orig.max()) - setting.residual_length + 1  # KIVI's R most recent values stay exact
        value_candidates = value_exact & held & (orig < window_start)  # (H_kv, S)
    if not key_candidates.any() and not value_candidates.any():
        return keys, values, pre, exact, value_exact
    keys, values, exact, value_exact = keys.clone(), values.clone(), exact.clone(), value_exact.clone()
    pre = None if pre is None else pre.clone()
    for head in range(keys.shape[1]):
        slots = key_candidates[head].nonzero().squeeze(1)  # (n,) ascending: reading order
        slots = slots[:complete_groups(slots.numel(), setting)]
        if slots.numel():
            _quantise_keys(keys, pre, head, slots, setting, R)
            exact[head, slots] = False
        taken = slots if setting.values_follow_keys else value_candidates[head].nonzero().squeeze(1)  # (m,)
        if taken.numel():
            values[:, head:head + 1, taken] = quantize_values(values[:, head:head + 1, taken], setting)
            value_exact[head, taken] = False
    return keys, values, pre, exact, value_exact


def _quantise_keys(keys: Tensor, pre: Tensor | None, head: int, slots: Tensor, setting: KVQuant, R: int) -> None:
    """Quantise one head's keys at ``slots`` in place (their unrotated form with ``pre``; :func:`quantise_slots`)."""
    stored = keys[:, head:head + 1, slots]  # (1, 1, n, D)
    if pre is not None:
        stored = torch.cat([pre[:, head:head + 1, slots].to(keys.dtype), stored[..., R:]], dim=-1)
    stored = quantize_keys(stored, setting)  # (1, 1, n, D)
    if pre is not None:
        pre[:, head:head + 1, slots] = stored[..., :R].float()
    keys[:, head:head + 1, slots] = stored


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
