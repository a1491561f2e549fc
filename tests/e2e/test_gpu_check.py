"""benchmarks/gpu_check.py: the real shapes are right, and the whole script runs (--tiny, CPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from repo_paths import REPO

SCRIPT = REPO / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_full_shapes_are_llama_1b_and_gpt_oss_20b(gpu_check):
    """Built on the meta device (no memory): parameter counts, layers, experts, attention types."""
    counts = {}
    for name, (cls, config, _) in gpu_check.model_configs(tiny=False).items():
        model = gpu_check.build(cls, config, torch.device("meta"), torch.bfloat16)
        counts[name] = sum(p.numel() for p in model.parameters())
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert counts["llama-1b"] == pytest.approx(1.236e9, rel=1e-3)
    assert counts["gpt-oss-20b"] == pytest.approx(20.91e9, rel=1e-3)  # not the 120b's 117B
    oss = gpu_check.model_configs(tiny=False)["gpt-oss-20b"][1]
    assert (oss.num_hidden_layers, oss.num_local_experts, oss.num_experts_per_tok) == (24, 32, 4)
    assert oss.layer_types[:2] == ["sliding_attention", "full_attention"] and len(oss.layer_types) == 24
    llama = gpu_check.model_configs(tiny=False)["llama-1b"][1]
    assert (llama.num_hidden_layers, llama.num_attention_heads, llama.num_key_value_heads, llama.hidden_size) == (
        16, 32, 8, 2048)


@pytest.mark.slow  # trains
def test_tiny_dry_run_on_cpu(gpu_check, capsys):
    results = gpu_check.main(["--tiny", "--device", "cpu", "--lengths", "32", "--repeats", "1", "--profile"])
    out = capsys.readouterr().out
    runs = ["plain", "capture", *gpu_check.SINKS_PROBES, "all 5", "stream"]
    assert [(r["model"], r["run"]) for r in results] == \
        [(m, run) for m in ("llama-1b", "gpt-oss-20b") for run in runs + (["monitor"] if m == "llama-1b" else [])]
    assert all(r["seconds"] > 0 and r["tokens"] == 32 for r in results)
    assert "monitor 8 x 128" in out and "at --monitor-every 100" in out  # the monitor against a training step
    assert "stream sinks 8" in out  # the stream reader ran on both shapes (learned sinks and sliding layers too)
    assert "kernels on cpu" in out and "ran cpu_flash" in out  # the kernel check ran
    assert out.count("exact: True") == 2  # the median check, bfloat16 and float32
    assert "['bfloat16']" in out  # built in bfloat16, no float32 copy
    assert out.count("Self CPU time total") == 2  # one profile per model
    assert "capture kernel: cpu_flash" in out


def test_full_shapes_need_a_gpu(gpu_check):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit):
        gpu_check.main([])


def test_tiny_long_context_dry_run_on_cpu(gpu_check, capsys, monkeypatch):
    """--long (issue 42): the exactness check at its length, then plain against all five at each long length."""
    monkeypatch.setattr(gpu_check, "kernel_check", lambda *args: None)  # covered by the dry run above
    monkeypatch.setattr(gpu_check, "median_check", lambda *args: None)
    results = gpu_check.main(["--tiny", "--long", "--device", "cpu", "--repeats", "1"])
    out = capsys.readouterr().out
    lengths = gpu_check.LONG_LENGTHS_TINY
    assert [(r["model"], r["tokens"], r["run"]) for r in results] == [
        (m, t, run) for m in ("llama-1b", "gpt-oss-20b")
        for t, run in [(gpu_check.EXACT_LENGTH_TINY, "p0 exact")] + [(t, r) for t in lengths[m] for r in ("plain", "all 5")]]
    exact = [r["ratio"] for r in results if r["run"] == "p0 exact"]
    assert all(0 <= d <= 1e-3 for d in exact)  # tiny models: the fused p0 mass equals the explicit one to round-off
    assert out.count("p0 mass, fused against the exact path (explicit)") == 2
    assert all(r["seconds"] > 0 for r in results if r["run"] != "p0 exact")
    assert gpu_check.LONG_LENGTHS == {"llama-1b": (32768, 131072), "gpt-oss-20b": (32768,)}
    assert gpu_check.EXACT_LENGTH == 4096
