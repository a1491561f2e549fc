"""Additive attention masks, shared by discovery's recording function and the registered ones.

``hidden_keys`` is the causal (sliding-window) rule itself, on absolute positions, shared by the
kernels, the records and ``causal_additive_mask``, which builds the plain causal mask that
``sdpa_mask`` leaves implicit (None);
``_additive`` turns a boolean keep-mask into an additive float one; ``sparse_index_mask`` and
``fold_into_mask`` fold what some models hand an attention function beside its mask (a sparse
indexer's ``indices``, a ``position_bias``) into it. Torch only: ``discover.py`` and
``attention.py`` both import it, and it imports neither.
"""

from __future__ import annotations

import torch
from torch import Tensor


def fold_into_mask(attention_mask: Tensor | None, kwargs: dict, query: Tensor, key: Tensor,
                   window: int | None = None) -> Tensor | None:
    """The mask with what some models pass beside it folded in: a sparse indexer's ``indices``, a ``position_bias``.

    ``position_bias`` (Inkling's; (B or 1, H, T, S)) is added to every logit, as the model's eager
    function adds it; folded into the additive mask, the fused kernel and the record's logits see it
    too. Both are removed from ``kwargs``. A None mask is plain causal, within ``window`` keys where
    the layer has a sliding window (the fused capture leaves a plain window's mask out: ``window_masks.py``).
    """
    attention_mask = sparse_index_mask(attention_mask, kwargs.pop("indices", None), query, key, window)
    bias = kwargs.pop("position_bias", None)
    if isinstance(bias, Tensor):
        S = key.shape[-2]
        base = causal_additive_mask(query.shape[-2], S, query.dtype, query.device, window) if attention_mask is None \
            else _additive(attention_mask[:, :, :, :S], query.dtype)
        attention_mask = base + bias[..., :S].to(query.dtype)  # (B, H, T, S)
    return attention_mask


def sparse_index_mask(attention_mask: Tensor | None, indices: Tensor | None, query: Tensor, key: Tensor,
                      window: int | None = None) -> Tensor | None:
    """The mask with only the keys a sparse indexer selected visible (DeepSeek V3.2's DSA, GLM-MoE-DSA, ...).

    Such models hand a registered attention implementation the top-k key positions of each query
    as ``indices`` (B, T, k) and leave the selection to it (only "eager" and "sdpa" get it folded
    into the mask). Returns an additive float mask (B, 1, T, S) hiding every other key, or the mask
    unchanged when there are no indices.
    """
    if not isinstance(indices, Tensor):
        return attention_mask
    T, S = query.shape[-2], key.shape[-2]
    if attention_mask is None:
        base = causal_additive_mask(T, S, query.dtype, query.device, window)  # (1, 1, T, S)
    else:
        base = _additive(attention_mask[:, :, :, :S], query.dtype)  # (B, 1, T, S)
    hidden = torch.ones(indices.shape[0], T, S, dtype=torch.bool, device=query.device)
    hidden = hidden.scatter(-1, indices.long().clamp(min=0, max=S - 1), False).unsqueeze(1)  # (B, 1, T, S)
    return base.masked_fill(hidden, torch.finfo(query.dtype).min)


def hidden_keys(queries: Tensor, keys: Tensor, window: int | None = None) -> Tensor:
    """Where key position j is hidden from query position i under causal attention: j > i, and with a
    sliding ``window`` W also j <= i - W (transformers' ``sliding_window``: W keys, i's own included).

    ``queries`` and ``keys`` are absolute positions that broadcast, e.g. (n, 1) and (1, K); bool.
    """
    hidden = keys > queries  # (n, K)
    if window is not None:
        hidden = hidden | (keys <= queries - window)  # (n, K)
    return hidden


def causal_additive_mask(T: int, S: int, dtype: torch.dtype, device, window: int | None = None) -> Tensor:
    """0 where query i (at position i + S - T) sees key j (:func:`hidden_keys`), the dtype's minimum
    elsewhere; (1, 1, T, S)."""
    rows = torch.arange(T, device=device).unsqueeze(-1) + (S - T)  # (T, 1)
    hidden = hidden_keys(rows, torch.arange(S, device=device).unsqueeze(0), window)  # (T, S)
    return torch.zeros(T, S, dtype=dtype, device=device).masked_fill(hidden, torch.finfo(dtype).min).view(1, 1, T, S)


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean keep-mask (sdpa_mask) as an additive float mask; float masks pass through."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask.to(dtype)
