"""What ``mlp_pca`` plans to hold (``probes/pca_memory.py``), and that it never holds more (issue 56, item 3).

The peaks are the module docstring's formulas; the probe's real holdings are counted tensor by tensor
(every accumulator, the sketch's rows, the scatter sample) after activations of a 70B model's MLP
width (F = 28,672) went through it on the meta device, where nothing is allocated.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.probes.mlp_pca import MlpPcaUp
from sinkscope.probes.pca_memory import (CHUNK_ROWS, common_bytes, exact_bytes, per_window_bytes, plan_covariance,
                                         sketch_bytes)
from probe_helpers import assert_one_sentence, make_spec

F_70B = 28_672


def test_the_peaks_are_the_documented_formulas():
    assert exact_bytes(F_70B, 1) == 5 * F_70B ** 2 * 8  # max(2, 5): the fit's covariance, vectors and workspace
    assert exact_bytes(F_70B, 2) == 6 * F_70B ** 2 * 8
    assert exact_bytes(100, 8) == 16 * 100 ** 2 * 8  # many passes: the rollback copy dominates
    assert sketch_bytes(F_70B, 1, 256) == (4 * 256 + 3 * (4 * 256 + 1)) * F_70B * 8
    assert common_bytes(10, 2, 64, 32) == 6 * 2 * 10 * 8 + 3 * CHUNK_ROWS * 10 * 8 + 2 * 64 * 32 * 10 * 4
    assert per_window_bytes(10, 2) == 80


def test_auto_takes_the_exact_way_when_it_fits_the_budget_else_the_sketch():
    kw = dict(rank=256, scatter_windows=64, scatter_positions=32)
    small = plan_covariance("mlp_pca", 0, 1536, 1, memory_gb=1.0, **kw)
    assert small.method == "exact" and small.peak <= small.budget == 10 ** 9
    big = plan_covariance("mlp_pca", 0, F_70B, 2, memory_gb=8.0, **kw)
    assert big.method == "sketch" and big.peak <= big.budget and big.exact_peak > big.budget
    statement = big.statement()
    assert statement.startswith("mlp_pca: layer 0's MLP is 28,672 wide, the exact covariance would need")
    assert "a streaming sketch of rank 256 holds" in statement and "budget 8.00 GB: memory_gb" in statement
    # without memory_gb: half the free memory (given here)
    half = plan_covariance("mlp_pca", 0, F_70B, 1, free=80 * 10 ** 9, **kw)
    assert half.budget == 40 * 10 ** 9 and half.method == "exact" and "half the 80.00 GB free on cpu" in half.statement()
    forced = plan_covariance("mlp_pca", 0, 1536, 1, choice="sketch", memory_gb=1.0, **kw)
    assert forced.method == "sketch"


def test_a_plan_that_cannot_fit_is_one_sentence():
    kw = dict(rank=256, scatter_windows=64, scatter_positions=32)
    with pytest.raises(SinkscopeError) as error:
        plan_covariance("mlp_pca_up", 0, F_70B, 2, memory_gb=0.5, **kw)
    assert_one_sentence(error)
    assert "even a sketch of rank 256 of its 28,672-wide MLP needs" in str(error.value)
    with pytest.raises(SinkscopeError, match="the exact covariance of its 28,672-wide MLP needs .* take covariance=auto"):
        plan_covariance("mlp_pca_up", 0, F_70B, 1, choice="exact", memory_gb=8.0, **kw)
    with pytest.raises(SinkscopeError, match="covariance takes auto, exact, sketch, not 'fast'"):
        plan_covariance("mlp_pca_up", 0, 10, 1, choice="fast", memory_gb=8.0, **kw)


def _held_bytes(probe: MlpPcaUp) -> int:
    """Every tensor the probe holds: its accumulators, the sketches' rows, the scatter sample."""
    total = sum(t.numel() * t.element_size() for t in (probe.sum_all, probe.sum_0, probe.sq_diag, probe.sq_all))
    total += sum(fd.rows.numel() * fd.rows.element_size() for parts in probe.sketch.parts.values()
                 for fd in parts.values())
    total += sum(t.numel() * t.element_size() for parts in probe.sample.parts.values() for p in parts for t in p)
    return total


def test_a_70b_width_never_holds_more_than_its_stated_budget_on_the_meta_device():
    """Issue 56's check: F = 28,672 (Llama-3-70B's MLP) with a subtracted-heads second pass, budget 4 GB: the plan is
    the sketch, stated before the first window, and after 8 windows of 4,096 tokens per pass what the probe holds
    (counted tensor by tensor) stays under the plan's peak plus its per-window rows, under the budget."""
    said = []
    spec = replace(make_spec(n_heads=8), mlp_width=F_70B)
    probe = MlpPcaUp(spec, layer=0, heads=("0.1",), memory_gb=4.0)
    probe.prepare(torch.device("meta"), said.append)
    plan = probe.plan
    assert plan.method == "sketch" and plan.passes == 2 and len(said) == 1
    windows = 0
    for label in (None, "subtracted") * 4:
        probe.pass_label = label
        probe.pre(0, torch.empty(1, 4096, F_70B, device="meta"))  # (B, T, F): no memory behind it
        windows += label is None
        assert _held_bytes(probe) <= plan.peak + windows * plan.per_window <= plan.budget
    assert probe.sq_all.numel() == 0
    assert all(fd.rows.shape[0] < 2 * plan.rank for parts in probe.sketch.parts.values() for fd in parts.values())


def test_the_model_spec_gives_the_mlp_width():
    """``ModelSpec.mlp_width``: the first layer's pre-activation projection's output features (nn.Linear's
    out_features, GPT-2's Conv1D nf), the trainer's 4 C; what mlp_pca plans from before the first window."""
    from sinkscope.capture.families import ModelSpec
    from tiny_models import build

    assert ModelSpec.from_model(build("llama")).mlp_width == 128
    gpt2 = build("gpt2")
    assert ModelSpec.from_model(gpt2).mlp_width == gpt2.transformer.h[0].mlp.c_fc.nf
    assert ModelSpec.from_model(build("gpt_oss")).mlp_width is None  # experts: no single pre-activation
    from sinkscope.runtime.memory import free_memory

    assert free_memory(torch.device("meta")) is None  # the meta device: no budget, no refusal
