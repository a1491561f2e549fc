"""Positions counted within the cache: re-rotating cached keys (StreamingLLM's convention, SPEC.md "Streaming").

A rotary model stores keys already rotated at the position their token was read at. Counting
positions within the cache means the key in slot s is seen at position s (StreamingLLM section
3.2; kvpress's ``KeyRerotationPress``). The reader keeps each cached key's rotary part unrotated,
in float32 (``unrotate`` once, when the key enters), and writes the cache's keys as
``rotate(pre, target)`` after every eviction, so no rounding accumulates over a long text.

Rotation is the rotate-half form of transformers' ``apply_rotary_pos_emb`` on the first
``2 * len(inv_freq)`` channels of a head (partial rotary as GPT-NeoX's): for angle
``theta = p * inv_freq``, ``x' = x cos + rotate_half(x) sin``. The model's ``attention_scaling``
multiplies both cos and sin, so it is already inside the stored key and re-rotation leaves it.
Before a run, :func:`check_rerotation` verifies this on the model itself: the first layer's keys
of the same tokens read at positions p and p + d must be each other's rotation by d; a model
where they are not (no rotary embedding, interleaved rotation, several rotary tables) is refused
in one sentence.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sinkscope.errors import SinkscopeError, option


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the last dimension's halves."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotate(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """x rotated by angle ``positions * inv_freq``: x (B, H, S, R) float, positions (S,) or (H, S); R = 2 len(inv_freq)."""
    angle = positions.to(torch.float64).unsqueeze(-1) * inv_freq.to(torch.float64)  # (..., S, R/2)
    emb = torch.cat((angle, angle), dim=-1)  # (..., S, R)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    if positions.dim() == 2:  # per head
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)  # (1, H, S, R)
    return x * cos + rotate_half(x) * sin


def model_inv_freq(model: nn.Module) -> Tensor | None:
    """The model's one rotary table (float32), None without one; several different ones: an error.

    Tables are the buffers named ``*inv_freq`` (``inv_freq``; Gemma 3's ``full_attention_inv_freq`` and
    ``sliding_attention_inv_freq``), not the ``original_*`` copies kept for dynamic RoPE.
    """
    tables = []
    for name, buffer in model.named_buffers():
        leaf = name.rsplit(".", 1)[-1]
        if leaf.endswith("inv_freq") and "original" not in leaf and buffer.dim() == 1:
            table = buffer.float().cpu()
            if not any(t.shape == table.shape and torch.equal(t, table) for t in tables):
                tables.append(table)
    if len(tables) > 1:
        raise SinkscopeError(f"{option('positions')} cache re-rotates the cached keys with the model's rotary table, and this "
                             f"model has {len(tables)} different ones (one per layer type); use {option('positions')} original.")
    return tables[0] if tables else None


def rope_type(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    return params.get("rope_type", params.get("type")) if isinstance(params, dict) else None


def check_rerotation(model: nn.Module, layer_keys, inv_freq: Tensor | None, *, shift: int = 37,
                     problem: str | None = None) -> None:
    """Refuse ``--positions cache`` (one sentence) where re-rotating keys is not what the model computes.

    ``layer_keys(position_offset)`` returns the first attention layer's cached keys (1, H_kv, T, D)
    for a few fixed tokens read at positions ``offset + arange(T)``. Keys read at 0 must rotate by
    ``shift`` into the keys read at ``shift``.
    """
    name = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    if problem:
        raise SinkscopeError(problem)
    if inv_freq is None:
        raise SinkscopeError(f"{option('positions')} cache re-rotates cached keys, and the {name!r} model has no rotary "
                             f"position embedding; use {option('positions')} original.")
    if rope_type(model) in ("dynamic", "longrope"):
        raise SinkscopeError(f"{option('positions')} cache re-rotates cached keys with one rotary table, and the {name!r} "
                             f"model's {rope_type(model)} RoPE changes its table with the length; use {option('positions')} original.")
    at_0, at_shift = layer_keys(0).float(), layer_keys(shift).float()  # (1, H_kv, T, D)
    R = 2 * inv_freq.numel()
    T = at_0.shape[-2]
    moved = rotate(at_0[..., :R], torch.full((T,), shift), inv_freq)  # (1, H_kv, T, R)
    scale = max(1e-6, float(at_shift.abs().max()))
    error = float((moved - at_shift[..., :R]).abs().max()) / scale
    same_rest = torch.allclose(at_0[..., R:], at_shift[..., R:], atol=1e-3 * scale)
    tolerance = 1e-4 if at_0.dtype == torch.float32 and layer_keys(0).dtype == torch.float32 else 3e-2
    if not (error <= tolerance and same_rest):
        raise SinkscopeError(f"{option('positions')} cache re-rotates cached keys in the rotate-half form, and the {name!r} "
                             f"model's keys do not rotate so (error {error:.2g} of their scale); use {option('positions')} original.")
