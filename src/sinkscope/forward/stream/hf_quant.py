"""``stream --kv-backend transformers``: a document read through transformers' own ``QuantizedCache``.

transformers 5.x quantises a cache with ``QuantizedCache(backend="quanto", ...)`` (optimum-quanto,
an optional extra: ``pip install 'sinkscope[kvquant]'``). Its layer keeps a full-precision residual
of at most ``residual_length`` tokens and, once an update reaches it, quantises the whole cache
(the dequantised part, the residual and the new tokens) again; the forward pass that triggers the
flush still attends to the new tokens in full precision. Quanto's affine quantiser with
``MaxOptimizer`` is SPEC.md's formula (scale = (max - min) / (2^b - 1), zero point at the minimum),
and ``axis=0`` groups ``g`` consecutive elements of the contiguous (B, H_kv, S, D) cache: ``g``
channels of one token when ``g`` divides D, sinkscope's ``per-token`` layout.

So with ``residual_length = 1`` every chunk is flushed after its forward pass, as sinkscope's
``per-token`` quantiser does (``stream.reader``): a query sees the earlier chunks quantised and its
own chunk in full precision. Re-quantising an already quantised group puts every value back on
the same grid (its minimum and maximum are grid points), up to float32 rounding. That is the one
setting both serve, and a test holds the two to each other. Everything else stays with sinkscope's
quantiser: a bounded cache (transformers' quantised layer cannot evict or re-rotate), ``kivi``
(quanto quantises keys along channels or whole flattened rows, never per channel over a group of
tokens), protected tokens, and 8 or 3 bits (quanto's KV layer takes 2 and 4).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sinkscope.kvcache.policies import Policy
from sinkscope.capture.masks import causal_additive_mask
from sinkscope.errors import SinkscopeError, option
from sinkscope.forward.runner import DiscardRecords

def check_available() -> None:
    """One sentence when optimum-quanto is missing."""
    from transformers.utils import is_optimum_quanto_available

    if not is_optimum_quanto_available():
        raise SinkscopeError(f"{option('kv_backend')} transformers needs optimum-quanto (pip install 'sinkscope[kvquant]'); "
                             f"or use {option('kv_backend')} sinkscope.")


def read_quantised_cache(model: nn.Module, ids: Tensor, policy: Policy, cache_kwarg: str, *, chunk: int,
                         on_chunk: Callable[[int], None] | None = None) -> Tensor:
    """Per-token NLL (L - 1,) float32 of ``ids`` (1, L) read ``chunk`` tokens at a time through
    ``QuantizedCache(backend="quanto", nbits, axis 0, q_group_size, residual_length=1)``;
    ``on_chunk(tokens)`` after each chunk (a progress bar)."""
    from transformers import QuantizedCache

    from sinkscope.capture.attention import capture

    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    if head_dim % policy.kv_group:
        raise SinkscopeError(f"transformers' quanto cache groups {policy.kv_group} consecutive channels, and the head "
                             f"dimension {head_dim} is not a multiple of it; use a {option('kv_group')} that divides "
                             f"{head_dim}, or {option('kv_backend')} sinkscope.")
    check_available()
    cache = QuantizedCache(backend="quanto", config=model.config, nbits=policy.kv_bits, axis_key=0, axis_value=0,
                           q_group_size=policy.kv_group, residual_length=1)
    L = ids.shape[1]
    nll = []
    with capture(model, DiscardRecords(), mode="fused"):  # the same attention kernel as every other condition
        for t0 in range(0, L, chunk):
            k = min(chunk, L - t0)
            queries = torch.arange(t0, t0 + k, device=ids.device)  # (k,)
            mask = causal_additive_mask(k, t0 + k, next(model.parameters()).dtype, ids.device)  # (1, 1, k, t0 + k)
            out = model(input_ids=ids[:, t0:t0 + k], attention_mask=mask, position_ids=queries.unsqueeze(0),
                        use_cache=True, **{cache_kwarg: cache})
            targets = ids[0, t0 + 1:t0 + k + 1]  # (m,)
            nll.append(F.cross_entropy(out.logits[0, :targets.numel()].float(), targets, reduction="none"))
            del out
            if on_chunk is not None:
                on_chunk(k)
    return torch.cat(nll)
