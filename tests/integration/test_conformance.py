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
    "inkling2_text": "sink logit per query (sink_proj), a softmax column, gate inside o_proj",
    "afmoe": "output gate from its own projection", "lfm3": "per-head output gate computed after attention",
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


def test_every_command_really_runs_in_the_matrix():
    """A command the matrix calls wrongly (an unknown option) is a failure, never a 'refused' pass."""
    detail = check_type("llama")["reason"]
    for command in ("sinks", "heads", "inject", "circuit"):
        assert command in detail and f"{command} refused" not in detail, detail


def test_a_per_query_sink_logit_is_measured_against_its_projection():
    """Inkling2 computes b_hi = sink_proj(h_i) per query and appends it as a softmax column.

    Reference, independent of the capture: the eager model's own weights give phi_i = 1 - sum_j a_ij,
    and a forward hook on ``sink_proj`` gives b_hi; phantom_mass and sink_logit (the mean of b_hi over
    queries i >= 1) must match per head, fused and explicit.
    """
    import sinkscope
    from sinkscope.conformance.tiny import build_tiny

    torch.manual_seed(0)
    model = build_tiny("inkling2_text").eval()
    ids = torch.randint(1, model.get_input_embeddings().num_embeddings - 1, (2, 12),
                        generator=torch.Generator().manual_seed(1))
    logits_seen: dict[int, list[torch.Tensor]] = {}
    handles = [layer.self_attn.sink_proj.register_forward_hook(
        lambda _m, _i, out, index=index: logits_seen.setdefault(index, []).append(out.detach().float()))
        for index, layer in enumerate(model.model.layers) if hasattr(layer.self_attn, "sink_proj")]
    model.set_attn_implementation("eager")
    with torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    for handle in handles:
        handle.remove()
    assert logits_seen, "the tiny Inkling2 has no sink_proj: the test would check nothing"
    for attention in ("fused", "explicit"):
        table = sinkscope.measure(["phantom_mass"], model, windows=ids.numpy(), attention=attention).table
        heads = table[table["head"].notna()]
        for layer, seen in logits_seen.items():
            b = torch.cat(seen)  # (B, T, H)
            expected_logit = b[:, 1:].mean(dim=(0, 1)).double()  # (H,)
            phi = 1 - weights[layer].float().sum(-1)  # (B, H, T)
            expected_mass = phi[:, :, 1:].mean(dim=(0, 2)).double()  # (H,)
            for metric, expected in (("sink_logit", expected_logit), ("phantom_mass", expected_mass)):
                got = heads[(heads["metric"] == metric) & (heads["layer"] == layer)].sort_values("head")["value"]
                assert torch.allclose(torch.tensor(got.to_numpy()), expected, atol=1e-5), (attention, metric, layer)
            assert float(expected_mass.max()) > 1e-3  # a phantom that takes mass: not a check of zeros


@pytest.mark.parametrize("model_type,gate_name", [("afmoe", "gate_proj"), ("lfm3", "g_proj")])
def test_an_output_gate_of_its_own_projection_is_read(model_type, gate_name):
    """out_gate_mean per head equals sigmoid(g) from a forward hook on the model's own gate projection."""
    import sinkscope
    from sinkscope.conformance.tiny import build_tiny

    torch.manual_seed(0)
    model = build_tiny(model_type).eval()
    ids = torch.randint(1, model.get_input_embeddings().num_embeddings - 1, (2, 12),
                        generator=torch.Generator().manual_seed(1))
    gates: dict[int, torch.Tensor] = {}
    handles = []
    for index, layer in enumerate(model.model.layers):
        attention = getattr(layer, "self_attn", None)
        if attention is not None and getattr(attention, gate_name, None) is not None:
            handles.append(getattr(attention, gate_name).register_forward_hook(
                lambda _m, _i, out, index=index: gates.__setitem__(index, torch.sigmoid(out.detach().float()))))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for handle in handles:
        handle.remove()
    assert gates, f"the tiny {model_type} has no {gate_name}: the test would check nothing"
    table = sinkscope.measure(["output_gate"], model, windows=ids.numpy()).table
    rows = table[(table["metric"] == "out_gate_mean") & table["head"].notna()]
    n_heads = model.config.num_attention_heads
    for layer, g in gates.items():
        expected = g.view(*g.shape[:2], n_heads, -1).mean(dim=(0, 1, 3)).double()  # (H,)
        got = rows[rows["layer"] == layer].sort_values("head")["value"].to_numpy()
        assert torch.allclose(torch.tensor(got), expected, atol=1e-6), (layer, got, expected)


def test_a_change_before_w_o_that_is_not_a_sigmoid_gate_is_refused_by_selectivity():
    import sinkscope
    from sinkscope.conformance.tiny import build_tiny

    model = build_tiny("dory")  # sigmoid(g * s^2): a scaled gate
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(0)).numpy()
    with pytest.raises(SinkscopeError, match="changes its attention output before W_O") as info:
        sinkscope.measure("selectivity", model, windows=ids)
    assert "\n" not in str(info.value)


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


@pytest.mark.slow  # sweeps architectures (every model type in transformers)
def test_the_whole_matrix_passes_at_least_nine_in_ten(tmp_path):
    from sinkscope.conformance import matrix, tiny

    rows = [check_type(t) for t in tiny.model_types()]
    checked = [r for r in rows if r["class"] in CHECKED_CLASSES]
    passed = [r for r in checked if r["status"] == "pass"]
    assert len(passed) >= 0.9 * len(checked), [(r["model_type"], r["reason"]) for r in checked if r not in passed]
    matrix.write_markdown(rows, tmp_path / "architectures.md")
    assert f"**{len(passed)} of {len(checked)}**" in (tmp_path / "architectures.md").read_text()
