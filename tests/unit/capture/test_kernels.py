"""Kernel choice, fallbacks and the one-time log of capture/kernels.py, on CPU.

The CUDA kernels cannot run here; what can is tested: the choice for injected devices, the
version/schema gate of the private ops, the self-check that rejects a kernel with a wrong LSE,
the fallback order when a kernel raises, the log-once behaviour, out-of-memory propagation,
and that the CPU path returns exactly what the CPU flash kernel returns (as before).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from sinkscope.capture import kernels as K
from sinkscope.capture.kernels import (BLOCKED, CPU_FLASH, CUDNN, EFFICIENT, FLASH, FLASH_WINDOW, DeviceInfo, Problem,
                                       attention_with_lse, blocked_attention_with_lse, candidate_kernels)
from sinkscope.capture.masks import causal_additive_mask
from sync_guard import no_host_sync


@pytest.fixture(autouse=True)
def fresh_state():
    K.reset_kernel_state()
    yield
    K.reset_kernel_state()


def qkv(B=2, H=4, T=40, D=16, Hkv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv or H, T, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv or H, T, D, generator=g).to(dtype)
    return q, k, v


def numpy_attention(q, k, v, scale, visible):
    """float64 reference: softmax over visible keys; visible (B|1, 1, T, S) bool."""
    q, k, v = (t.double().numpy() for t in (q, k, v))
    s = np.einsum("bhtd,bhsd->bhts", q, k) * scale
    s = np.where(visible, s, -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    return np.einsum("bhts,bhsd->bhtd", np.exp(s - lse[..., None]), v), lse


def causal_visible(T, S, window=None):
    i = np.arange(T)[:, None] + (S - T)
    j = np.arange(S)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    return visible[None, None]


# ---- the choice ----------------------------------------------------------------------------
H200 = DeviceInfo("cuda", (9, 0), (2, 11))
BF16_CAUSAL = Problem(torch.bfloat16, 64, masked=False, window=None, same_length=True)


@pytest.mark.parametrize("info, problem, expected", [
    (DeviceInfo("cpu"), BF16_CAUSAL, (CPU_FLASH, BLOCKED)),
    (DeviceInfo("cpu", torch_version=(2, 2)), BF16_CAUSAL, (BLOCKED,)),
    (DeviceInfo("cpu"), Problem(torch.float32, 64, False, None, same_length=False), (BLOCKED,)),
    (DeviceInfo("cpu"), Problem(torch.float32, 64, True, None, same_length=False), (CPU_FLASH, BLOCKED)),
    (H200, BF16_CAUSAL, (FLASH, CUDNN, EFFICIENT, BLOCKED)),
    (H200, Problem(torch.bfloat16, 64, masked=True, window=None, same_length=True), (EFFICIENT, CUDNN, BLOCKED)),
    (H200, Problem(torch.bfloat16, 64, masked=False, window=128, same_length=True), (FLASH_WINDOW, EFFICIENT, BLOCKED)),
    (H200, Problem(torch.float32, 64, False, None, True), (EFFICIENT, BLOCKED)),  # flash/cuDNN: half only
    (H200, Problem(torch.float16, 256, False, None, True), (FLASH, EFFICIENT, BLOCKED)),  # cuDNN: D <= 128
    (H200, Problem(torch.bfloat16, 72 + 4, False, None, True), (EFFICIENT, BLOCKED)),  # D % 8
    (H200, Problem(torch.bfloat16, 64, False, None, same_length=False), (BLOCKED,)),  # bottom-right causal
    (DeviceInfo("cuda", (7, 5), (2, 11)), BF16_CAUSAL, (EFFICIENT, BLOCKED)),  # T4: no flash
    (DeviceInfo("cuda", (9, 0), (2, 4)), BF16_CAUSAL, (FLASH, EFFICIENT, BLOCKED)),  # cuDNN op needs torch 2.5
    (DeviceInfo("cuda", (9, 0), (2, 4)), Problem(torch.bfloat16, 64, False, 128, True), (EFFICIENT, BLOCKED)),
    (DeviceInfo("cuda", (9, 0), (2, 11), frozenset({CUDNN, EFFICIENT})), BF16_CAUSAL, (CUDNN, EFFICIENT, BLOCKED)),
    (DeviceInfo("mps"), BF16_CAUSAL, (BLOCKED,)),
    # value heads narrower than query heads (multi-head latent attention): the flash ops refuse them
    (DeviceInfo("cpu"), Problem(torch.float32, 64, False, None, True, value_dim=32), (BLOCKED,)),
    (H200, Problem(torch.bfloat16, 64, False, None, True, value_dim=32), (CUDNN, EFFICIENT, BLOCKED)),
    (H200, Problem(torch.bfloat16, 192, False, None, True, value_dim=128), (EFFICIENT, BLOCKED)),
])
def test_candidate_kernels(info, problem, expected):
    assert candidate_kernels(info, problem) == expected


def test_this_torch_has_every_private_op_with_the_expected_arguments(monkeypatch):
    for kernel in (CPU_FLASH, FLASH, FLASH_WINDOW, CUDNN, EFFICIENT):
        assert K.private_op_available(kernel), kernel
    assert not K.private_op_available(BLOCKED)
    K.private_op_available.cache_clear()
    name, minimum, arguments = K._PRIVATE_OPS[FLASH]
    monkeypatch.setitem(K._PRIVATE_OPS, FLASH, (name, minimum, arguments[:4] + ("causal",) + arguments[5:]))
    assert not K.private_op_available(FLASH)  # a renamed argument: not called
    monkeypatch.setitem(K._PRIVATE_OPS, FLASH, (name, (99, 0), arguments))
    K.private_op_available.cache_clear()
    assert not K.private_op_available(FLASH)  # too old a torch
    monkeypatch.setitem(K._PRIVATE_OPS, FLASH, ("_no_such_op", (2, 0), arguments))
    K.private_op_available.cache_clear()
    assert not K.private_op_available(FLASH)
    monkeypatch.undo()
    K.private_op_available.cache_clear()
    with pytest.raises(NotImplementedError):
        monkeypatch.setattr(K, "private_op_available", lambda kernel: False)
        K._private_attention(FLASH, *qkv(), 0.25, None, None)


# ---- CPU: same numbers as before, exact against numpy ---------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_path_is_the_cpu_flash_kernel_unchanged(dtype):
    q, k, v = qkv(dtype=dtype)
    scale = 0.3
    out, lse = attention_with_lse(q, k, v, scale, None)
    ref_out, ref_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse.float()) and lse.dtype == torch.float32
    mask = torch.zeros(2, 1, 40, 40, dtype=dtype).masked_fill(~torch.ones(40, 40).tril().bool(), torch.finfo(dtype).min)
    mask[1, :, 5:, :3] = torch.finfo(dtype).min  # padding-like
    out, lse = attention_with_lse(q, k, v, scale, mask)
    ref_out, ref_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                                   scale=scale)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse.float())
    assert [c["kernel"] for c in K.kernel_choices()] == [CPU_FLASH, CPU_FLASH]


@pytest.mark.parametrize("window", [None, 1, 7, 100])
@pytest.mark.parametrize("kernel", [CPU_FLASH, BLOCKED])
def test_causal_and_sliding_window_match_numpy(kernel, window):
    q, k, v = qkv(T=33, Hkv=2)  # GQA: 4 query heads on 2 KV heads
    scale = 0.25
    out, lse = attention_with_lse(q, k, v, scale, None, window=window, kernels=[kernel])
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    ref_out, ref_lse = numpy_attention(q, kr, vr, scale, causal_visible(33, 33, window))
    np.testing.assert_allclose(out.numpy(), ref_out, atol=2e-6)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-6)
    assert K.kernel_choices()[-1]["kernel"] == kernel


def test_blocked_path_bottom_right_causal_for_fewer_queries():
    q, k, v = qkv(T=40)
    q = q[:, :, -9:]  # T=9 queries against S=40 keys: query i sees keys j <= i + 31
    out, lse = attention_with_lse(q, k, v, 0.25, None)  # the CPU kernel is top-left: not a candidate
    ref_out, ref_lse = numpy_attention(q, k, v, 0.25, causal_visible(9, 40))
    np.testing.assert_allclose(out.numpy(), ref_out, atol=2e-6)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-6)
    assert K.kernel_choices()[-1]["kernel"] == BLOCKED


def test_no_host_sync_on_the_cpu_path():
    q, k, v = qkv()
    attention_with_lse(q, k, v, 0.25, None)  # first call may log
    with no_host_sync():
        attention_with_lse(q, k, v, 0.25, None)
        attention_with_lse(q, k, v, 0.25, None, window=5)


# ---- accelerator logic with a fake CUDA device ----------------------------------------------
class FakeKernels:
    """Stands in for the CUDA ops on CPU tensors: flash raises, cuDNN returns its LSE in log2
    (a wrong convention), efficient is right (computed by the CPU kernel), flash_window is right."""

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, kernel, q, k, v, scale, bias, window):
        self.calls.append(kernel)
        if kernel == FLASH:
            raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")
        if kernel == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory")
        if window is not None and bias is None:
            bias = causal_additive_mask(q.shape[-2], k.shape[-2], q.dtype, q.device, window)
        out, lse = K._private_attention(CPU_FLASH, q, k, v, scale, None if bias is None else bias.contiguous(), None)
        if kernel == CUDNN:
            return out, (lse / math.log(2)).unsqueeze(-1)  # (B, H, T, 1) in log2: must be rejected
        if kernel == EFFICIENT:
            T = lse.shape[-1]
            padded = torch.full((*lse.shape[:2], -(-T // 32) * 32), float("nan"))  # (B, H, T up to 32k) like the op
            padded[..., : lse.shape[-1]] = lse
            return out, padded
        return out, lse


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeKernels()
    monkeypatch.setattr(K, "_runner", fake)
    monkeypatch.setattr(K, "device_info", lambda device: DeviceInfo("cuda", (9, 0), (2, 11)))
    return fake


def test_fallback_order_self_check_and_log_once(fake_cuda, caplog):
    q, k, v = qkv(dtype=torch.bfloat16, D=16)
    caplog.set_level(logging.INFO, logger="sinkscope.capture.kernels")
    out, lse = attention_with_lse(q, k, v, 0.25, None)
    ref_out, ref_lse = blocked_attention_with_lse(q, k, v, 0.25, None)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=0)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=3e-2, rtol=0)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3, messages
    assert "'flash' not used" in messages[0] and "Ampere" in messages[0]  # raised during its self-check
    assert "'cudnn' not used" in messages[1] and "disagrees" in messages[1]  # wrong LSE convention caught
    assert "attention kernel 'efficient'" in messages[2] and caplog.records[2].levelno == logging.INFO
    assert K.kernel_choices() == [dict(device="cpu", dtype="bfloat16", head_dim=16, value_dim=16, masked=False,
                                       window=None, kernel=EFFICIENT)]
    calls = len(fake_cuda.calls)
    caplog.clear()
    for _ in range(3):  # later layers: no new log, no retry of the rejected kernels, no new check
        attention_with_lse(q, k, v, 0.25, None)
    assert caplog.records == []
    assert fake_cuda.calls[calls:] == [EFFICIENT] * 3


def test_masked_and_windowed_calls_use_the_right_kernels(fake_cuda):
    q, k, v = qkv(dtype=torch.bfloat16, D=16, T=37)  # S not a multiple of 16: the bias is padded
    mask = causal_additive_mask(37, 37, torch.bfloat16, torch.device("cpu"), 5)
    out, lse = attention_with_lse(q, k, v, 0.25, mask)
    assert K.kernel_choices()[-1]["kernel"] == EFFICIENT  # flash takes no mask
    ref_out, ref_lse = numpy_attention(q, k, v, 0.25, causal_visible(37, 37, 5))
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=1e-3)
    out_w, lse_w = attention_with_lse(q, k, v, 0.25, None, window=5)
    assert K.kernel_choices()[-1]["kernel"] == FLASH_WINDOW
    np.testing.assert_allclose(lse_w.numpy(), ref_lse, atol=1e-3)
    np.testing.assert_allclose(out_w.float().numpy(), ref_out, atol=3e-2)


def test_a_kernel_failing_on_the_real_call_falls_back_once(fake_cuda, monkeypatch, caplog):
    q, k, v = qkv(dtype=torch.bfloat16, D=16)
    attention_with_lse(q, k, v, 0.25, None)  # efficient trusted
    seen = []

    def flaky(kernel, *args):
        seen.append(kernel)
        if kernel == EFFICIENT:
            raise RuntimeError("attn_bias is not correctly aligned")
        return fake_cuda(kernel, *args)

    monkeypatch.setattr(K, "_runner", flaky)
    caplog.set_level(logging.INFO, logger="sinkscope.capture.kernels")
    out, lse = attention_with_lse(q, k, v, 0.25, None)
    ref_out, ref_lse = blocked_attention_with_lse(q, k, v, 0.25, None)
    assert torch.equal(lse, ref_lse) and torch.equal(out, ref_out)  # the blocked path, exact
    assert K.kernel_choices()[-1]["kernel"] == BLOCKED
    assert any("failed" in r.getMessage() and "aligned" in r.getMessage() for r in caplog.records)
    attention_with_lse(q, k, v, 0.25, None)
    assert seen == [EFFICIENT]  # not retried


def test_out_of_memory_is_raised_not_swallowed(fake_cuda):
    q, k, v = qkv(dtype=torch.bfloat16, D=16)
    with pytest.raises(torch.OutOfMemoryError):
        attention_with_lse(q, k, v, 0.25, None, kernels=["oom", BLOCKED])


def test_self_check_accepts_a_correct_kernel_for_every_kind_of_call(monkeypatch):
    """The checker itself: the real CPU kernel, standing in for a fused one, passes each variant."""
    monkeypatch.setattr(K, "_runner", lambda kernel, *args: K._private_attention(CPU_FLASH, *args))
    for dtype in (torch.float32, torch.bfloat16):
        for masked, windowed in ((False, False), (True, False), (False, True)):
            assert K._agrees_with_reference(EFFICIENT, torch.device("cpu"), dtype, 64, masked, windowed) == ""


def test_lse_layouts_and_bias_alignment():
    lse = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 3, 5)
    assert torch.equal(K._lse_bht(lse.unsqueeze(-1), 2, 3, 5), lse)  # cuDNN: (B, H, T, 1)
    padded = torch.cat([lse, torch.full((2, 3, 27), float("nan"))], dim=-1)  # efficient: T padded to 32
    assert torch.equal(K._lse_bht(padded, 2, 3, 5), lse)
    q = torch.zeros(2, 4, 5, 8)
    mask = torch.randn(1, 1, 5, 37)
    bias = K._aligned_bias(mask, q)
    assert bias.shape == (2, 4, 5, 37) and bias.stride(-2) % 16 == 0
    assert torch.equal(bias[1, 3], mask[0, 0])


def test_cuda_ops_accept_our_arguments_and_return_the_lse_layouts_we_normalise():
    """torch's own fake (meta) implementations of the CUDA ops, on fake CUDA tensors: the call
    in _private_attention matches each op's signature and the LSE comes back as _lse_bht expects."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    B, H, T, D = 2, 4, 100, 64
    expected_lse = {FLASH: (B, H, T), FLASH_WINDOW: (B, H, T), CUDNN: (B, H, T, 1), EFFICIENT: (B, H, 128)}
    seen = {}
    try:
        with FakeTensorMode():
            q = torch.empty(B, H, T, D, device="cuda", dtype=torch.bfloat16)
            bias = torch.empty(B, H, T, T, device="cuda", dtype=torch.bfloat16)
            for kernel in expected_lse:
                for b in (None,) if kernel in (FLASH, FLASH_WINDOW) else (None, bias):
                    out, lse = K._private_attention(kernel, q, q, q, 0.125, b, 16 if kernel == FLASH_WINDOW else None)
                    seen[(kernel, b is None)] = (tuple(out.shape), out.dtype, tuple(lse.shape), lse.dtype)
    except RuntimeError as error:  # a torch whose fake tensors cannot pretend to be on CUDA
        pytest.skip(f"fake CUDA tensors unavailable: {error}")
    for (kernel, _), (out_shape, out_dtype, lse_shape, lse_dtype) in seen.items():
        assert out_shape == (B, H, T, D) and out_dtype == torch.bfloat16, kernel
        assert lse_shape == expected_lse[kernel] and lse_dtype == torch.float32, kernel
        assert K._lse_bht(torch.empty(lse_shape, device="meta"), B, H, T).shape == (B, H, T)
    assert len(seen) == 6


@pytest.mark.parametrize("T, S, window, block", [(33, 33, 7, 8), (40, 40, 1, 16), (20, 50, 9, 6), (64, 64, 100, 16)])
def test_cpu_flash_by_query_blocks_under_a_window_matches_numpy(T, S, window, block):
    """The windowed CPU kernel in query blocks (linear memory, issue 42) gives every row of the one-call answer."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, T, 16, generator=g)
    k, v = torch.randn(2, 4, S, 16, generator=g), torch.randn(2, 4, S, 16, generator=g)
    out, lse = K._cpu_flash_windowed(q, k, v, 0.25, window, block=block)
    ref_out, ref_lse = numpy_attention(q, k, v, 0.25, causal_visible(T, S, window))
    np.testing.assert_allclose(out.numpy(), ref_out, atol=2e-6)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-6)


class _Recorded:
    """``torch._fused_sdp_choice`` stand-in: answers ``backend`` and records that it was asked."""

    def __init__(self, backend):
        self.backend, self.calls = backend, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.backend


@pytest.mark.parametrize("backend, first", [(3, CUDNN), (1, FLASH), (2, EFFICIENT), (0, FLASH)])
def test_sdpas_own_backend_goes_first_on_cuda(monkeypatch, backend, first):
    """On an H200 SDPA runs cuDNN, 1.5x faster than flash at 32k tokens: the capture asks SDPA and follows it."""
    choose = _Recorded(backend)
    monkeypatch.setattr(torch, "_fused_sdp_choice", choose)
    order = (FLASH, CUDNN, EFFICIENT, BLOCKED)
    cuda = torch.empty(1, 1, 4, 8, device="meta")
    cuda.device.__class__  # a meta tensor stands in; the device type is read from q.device below
    q = type("Q", (), {"device": torch.device("cuda", 0)})()
    assert K.sdpa_first(order, q, q, q, Problem(torch.bfloat16, 64, False, None, True))[0] == first
    assert choose.calls == 1
    for problem in (Problem(torch.bfloat16, 64, True, None, True), Problem(torch.bfloat16, 64, False, 8, True),
                    Problem(torch.bfloat16, 64, False, None, False)):  # no SDPA twin: the order stays
        assert K.sdpa_first(order, q, q, q, problem) == order
    cpu = type("Q", (), {"device": torch.device("cpu")})()
    assert K.sdpa_first(order, cpu, cpu, cpu, Problem(torch.float32, 64, False, None, True)) == order
    assert choose.calls == 1


# ---- the verdict's key: everything that changes the verdict (issue 56, item 4) ----------------
class WrongWhenWidthsDiffer(FakeKernels):
    """A fused kernel that is right when Dv == D and silently wrong (values scaled) when Dv != D."""

    def __call__(self, kernel, q, k, v, scale, bias, window):
        self.calls.append(kernel)
        if window is not None and bias is None:
            bias = causal_additive_mask(q.shape[-2], k.shape[-2], q.dtype, q.device, window)
        out, lse = K.blocked_attention_with_lse(q, k, v, scale, bias)
        return (out if v.shape[-1] == q.shape[-1] else 2 * out), lse


def narrow_values(q, k, v, width):
    return q, k, v[..., :width].contiguous()


@pytest.mark.parametrize("first_width", [16, 8])
def test_calls_differing_only_in_value_width_get_their_own_verdicts(monkeypatch, first_width):
    """A verdict reached with Dv == D is not reused for Dv != D (nor the reverse): each width is
    checked against the exact path with its own value width, and the wrong one is caught."""
    fake = WrongWhenWidthsDiffer()
    monkeypatch.setattr(K, "_runner", fake)
    monkeypatch.setattr(K, "device_info", lambda device: DeviceInfo("cuda", (9, 0), (2, 11), frozenset({EFFICIENT})))
    q, k, v = qkv(dtype=torch.float32, D=16)
    for width in (first_width, 24 - first_width):
        out, lse = attention_with_lse(q, k, v[..., :width], 0.25, None)
        ref_out, ref_lse = blocked_attention_with_lse(q, k, v[..., :width], 0.25, None)
        torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=0)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=0)
    kernels = {c["value_dim"]: c["kernel"] for c in K.kernel_choices()}
    assert kernels == {16: EFFICIENT, 8: BLOCKED}
    assert len(K._verdicts) == 2


def test_the_verdict_key_holds_torch_kernel_version_toggles_and_capability(monkeypatch):
    q, k, v = qkv(D=16)
    base = K.call_kind(q, v, False, None, True)
    assert base.torch == torch.__version__ and base.kernel_version == K.KERNEL_VERSION
    assert (base.head_dim, base.value_dim, base.same_length) == (16, 16, True)
    assert K.call_kind(q, v[..., :8], False, None, True) != base
    assert K.call_kind(q, v, False, None, False) != base
    monkeypatch.setattr(K, "device_info", lambda device: DeviceInfo("cuda", (9, 0), (2, 11), frozenset({FLASH})))
    h200_flash = K.call_kind(q, v, False, None, True)
    monkeypatch.setattr(K, "device_info", lambda device: DeviceInfo("cuda", (9, 0), (2, 11), frozenset({CUDNN})))
    h200_cudnn = K.call_kind(q, v, False, None, True)
    monkeypatch.setattr(K, "device_info", lambda device: DeviceInfo("cuda", (8, 0), (2, 11), frozenset({CUDNN})))
    a100_cudnn = K.call_kind(q, v, False, None, True)
    assert len({base, h200_flash, h200_cudnn, a100_cudnn}) == 4


def test_equal_then_unequal_lengths_on_cpu_stay_exact():
    """The kernel order once cached for T == S is not reused for T < S (bottom-right causal):
    the CPU flash kernel aligns its causal mask top-left, which is right only when T == S."""
    q, k, v = qkv(T=24)
    attention_with_lse(q, k, v, 0.25, None)  # T == S: the CPU kernel
    q_tail = q[:, :, -8:]  # (B, H, 8, D): the last 8 queries over all 24 keys
    out, lse = attention_with_lse(q_tail, k, v, 0.25, None)
    ref_out, ref_lse = numpy_attention(q_tail, k, v, 0.25, causal_visible(8, 24))
    np.testing.assert_allclose(out.numpy(), ref_out, atol=2e-6)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=2e-6)
    assert [c["kernel"] for c in K.kernel_choices()] == [CPU_FLASH, BLOCKED]


def test_the_self_check_runs_with_the_real_value_width(monkeypatch):
    widths = []

    def runner(kernel, q, k, v, scale, bias, window):
        widths.append((q.shape[-1], v.shape[-1]))
        return K.blocked_attention_with_lse(q, k, v, scale, bias, window=window)

    monkeypatch.setattr(K, "_runner", runner)
    assert K._agrees_with_reference(EFFICIENT, torch.device("cpu"), torch.float32, 64, False, False, 32) == ""
    assert widths == [(64, 32)]
