"""Attention that also returns the log-sum-exp of every row, without materialising weights.

``attention_with_lse(q, k, v, scale, mask)`` returns the attention output and
``LSE_i = log sum_j exp(s_ij)`` over real keys. With the LSE every row reduction the sink
probes need is exact and cheap: the mass on key p is ``exp(s_ip - LSE_i)`` (one dot product
per query), the phantom mass is ``sigmoid(b_h - LSE_i)``. Memory is linear in the sequence
length (the mask of a sliding-window layer aside).

Kernels, in order of preference:
- CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` (returns the LSE);
- CUDA: ``aten._scaled_dot_product_efficient_attention(compute_log_sumexp=True)``;
- anything else (or if those refuse the inputs): a blocked explicit computation, one block of
  queries at a time (memory B*H*block*S).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: queries per block in the blocked fallback.
QUERY_BLOCK = 256


def blocked_attention_with_lse(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None,
                               block: int = QUERY_BLOCK) -> tuple[Tensor, Tensor]:
    """Reference-exact attention by query blocks; mask None means causal.

    Shapes: q (B, H, T, D), k/v (B, H, S, D), mask (B|1, 1, T, S) additive or None.
    Returns out (B, H, T, D) in q's dtype and lse (B, H, T) float32.
    """
    B, H, T, _ = q.shape
    S = k.shape[-2]
    outs, lses = [], []
    for start in range(0, T, block):
        stop = min(start + block, T)
        s = torch.matmul(q[:, :, start:stop].float(), k.float().transpose(-1, -2)) * scale  # (B, H, b, S)
        if mask is not None:
            s = s + mask[:, :, start:stop].float()
        else:
            rows = torch.arange(start, stop, device=q.device).unsqueeze(-1) + (S - T)  # (b, 1)
            hidden = torch.arange(S, device=q.device).unsqueeze(0) > rows  # (b, S)
            s = s.masked_fill(hidden, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # (B, H, b)
        p = torch.exp(s - lse.unsqueeze(-1))  # (B, H, b, S)
        outs.append(torch.matmul(p, v.float()).to(q.dtype))  # (B, H, b, D)
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def attention_with_lse(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Fused attention returning (out (B, H, T, D), lse (B, H, T) float32); mask None = causal.

    ``k`` and ``v`` must already have H heads (repeat KV heads for GQA first). ``mask`` is an
    additive float mask broadcastable to (B, H, T, S) in q's dtype.
    """
    is_causal = mask is None
    try:
        if q.device.type == "cpu":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale)
            return out, lse.float()
        if q.device.type == "cuda":
            bias = None if mask is None else mask.expand(q.shape[0], q.shape[1], -1, -1)
            out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, bias, True, 0.0, is_causal, scale=scale)
            return out, lse[..., : q.shape[-2]].float()
    except (RuntimeError, NotImplementedError):  # unsupported dtype/shape: fall through, stay exact
        pass
    return blocked_attention_with_lse(q, k, v, scale, mask)
