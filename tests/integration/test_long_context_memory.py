"""No (T, T) tensor on the measuring path (issue 42, item 2; docs/costs.md "Memory at long context").

A dispatch-mode watcher sees every tensor an aten op returns during ``run_probes`` and flags
those with two dimensions of at least the window length T: an attention pattern, its scores or
its mask. On the fused capture (the default) no probe may allocate one: records come from the
kernel's log-sum-exp, the residual-only probes run on the same fused kernel instead of eager
attention, and ``heads --sink-set data`` walks the queries in blocks. ``--attention explicit``
does materialise the model's weights, which shows the watcher can see them.

The tiny models keep every other dimension below T (vocabulary 64, hidden 32, MLP 64), so a
flag can only be the pattern. Sliding-window layers (gpt-oss, which has no SDPA; Mistral, which
has) get no (T, S) mask either: a plain window is left to the kernel (``capture/window_masks.py``),
and on the CPU the kernel walks the queries in blocks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from sinkscope.capture import kernels, ModelSpec
from sinkscope.probes import discover, get_probe, eviction, head_importance
from sinkscope.store.results import rows_to_frame
from sinkscope.forward.runner import run_probes
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT

T = 256  # the window length: every other dimension of the tiny models is below it
VOCAB = 64


class PatternWatch(TorchDispatchMode):
    """Records (op, shape) of every op output with at least two dimensions >= ``length``."""

    def __init__(self, length: int = T):
        super().__init__()
        self.length, self.hits = length, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and sum(d >= self.length for d in t.shape) >= 2:
                self.hits.append((str(func), tuple(t.shape)))
        return out


@pytest.fixture(autouse=True)
def fresh_kernels():
    """Forget earlier tests' kernel verdicts: a kernel refused for another kind of call would send these to the
    blocked path, whose query blocks (256) are as long as these windows."""
    kernels.reset_kernel_state()
    yield
    kernels.reset_kernel_state()


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=1024)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _ids(batch: int = 2) -> np.ndarray:
    return torch.randint(0, VOCAB, (batch, T), generator=torch.Generator().manual_seed(0)).numpy()


def _watched(model, names, attention="fused", **params) -> tuple[list, pd.DataFrame]:
    spec = ModelSpec.from_model(model)
    probes = [get_probe(name)(spec, **params.get(name, {})) for name in names]
    watch = PatternWatch()
    with watch:
        run_probes(model, _ids(), probes, batch_size=2, progress=False, attention=attention)
    return watch.hits, rows_to_frame([row for probe in probes for row in probe.rows()])


def _llama_probes() -> list[str]:
    """Every probe run_probes runs that a plain causal Llama can measure (stream reads its own
    windows; eviction needs sliding-window layers; the explorer keeps a few heads' patterns by
    design, in query blocks of at most its BLOCK_BYTES: tests/unit/probes/test_explorer.py::test_query_blocks_give_the_entries_of_one_block)."""
    return sorted(name for name, cls in discover().items()
                  if not cls.reads_windows and name not in ("eviction", "explorer"))


@pytest.mark.parametrize("name", _llama_probes())
def test_no_probe_allocates_a_pattern_on_the_fused_path(llama, name):
    hits, frame = _watched(llama, [name])
    assert hits == [], f"{name} allocated {hits[:3]}"


@pytest.mark.parametrize("variant", ["sink+norm", "sink+proj", "outgate", "sinktoken"])
def test_trainer_variants_measure_without_a_pattern(variant):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=512, n_layer=2, n_head=2, n_embd=32, variant=variant)).eval()
    names = ["p0_mass", "phantom_mass", "gate_selectivity", "gated_value_norm_ratio", "read_gate", "output_gate",
             "head_importance", "token_share"]
    hits, frame = _watched(model, names)
    assert hits == []
    assert len(frame) > 0


def test_the_watcher_sees_the_explicit_pattern(llama):
    hits, _ = _watched(llama, ["p0_mass"], attention="explicit")
    assert (2, 4, T, T) in {shape for _, shape in hits}  # the eager weights, per head


def test_the_data_sink_set_in_query_blocks_equals_one_block(llama, monkeypatch):
    params = {"head_importance": {"sink_set": "data"}}
    _, whole = _watched(llama, ["head_importance"], **params)
    # (B, H, S) float32 = 2 * 4 * 256 * 4 bytes per query: blocks of 16 queries
    monkeypatch.setattr(head_importance, "BLOCK_BYTES", 4 * 2 * 4 * T * 16)
    hits, blocked = _watched(llama, ["head_importance"], **params)
    assert hits == []
    pd.testing.assert_frame_equal(blocked, whole, rtol=1e-6, atol=1e-7)
    assert set(whole["metric"]) >= {"implicit_gate", "head_importance", "sink_keys"}


RESIDUAL_ONLY = ["massive_activation", "p0_norm", "attn_out_norm", "mlp_pca_up", "p0_outliers"]


def test_residual_only_probes_run_on_the_fused_kernel(llama):
    seen = []
    handle = llama.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.append(llama.config._attn_implementation))
    try:
        _watched(llama, RESIDUAL_ONLY)
    finally:
        handle.remove()
    assert seen and set(seen) == {"sinkscope_fused"}
    assert llama.config._attn_implementation == "eager"  # put back after the run


def _sliding(family: str) -> torch.nn.Module:
    """A tiny gpt-oss (learned sinks, sliding and full layers) or Mistral (every layer a window of 16)."""
    small = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=1024, sliding_window=16)
    if family == "gpt_oss":
        config = GptOssConfig(**small, head_dim=8, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                              layer_types=["sliding_attention", "full_attention"],
                              rope_parameters={"rope_type": "default", "rope_theta": 150000.0})
        cls = GptOssForCausalLM
    else:
        config, cls = MistralConfig(**small, intermediate_size=64), MistralForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return cls(config).eval()


@pytest.mark.parametrize("family", ["gpt_oss", "mistral"])
def test_sliding_window_layers_allocate_no_mask_on_the_fused_path(family, monkeypatch):
    model = _sliding(family)
    monkeypatch.setattr(kernels, "WINDOW_QUERY_BLOCK", 64)  # the CPU kernel's blocks: (64, 64 + 16) biases, not (T, T)
    kernels.reset_kernel_state()
    hits, frame = _watched(model, ["p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio"])
    assert hits == [], f"{family} allocated {hits[:3]}"
    assert {(c["window"], c["masked"]) for c in kernels.kernel_choices()} >= {(16, False)}
    assert np.isfinite(frame["value"]).all() and len(frame) > 0


@pytest.mark.parametrize("family", ["gpt_oss", "mistral"])
def test_eviction_in_query_blocks_equals_one_block_and_allocates_no_pattern(family, monkeypatch):
    model = _sliding(family)
    monkeypatch.setattr(kernels, "WINDOW_QUERY_BLOCK", 64)
    _, whole = _watched(model, ["eviction"])
    # (B, H, S) float32 = 2 * 4 * 256 * 4 bytes per query: blocks of 16 queries
    monkeypatch.setattr(eviction, "BLOCK_BYTES", 4 * 2 * 4 * T * 16)
    hits, blocked = _watched(model, ["eviction"])
    assert hits == [], f"{family} allocated {hits[:3]}"
    pd.testing.assert_frame_equal(blocked, whole, rtol=1e-6, atol=1e-7)
    assert set(whole["metric"]) >= {"eviction_mass", "eviction_shift_rel"} and np.isfinite(whole["value"]).all()
