"""The fused capture's masks: transformers' own, except a plain sliding window, which the kernel applies.

For a sliding-window layer (Mistral, Gemma 3, Qwen 2, gpt-oss's alternate layers) transformers
builds a (B, 1, T, S) mask whenever the window is shorter than the keys: at 32,768 tokens that is
a gigabyte in bool and two in bfloat16, per kind of layer, and an explicit mask also bars the
flash kernels, so the capture computed every (i, j) of a 128-key window with the memory-efficient
kernel: 5.5x a plain flex-attention forward of gpt-oss-20b at 32k tokens on an H200 (issue 42).

When the mask asked for is exactly causal-within-a-window of ``local_size`` keys, with nothing
else in it, and every attention call of the model names its window (``sliding_window=``, None on
a full layer: what transformers' own flash path reads; ``discover.Parts.window_kwarg``; Exaone 4
keeps a ``sliding_window`` attribute on its full layers too, Phi-MoE names none), the mask
functions here return None instead; the attention function then passes the call's
``sliding_window`` to the kernel (``flash_window`` on CUDA, query blocks on the CPU:
``kernels.attention_with_lse(window=W)``) and the record's logits apply the same window
(``AttentionRecord.sliding_window``). "Nothing else" means, from transformers' own arguments:

- ``allow_is_causal_skip`` is True: ``masking_utils`` turns it off for every or/and overlay
  (image tokens, bidirectional prefixes), packed sequences and block overlays;
- no 2-D ``attention_mask`` (padding) and no cache: ``q_offset == kv_offset == 0``, ``T == S``;
- ``mask_function`` is the sliding-window causal one: checked on index pairs that tell it apart
  from chunked attention (Llama 4's ``local_size`` is a chunk): both edges of the window, and
  pairs across a chunk boundary.

Models without SDPA get transformers' eager (float) mask, as before, unless they support flash
attention, whose own masks are None for such layers (their code cannot rely on a float mask):
for them a plain causal mask is left out too (:func:`is_plain_causal`, what ``sdpa_mask`` leaves
out for every SDPA model), and the kernel runs causal. gpt-oss is one: its full layers ran the
memory-efficient kernel with a (T, T) float mask before. DeepSeek V4, which edits its mask as
floats, supports neither and keeps it.
"""

from __future__ import annotations

from typing import Callable

import torch
from transformers.masking_utils import eager_mask, sdpa_mask


def _is_window_function(mask_function: Callable | None, window: int | None) -> bool:
    """Whether ``mask_function(b, h, q, kv)`` is (kv <= q) & (kv > q - window) on probing pairs
    (``window`` None: plain causal, kv <= q)."""
    if mask_function is None or (window is not None and window < 1):
        return False
    w = window or 64  # plain causal: probe as far as a window of 64 would reach
    pairs = []
    for q in sorted({0, 1, w - 1, w, w + 1, 2 * w - 1, 2 * w, 2 * w + 1, 3 * w}):
        for kv in (0, 1, q - w - 1, q - w, q - w + 1, q - 2, q - 1, q, q + 1):
            if kv >= 0:
                pairs.append((q, kv))
    q = torch.tensor([p[0] for p in pairs])  # (P,)
    kv = torch.tensor([p[1] for p in pairs])  # (P,)
    zeros = torch.zeros_like(q)
    try:
        got = mask_function(zeros, zeros, q, kv)
    except Exception:  # noqa: BLE001 - a function that cannot be probed this way is not the plain window
        return False
    if not isinstance(got, torch.Tensor) or got.shape != q.shape or got.dtype != torch.bool:
        return False
    expected = (kv <= q) if window is None else (kv <= q) & (kv > q - window)
    return bool(torch.equal(got.cpu(), expected))


def _zero(value) -> bool:
    """A plain integer 0 (a tensor offset belongs to a static cache: never plain)."""
    return isinstance(value, int) and not isinstance(value, bool) and value == 0


def _unpadded_without_cache(kwargs: dict) -> bool:
    """Causal skip allowed, no padding mask, no cache (offsets 0, as many keys as queries)."""
    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    return (kwargs.get("allow_is_causal_skip", True) is True and kwargs.get("attention_mask") is None
            and _zero(kwargs.get("q_offset", 0)) and _zero(kwargs.get("kv_offset", 0))
            and isinstance(q_length, int) and q_length == kv_length)


def is_plain_window(kwargs: dict) -> bool:
    """Whether the mask transformers asks for (by keyword, as ``create_*_mask`` do) is a plain causal sliding window."""
    window = kwargs.get("local_size")
    return (isinstance(window, int) and _unpadded_without_cache(kwargs)
            and _is_window_function(kwargs.get("mask_function"), window))


def is_plain_causal(kwargs: dict) -> bool:
    """Whether the mask asked for is plain causal (what ``sdpa_mask`` leaves out, and ``eager_mask`` spells out)."""
    return (kwargs.get("local_size") is None and _unpadded_without_cache(kwargs)
            and _is_window_function(kwargs.get("mask_function"), None))


def fused_sdpa_mask(*args, window_named: Callable[[], bool], **kwargs):
    """transformers' ``sdpa_mask``, but None for a plain sliding window where ``window_named()`` says every
    attention call names its window (the kernel applies it)."""
    if not args and window_named() and is_plain_window(kwargs):
        return None
    return sdpa_mask(*args, **kwargs)


def fused_eager_mask(*args, none_allowed: Callable[[], bool], window_named: Callable[[], bool], **kwargs):
    """transformers' ``eager_mask``, but None for a plain causal mask, or a plain sliding window whose calls
    name it, where ``none_allowed()`` says the model tolerates it (it supports flash attention, whose masks are
    None there)."""
    if not args and none_allowed() and (is_plain_causal(kwargs) or (window_named() and is_plain_window(kwargs))):
        return None
    return eager_mask(*args, **kwargs)
