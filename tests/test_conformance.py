"""Any causal LM: the architectures researchers bring, each checked as the conformance matrix checks it.

Every model type named in issue 24 is built tiny from its config class alone and must pass
``conformance.matrix.check_type``: its parts found, logits unchanged under the capture (fused and
explicit), per-head p0 and phantom mass equal to the model's own eager weights within 1e-5 (for a
rescaling sink, sigmoid(b - LSE) from explicit scores), the hook invariants, and every command run
or a missing hook point refused in one sentence. The whole matrix (every model type of the
installed transformers, at least 90% passing) is the slow test at the end.
"""

from __future__ import annotations

import pytest
import torch

from sinkscope.conformance.matrix import CHECKED_CLASSES, check_type
from sinkscope.errors import SinkscopeError

#: the architectures of issue 24's first paragraph (and what each stands for).
NAMED = {
    "opt": "Gu et al.'s family", "olmo2": "open checkpoints, post-norm", "olmo3": "open checkpoints",
    "gemma2": "soft-capping", "phi": "parallel block", "phi3": "fused gate/up", "falcon": "eager fallback",
    "stablelm": "partial rotary", "starcoder2": "code", "cohere2": "parallel, sliding", "mixtral": "MoE",
    "qwen2_moe": "MoE", "qwen3_moe": "MoE", "olmoe": "MoE", "smollm3": "NoPE layers", "llama4_text": "NoPE, MoE",
    "bloom": "ALiBi, eager fallback", "mpt": "ALiBi, eager fallback", "gptj": "parallel, partial rotary",
    "codegen": "parallel", "deepseek_v2": "MLA", "deepseek_v3": "MLA", "granite": "scaled logits",
    "granite_swa": "rescaling sink", "granitemoe_swa": "rescaling sink, MoE", "mimo_v2_flash": "sink column on SWA",
    "deepseek_v4": "sink column, float mask", "gpt_oss": "sink column", "qwen3_next": "output gate, linear layers",
    # the mechanisms the matrix made sinkscope learn, one model each
    "inkling_text": "position_bias folded into the mask", "deepseek_v32": "sparse indexer's indices",
    "zamba2": "attention module shared by layers", "dory": "looped layers", "gpt_neo": "eager fallback, no layer_idx",
}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("model_type", sorted(NAMED))
def test_named_architecture_passes_the_matrix(model_type):
    row = check_type(model_type)
    assert row["status"] == "pass", f"{model_type} ({NAMED[model_type]}): {row['reason']}"


def test_sink_forms_are_read_off_the_models_own_eager_function():
    assert check_type("granite_swa", commands=False)["sink"] == "rescale"
    assert check_type("gpt_oss", commands=False)["sink"] == "column"
    assert check_type("deepseek_v4", commands=False)["sink"] == "column"
    assert check_type("llama", commands=False)["sink"] == ""


def test_the_eager_fallback_is_named_and_refuses_what_it_cannot_read():
    import sinkscope
    from sinkscope.conformance.tiny import build_tiny

    row = check_type("bloom", commands=False)
    assert row["path"] == "eager fallback"
    model = build_tiny("bloom")
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(0)).numpy()
    messages = []
    result = sinkscope.measure("sinks", model, windows=ids, log=messages.append)
    assert result.manifest["model"]["spec"]["attention_path"] == "eager"
    assert any("output_attentions" in m and "quadratic" in m for m in messages)
    assert any(m.startswith("warning: the probe value_norm") for m in messages)  # values: not under the fallback
    assert (result.table.metric == "p0_mass").any()
    with pytest.raises(SinkscopeError, match="hook_v"):
        sinkscope.measure("inject", model, windows=ids, eval_batch=2)  # whole batches: structured junk


def test_a_sink_parameter_the_interface_does_not_receive_is_refused():
    from sinkscope.capture.discover import discover
    from tiny_models import build

    model = build("llama")
    for layer in model.model.layers:
        layer.self_attn.attention_sink = torch.nn.Parameter(torch.zeros(4))  # never handed to attention
    with pytest.raises(SinkscopeError) as info:
        discover(model)
    assert "attention_sink" in str(info.value) and "phantom mass as 0" in str(info.value)


@pytest.mark.slow
def test_the_whole_matrix_passes_at_least_nine_in_ten(tmp_path):
    from sinkscope.conformance import matrix, tiny

    rows = [check_type(t) for t in tiny.model_types()]
    checked = [r for r in rows if r["class"] in CHECKED_CLASSES]
    passed = [r for r in checked if r["status"] == "pass"]
    assert len(passed) >= 0.9 * len(checked), [(r["model_type"], r["reason"]) for r in checked if r not in passed]
    matrix.write_markdown(rows, tmp_path / "architectures.md")
    assert f"**{len(passed)} of {len(checked)}**" in (tmp_path / "architectures.md").read_text()
