"""Attention that also returns the log-sum-exp of every row, without materialising weights.

``attention_with_lse(q, k, v, scale, mask)`` returns the attention output and
``LSE_i = log sum_j exp(s_ij)`` over real keys. With the LSE every row reduction the sink
probes need is exact and cheap: the mass on key p is ``exp(s_ip - LSE_i)`` (one dot product
per query), the phantom mass is ``sigmoid(b_h - LSE_i)``. Memory is linear in the sequence
length (an explicit mask aside).

Kernels (:func:`candidate_kernels` orders them per device, dtype, head size and masking; on CUDA
the backend SDPA itself would pick for the same causal problem goes first (:func:`sdpa_first`:
on an H200 that is cuDNN, 1.5x faster than flash at 32k tokens, and a plain forward runs it); the
first that runs is used and :func:`kernel_choices` / the ``sinkscope.capture.kernels`` logger
say which, once per kind of call):

==============  =====================================================  ==========================
name            op (all return the LSE)                                 when
==============  =====================================================  ==========================
``cpu_flash``   ``aten._scaled_dot_product_flash_attention_for_cpu``    CPU; any mask
``flash``       ``aten._scaled_dot_product_flash_attention``            CUDA sm80+, fp16/bf16,
                                                                        head dim <= 256, causal
``flash_window`` ``aten._flash_attention_forward(window_size_left=W-1)`` same, causal sliding window
``cudnn``       ``aten._scaled_dot_product_cudnn_attention``            CUDA sm80+, fp16/bf16,
                                                                        head dim <= 128; any mask
``efficient``   ``aten._scaled_dot_product_efficient_attention``        CUDA; any mask, any float
``blocked``     exact matmuls, one block of queries at a time           anything, the fallback
==============  =====================================================  ==========================

Where a probe needs the attention each key receives (``stream``'s ``h2o`` and ``--protect top-p0``:
record column ``"received"``), :func:`attention_with_received` replaces the kernel: exact float32
attention by query blocks whose one product of queries and keys gives the output, the LSE and the
column sums together (grouped query heads folded onto their key head, no key repeated); on a CPU at
64-query chunks it is no slower than the flash kernel with its repeated keys (docs/commands/stream.md).

Every private op is called from one function, :func:`_private_attention`, and only after
:func:`private_op_available` has checked the torch version and the op's schema (argument
names and order), so a torch release that changes one of them falls back instead of
miscomputing. On an accelerator each fused kernel is also checked once per kind of call
(:class:`CallKind`: device and its compute capability, dtype, the head widths of queries and
values, masking, window, equal lengths, the SDPA toggles, the torch and kernel versions)
against the blocked path on a small random problem of that kind before it is trusted
(:func:`_agrees_with_reference`: the LSE convention, shape and padding of the private ops are
not documented); one that disagrees or raises is logged and skipped from then on. Out of
memory is never swallowed (the runner halves the batch).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from sinkscope.capture.masks import _additive, causal_additive_mask, hidden_keys

log = logging.getLogger(__name__)

#: queries per block in the blocked fallback.
QUERY_BLOCK = 256

CPU_FLASH, FLASH, FLASH_WINDOW, CUDNN, EFFICIENT, BLOCKED = (
    "cpu_flash", "flash", "flash_window", "cudnn", "efficient", "blocked")
KERNELS = (CPU_FLASH, FLASH, FLASH_WINDOW, CUDNN, EFFICIENT, BLOCKED)

#: per private kernel: (aten op name, minimum torch (major, minor), leading argument names the
#: call below relies on, in order). Checked against the installed op's schema before any call.
_PRIVATE_OPS: dict[str, tuple[str, tuple[int, int], tuple[str, ...]]] = {
    CPU_FLASH: ("_scaled_dot_product_flash_attention_for_cpu", (2, 3),
                ("query", "key", "value", "dropout_p", "is_causal", "attn_mask", "scale")),
    FLASH: ("_scaled_dot_product_flash_attention", (2, 2),
            ("query", "key", "value", "dropout_p", "is_causal", "return_debug_mask", "scale")),
    FLASH_WINDOW: ("_flash_attention_forward", (2, 6),
                   ("query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal",
                    "return_debug_mask", "scale", "window_size_left", "window_size_right")),
    CUDNN: ("_scaled_dot_product_cudnn_attention", (2, 5),
            ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal",
             "return_debug_mask", "scale")),
    EFFICIENT: ("_scaled_dot_product_efficient_attention", (2, 2),
                ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal", "scale")),
}
_HALF = (torch.float16, torch.bfloat16)


def _version(text: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()
    return int(major), int(minor)


TORCH_VERSION = _version(torch.__version__)

#: bump when the way a kernel is called or checked changes: a verdict reached under another
#: version of this module is not reused (part of :class:`CallKind`).
KERNEL_VERSION = 2


# ---- what the choice depends on -------------------------------------------------------------
@dataclass(frozen=True)
class DeviceInfo:
    """What the kernel choice needs to know about a device (injectable in tests).

    Attributes:
        type: ``"cpu"``, ``"cuda"`` (also ROCm), ``"mps"``, ...
        capability: CUDA compute capability (major, minor), None elsewhere.
        torch_version: (major, minor) of the running torch.
        enabled: the SDPA backends the user left enabled (``torch.backends.cuda.*_sdp_enabled``):
            a subset of {"flash", "cudnn", "efficient"}; the CPU ignores it.
    """

    type: str
    capability: tuple[int, int] | None = None
    torch_version: tuple[int, int] = TORCH_VERSION
    enabled: frozenset[str] = frozenset({FLASH, CUDNN, EFFICIENT})


@dataclass(frozen=True)
class Problem:
    """What the kernel choice needs to know about one call.

    Attributes:
        dtype: q's dtype.
        head_dim: D, the width of a query (and key) head.
        masked: an explicit additive mask is given.
        window: the causal sliding window W (keys with i - j >= W hidden) when no mask is given.
        same_length: T == S (the fused causal kernels align the causal mask top-left, which is
            the record's bottom-right convention only then).
        value_dim: Dv, the width of a value head (None: D). The flash kernels (CPU and CUDA)
            require Dv == D (multi-head latent attention has Dv < D).
    """

    dtype: torch.dtype
    head_dim: int
    masked: bool
    window: int | None
    same_length: bool
    value_dim: int | None = None

    @property
    def widths_equal(self) -> bool:
        return self.value_dim is None or self.value_dim == self.head_dim


@dataclass(frozen=True)
class CallKind:
    """Everything a kernel's verdict (trusted or not) and the kernel order depend on.

    Two calls of the same kind get the same kernel; a field left out would let two calls share
    a verdict reached on the other (issue 56: two models differing only in the value head width
    did). ``device`` is the device's name (``cuda:0``), ``capability`` its compute capability,
    ``enabled`` the SDPA toggles read at the call, ``torch`` the full torch version and
    ``kernel_version`` :data:`KERNEL_VERSION`.
    """

    device: str
    capability: tuple[int, int] | None
    dtype: str
    head_dim: int
    value_dim: int
    masked: bool
    window: int | None
    same_length: bool
    enabled: frozenset[str]
    torch: str = torch.__version__
    kernel_version: int = KERNEL_VERSION

    def describe(self) -> dict:
        """The fields a run's manifest records (``kernels``)."""
        return dict(device=self.device, dtype=self.dtype, head_dim=self.head_dim, value_dim=self.value_dim,
                    masked=self.masked, window=self.window)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(index))


def device_info(device: torch.device) -> DeviceInfo:
    """The :class:`DeviceInfo` of a real device (capability cached, SDPA toggles read now)."""
    if device.type != "cuda":
        return DeviceInfo(device.type)
    backends = torch.backends.cuda
    toggles = {FLASH: "flash_sdp_enabled", CUDNN: "cudnn_sdp_enabled", EFFICIENT: "mem_efficient_sdp_enabled"}
    enabled = {name for name, toggle in toggles.items() if getattr(backends, toggle, lambda: False)()}
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DeviceInfo("cuda", _capability(index), TORCH_VERSION, frozenset(enabled))


def candidate_kernels(info: DeviceInfo, problem: Problem) -> tuple[str, ...]:
    """The kernels worth trying for ``problem`` on ``info``, fastest first; always ends in blocked.

    Pure: depends only on its arguments (tests inject devices that are not there).
    """
    if info.type == "cpu":  # the CPU flash op refuses Dv != D ("Q/K/V should have the same head size")
        plain = [CPU_FLASH] if (problem.masked or problem.same_length) and problem.widths_equal else []
        return tuple(k for k in plain if info.torch_version >= _PRIVATE_OPS[k][1]) + (BLOCKED,)
    if info.type != "cuda":
        return (BLOCKED,)
    sm = info.capability or (0, 0)
    half = problem.dtype in _HALF
    widths = (problem.head_dim, problem.value_dim or problem.head_dim)
    flash_ok = (half and sm >= (8, 0) and problem.widths_equal and problem.head_dim <= 256
                and problem.head_dim % 8 == 0)
    cudnn_ok = half and sm >= (8, 0) and all(width <= 128 and width % 8 == 0 for width in widths)
    if problem.masked:  # an explicit bias: the flash kernels take none
        order = [EFFICIENT] + ([CUDNN] if cudnn_ok else [])
    elif not problem.same_length:  # bottom-right causal: only the blocked path says so
        order = []
    elif problem.window is not None:  # causal sliding window
        order = ([FLASH_WINDOW] if flash_ok else []) + [EFFICIENT]
    else:  # plain causal
        order = ([FLASH] if flash_ok else []) + ([CUDNN] if cudnn_ok else []) + [EFFICIENT]
    backend = {FLASH: FLASH, FLASH_WINDOW: FLASH, CUDNN: CUDNN, EFFICIENT: EFFICIENT}
    return tuple(k for k in order if backend[k] in info.enabled and info.torch_version >= _PRIVATE_OPS[k][1]) + (
        BLOCKED,)


#: SDPA's backend numbers (``torch.nn.attention.SDPBackend``) -> the kernel of the same backend.
_SDPA_BACKENDS = {1: FLASH, 2: EFFICIENT, 3: CUDNN}


def sdpa_first(order: tuple[str, ...], q: Tensor, k: Tensor, v: Tensor, problem: Problem) -> tuple[str, ...]:
    """``order`` with the kernel of the backend SDPA would choose for this causal problem moved to the front.

    A plain forward runs ``F.scaled_dot_product_attention(..., is_causal=True)``, which takes the
    backend ``torch._fused_sdp_choice`` names; the capture's private op of that backend then costs
    what the plain forward's attention costs. Only unmasked, unwindowed problems of equal length
    on CUDA (the others have no SDPA twin); ``order`` unchanged where torch cannot say.
    """
    if q.device.type != "cuda" or problem.masked or problem.window is not None or not problem.same_length:
        return order
    choose = getattr(torch, "_fused_sdp_choice", None)
    try:
        chosen = _SDPA_BACKENDS.get(int(choose(q, k, v, None, 0.0, True))) if choose is not None else None
    except (RuntimeError, TypeError, ValueError):
        return order
    if chosen not in order:
        return order
    return (chosen,) + tuple(kernel for kernel in order if kernel != chosen)


# ---- the private ops: one function, behind a version and schema check -----------------------
@functools.lru_cache(maxsize=None)
def private_op_available(kernel: str) -> bool:
    """Whether this torch has ``kernel``'s private op with the arguments :func:`_private_attention` passes."""
    if kernel not in _PRIVATE_OPS:
        return False
    name, minimum, expected = _PRIVATE_OPS[kernel]
    if TORCH_VERSION < minimum:
        return False
    try:
        schema = getattr(torch.ops.aten, name).default._schema
    except (AttributeError, RuntimeError):
        return False
    return tuple(argument.name for argument in schema.arguments)[: len(expected)] == expected


def _private_attention(kernel: str, q: Tensor, k: Tensor, v: Tensor, scale: float, bias: Tensor | None,
                       window: int | None) -> tuple[Tensor, Tensor]:
    """Run one private aten attention op; the only caller of any of them.

    Shapes: q (B, H, T, D), k/v (B, H, S, D), bias None or additive, broadcastable to
    (B, H, T, S) and already aligned for the kernel. ``bias`` None means causal (``window``:
    causal sliding window). Returns out (B, H, T, D) and the op's raw LSE, whose layout
    differs per op (:func:`_lse_bht` normalises it).
    """
    if not private_op_available(kernel):
        raise NotImplementedError(f"this torch ({torch.__version__}) has no usable {kernel} op")
    aten = torch.ops.aten
    causal = bias is None
    if kernel == CPU_FLASH:
        if window is not None and bias is None:
            return _cpu_flash_windowed(q, k, v, scale, window)
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, bias is None, attn_mask=bias, scale=scale)
        return out, lse
    if kernel == FLASH:
        out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)[:2]
        return out, lse
    if kernel == FLASH_WINDOW:  # (B, T, H, D) layout; keys j >= i - (W - 1) and j <= i
        out, lse = aten._flash_attention_forward(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, q.shape[-2], k.shape[-2], 0.0, True,
            False, scale=scale, window_size_left=window - 1, window_size_right=0)[:2]
        return out.transpose(1, 2), lse
    if window is not None and bias is None:  # a bias-taking kernel: spell the window out
        bias = causal_additive_mask(q.shape[-2], k.shape[-2], q.dtype, q.device, window)  # (1, 1, T, S)
        bias, causal = _aligned_bias(bias, q), False
    if kernel == CUDNN:
        out, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, bias, True, 0.0, causal, False, scale=scale)[:2]
        return out, lse
    if kernel == EFFICIENT:
        out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, causal, scale=scale)[:2]
        return out, lse
    raise ValueError(f"unknown kernel {kernel!r}")


#: queries per block of the CPU kernel under a sliding window (its bias is this x (this + W), not T x S).
WINDOW_QUERY_BLOCK = 1024


def _cpu_flash_windowed(q: Tensor, k: Tensor, v: Tensor, scale: float, window: int,
                        block: int | None = None) -> tuple[Tensor, Tensor]:
    """The CPU flash kernel under a causal sliding window W, one block of queries at a time.

    A block of queries [a, b) (absolute positions a' = a + S - T on) sees only the keys
    [max(0, a' - W + 1), b'), so each call gets those keys and a (n, K) window bias: the memory
    is linear in T, where one call with the whole window spelt out as a (T, S) bias is not (issue 42).
    Returns out (B, H, T, D) and lse (B, H, T), each row exactly the one-call row.
    """
    T, S = q.shape[-2], k.shape[-2]
    block = block or WINDOW_QUERY_BLOCK
    outs, lses = [], []
    for start in range(0, T, block):
        stop = min(start + block, T)
        first_key = max(0, start + S - T - window + 1)
        last_key = stop + S - T  # exclusive
        rows = torch.arange(start, stop, device=q.device).unsqueeze(-1) + (S - T)  # (n, 1) absolute positions
        cols = torch.arange(first_key, last_key, device=q.device).unsqueeze(0)  # (1, K)
        bias = _additive(~hidden_keys(rows, cols, window), q.dtype)  # (n, K)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q[:, :, start:stop], k[:, :, first_key:last_key], v[:, :, first_key:last_key], 0.0, False,
            attn_mask=bias[None, None], scale=scale)[:2]  # (B, H, n, D), (B, H, n)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def _lse_bht(lse: Tensor, B: int, H: int, T: int) -> Tensor:
    """A kernel's LSE as (B, H, T) float32: cuDNN adds a trailing 1, efficient pads T to 32."""
    if lse.dim() == 4:
        lse = lse[..., 0]  # (B, H, T)
    return lse[:, :, :T].float()  # (B, H, T)


def _aligned_bias(mask: Tensor, q: Tensor) -> Tensor:
    """``mask`` expanded to (B, H, T, S) with its rows 16-element aligned (as SDPA pads it)."""
    B, H, T = q.shape[:3]
    S = mask.shape[-1]
    if S % 16:
        mask = F.pad(mask, (0, 16 - S % 16))[..., :S]  # (B|1, 1, T, S) view of an aligned buffer
    return mask.expand(B, H, T, S)


# ---- the exact fallback -----------------------------------------------------------------------
def blocked_attention_with_lse(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None,
                               block: int = QUERY_BLOCK, *, window: int | None = None) -> tuple[Tensor, Tensor]:
    """Reference-exact attention by query blocks; mask None means causal (sliding if ``window``).

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
            s = s.masked_fill(hidden_keys(rows, torch.arange(S, device=q.device).unsqueeze(0), window), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)  # (B, H, b)
        p = torch.exp(s - lse.unsqueeze(-1))  # (B, H, b, S)
        outs.append(torch.matmul(p, v.float()).to(q.dtype))  # (B, H, b, D)
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


#: the most float32 logits one query block of :func:`attention_with_received` holds (bytes).
RECEIVED_BLOCK_BYTES = 64 * 2 ** 20


def attention_with_received(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None, *,
                            window: int | None = None, sink_rows: Tensor | None = None,
                            block_bytes: int = RECEIVED_BLOCK_BYTES) -> tuple[Tensor, Tensor, Tensor]:
    """Exact attention that also returns the attention each key receives, summed over the queries, in the same pass.

    For every query block the logits s_ij are computed once (float32) and give the output, the row's
    LSE_i and the block's share of the column sums (issue 56, item 1; SPEC.md "Streaming", H2O)::

        received_hj = sum_i a_ij,   a_ij = exp(s_ij - LSE_i) (1 - phi_i),   phi_i = sigmoid(b_h - LSE_i)

    (phi = 0 without a learned sink: ``sink_rows`` (1|B, H, 1|T), the phantom logits, else None), so
    nothing (T, S) is ever held beyond one block of ``block_bytes``, and no second product of the
    queries with the keys runs to find what each key received. Grouped queries are folded onto their
    key head ((B, Hkv, G b, D) against (B, Hkv, D, S)): the keys and values are never repeated per
    query head. The output is over real keys (the caller applies 1 - phi, as for every kernel).

    Shapes: q (B, H, T, D); k (B, Hkv, S, D); v (B, Hkv, S, Dv); mask (B|1, 1|H, T, S) additive, or
    None for causal (sliding with ``window``), as :func:`attention_with_lse`. Returns out
    (B, H, T, Dv) in q's dtype, lse (B, H, T) float32 and received (B, H, S) float32.
    """
    B, H, T, D = q.shape
    Hkv, S, Dv = k.shape[1], k.shape[2], v.shape[-1]
    G = H // Hkv
    keys_t = k.float().transpose(-1, -2)  # (B, Hkv, D, S)
    values = v.float()  # (B, Hkv, S, Dv)
    grouped = q.view(B, Hkv, G, T, D)
    step = max(1, block_bytes // (4 * B * H * S))  # queries per block
    outs, lses = [], []
    received = torch.zeros(B, Hkv, G, S, dtype=torch.float32, device=q.device)
    positions = torch.arange(S, device=q.device).unsqueeze(0)  # (1, S)
    for start in range(0, T, step):
        stop = min(start + step, T)
        b = stop - start
        rows = grouped[:, :, :, start:stop].float().reshape(B, Hkv, G * b, D)  # (B, Hkv, G b, D)
        s = torch.matmul(rows, keys_t).mul_(scale).view(B, Hkv, G, b, S)  # (B, Hkv, G, b, S)
        if mask is not None:
            m = mask[:, :, start:stop].float()  # (B|1, 1|H, b, S)
            s.add_(m.unsqueeze(2) if m.shape[1] == 1 else m.view(m.shape[0], Hkv, G, b, S))
        else:
            queries = torch.arange(start, stop, device=q.device).unsqueeze(-1) + (S - T)  # (b, 1)
            s.masked_fill_(hidden_keys(queries, positions, window), float("-inf"))
        p = torch.softmax(s, dim=-1)  # (B, Hkv, G, b, S): w_ij (one fused pass; logsumexp then exp costs 5x on a CPU)
        lse = s.amax(dim=-1) - p.amax(dim=-1).log()  # (B, Hkv, G, b): LSE_i = max_j s_ij - log max_j w_ij
        del s
        outs.append(torch.matmul(p.view(B, Hkv, G * b, S), values).view(B, Hkv, G, b, Dv))
        lses.append(lse)
        if sink_rows is None:
            received += p.sum(3)
        else:
            b_rows = sink_rows.float().expand(-1, -1, T)[:, :, start:stop]  # (1|B, H, b)
            keep = 1 - torch.sigmoid(b_rows.reshape(b_rows.shape[0], Hkv, G, b) - lse)  # (B, Hkv, G, b): 1 - phi_i
            received += torch.matmul(keep.unsqueeze(-2), p).squeeze(-2)  # (B, Hkv, G, S)
    out = torch.cat(outs, dim=3).view(B, H, T, Dv).to(q.dtype)  # (B, H, T, Dv)
    return out, torch.cat(lses, dim=3).view(B, H, T), received.view(B, H, S)


# ---- choice, trust, and the log ---------------------------------------------------------------
#: (kernel, CallKind) -> why the kernel is not used ("" = trusted)
_verdicts: dict[tuple[str, CallKind], str] = {}
#: the kinds of call seen and the kernel that ran for each, in order of first use
_choices: dict[CallKind, str] = {}
#: the kernels tried for each kind of call, in order (``candidate_kernels`` then ``sdpa_first``).
_orders: dict[CallKind, tuple[str, ...]] = {}
#: how a fused kernel is checked before it is trusted (replaced in tests)
_runner: Callable[..., tuple[Tensor, Tensor]] = _private_attention


def kernel_choices() -> list[dict]:
    """Which kernel ran for each kind of call so far (device, dtype, head widths, masking), in order."""
    return [dict(kind.describe(), kernel=kernel) for kind, kernel in _choices.items()]


def reset_kernel_state() -> None:
    """Forget verdicts and choices (tests; after changing SDPA backend toggles)."""
    _verdicts.clear()
    _choices.clear()
    _orders.clear()


def _agrees_with_reference(kernel: str, device: torch.device, dtype: torch.dtype, head_dim: int, masked: bool,
                           windowed: bool, value_dim: int | None = None) -> str:
    """Run ``kernel`` once on a small random problem like the real one (the same device, dtype,
    query and value head widths, masking); "" if it matches the blocked path (output and LSE),
    else why not. One host sync, once per kind of call."""
    g = torch.Generator().manual_seed(0)
    B, H, T, W = 2, 2, 80, 8
    value_dim = value_dim or head_dim
    q, k = (torch.randn(B, H, T, head_dim, generator=g).to(device, dtype) for _ in range(2))  # (B, H, T, D)
    v = torch.randn(B, H, T, value_dim, generator=g).to(device, dtype)  # (B, H, T, Dv)
    scale = head_dim ** -0.5
    mask = None
    if masked:  # a sliding window plus a padded first key in window 1: what real masks hold
        bias = causal_additive_mask(T, T, dtype, device, W).expand(B, 1, T, T).clone()  # (B, 1, T, T)
        bias[1, :, 1:, 0] = torch.finfo(dtype).min
        mask = bias
    window = W if windowed and not masked else None
    try:
        out, lse = _run_fused(kernel, q, k, v, scale, mask, window)
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as error:
        return f"raised {type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
    ref_out, ref_lse = blocked_attention_with_lse(q, k, v, scale, mask, window=window)
    if tuple(lse.shape) != (B, H, T) or tuple(out.shape) != (B, H, T, value_dim):
        return f"returned shapes {tuple(out.shape)} / {tuple(lse.shape)}"
    out_tol, lse_tol = (3e-2, 2e-3) if dtype in _HALF else (1e-4, 1e-4)
    out_err = (out.float() - ref_out.float()).abs().max().item()
    lse_err = (lse - ref_lse).abs().max().item()
    if not (out_err <= out_tol and lse_err <= lse_tol):  # also False for NaN
        return f"disagrees with the exact path (max |d out| {out_err:.2e}, max |d lse| {lse_err:.2e})"
    return ""


def _run_fused(kernel: str, q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None,
               window: int | None) -> tuple[Tensor, Tensor]:
    """A fused kernel end to end: bias alignment, the op, the LSE as (B, H, T) float32."""
    bias = mask
    if bias is not None and kernel in (EFFICIENT, CUDNN):
        bias = _aligned_bias(bias, q)
    out, lse = _runner(kernel, q, k, v, scale, bias, window)
    B, H, T = q.shape[:3]
    return out, _lse_bht(lse, B, H, T)


def _trusted(kernel: str, kind: CallKind, q: Tensor) -> bool:
    """Whether ``kernel`` may run for this kind of call (checked once per kind)."""
    key = (kernel, kind)
    verdict = _verdicts.get(key)
    if verdict is None:  # the CPU kernel is covered by the test suite; the others are checked here
        verdict = "" if kernel == CPU_FLASH else _agrees_with_reference(
            kernel, q.device, q.dtype, kind.head_dim, kind.masked, kind.window is not None, kind.value_dim)
        _verdicts[key] = verdict
        if verdict:
            log.warning("sinkscope: attention kernel %r not used on %s (%s, %s, %s): %s", kernel, q.device,
                        kind.dtype, _widths(kind), _masking(kind.masked, kind.window is not None), verdict)
    return verdict == ""


def _widths(kind: CallKind) -> str:
    if kind.value_dim == kind.head_dim:
        return f"head dim {kind.head_dim}"
    return f"head dim {kind.head_dim}, value head dim {kind.value_dim}"


def call_kind(q: Tensor, v: Tensor, masked: bool, window: int | None, same_length: bool) -> CallKind:
    """The :class:`CallKind` of one call (SDPA toggles and capability read now, cached per device)."""
    info = device_info(q.device)
    return CallKind(str(q.device), info.capability, str(q.dtype).removeprefix("torch."), q.shape[-1], v.shape[-1],
                    masked, window, same_length, info.enabled if info.type == "cuda" else frozenset())


def _masking(masked: bool, windowed: bool) -> str:
    return "explicit mask" if masked else ("causal sliding window" if windowed else "causal")


def attention_with_lse(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None, *,
                       window: int | None = None,
                       kernels: Sequence[str] | None = None) -> tuple[Tensor, Tensor]:
    """Fused attention returning (out (B, H, T, D), lse (B, H, T) float32); mask None = causal.

    Args:
        q: (B, H, T, D) queries.
        k, v: (B, H or Hkv, S, D); with Hkv < H heads each is used by H / Hkv query heads.
        scale: the factor multiplying q . k.
        mask: additive float mask broadcastable to (B, H, T, S) in q's dtype (it must hold the
            causal part too), or None for causal: key j visible to query i iff j <= i + S - T.
        window: with ``mask`` None, a causal sliding window W: also hide keys j <= i + S - T - W
            (transformers' ``sliding_window``). Ignored when a mask is given.
        kernels: try only these (in this order; "blocked" is always last); default
            :func:`candidate_kernels` for q's device.

    The first kernel that runs and is trusted is used; see the module docstring.
    """
    if k.shape[1] != q.shape[1]:
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)  # (B, H, S, D)
        v = v.repeat_interleave(groups, dim=1)  # (B, H, S, D)
    masked = mask is not None
    window = None if masked else window
    T, S = q.shape[-2], k.shape[-2]
    problem = Problem(q.dtype, q.shape[-1], masked, window, T == S, v.shape[-1])
    kind = call_kind(q, v, masked, window, T == S)
    if kernels is not None:
        order = tuple(kernels)
    else:  # SDPA's own choice asked once per kind of call (a host-side decision, no sync)
        if kind not in _orders:
            _orders[kind] = sdpa_first(candidate_kernels(device_info(q.device), problem), q, k, v, problem)
        order = _orders[kind]
    for kernel in order:
        if kernel == BLOCKED:
            break
        key = (kernel, kind)
        if not _trusted(kernel, kind, q):
            continue
        try:
            out, lse = _run_fused(kernel, q, k, v, scale, mask, window)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, NotImplementedError, TypeError) as error:  # unsupported here: next, stay exact
            _verdicts[key] = f"raised {type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}"
            log.warning("sinkscope: attention kernel %r failed on %s; falling back: %s", kernel, q.device,
                        _verdicts[key])
            continue
        _note(kind, kernel)
        return out, lse
    _note(kind, BLOCKED)
    return blocked_attention_with_lse(q, k, v, scale, mask, window=window)


def _note(kind: CallKind, kernel: str) -> None:
    """Log the kernel the first time a kind of call runs (and when it changes)."""
    if _choices.get(kind) != kernel:
        _choices[kind] = kernel
        log.info("sinkscope: attention kernel %r on %s (%s, %s, %s)", kernel, kind.device, kind.dtype, _widths(kind),
                 _masking(kind.masked, kind.window is not None))
