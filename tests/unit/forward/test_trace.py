"""One prompt's internals by TransformerLens name (forward/trace.py, ``sinkscope.trace``), against the
model's own eager attention: the pattern is its weights, the pattern and the phantom's share make one,
the MLP's output is what it adds to the residual stream, and a name filter keeps only what it names."""

from __future__ import annotations

import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.forward.trace import TRACE_NAMES, as_ids, trace_ids
from tiny_models import build, random_ids


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "gpt2"])
def test_the_pattern_is_the_models_own_eager_attention(family):
    model = build(family)
    ids = random_ids(1, 12)
    with torch.no_grad():
        eager = model(ids, output_attentions=True).attentions  # L x (1, H, T, S), over the real keys
    trace = trace_ids(model, ids)
    for layer, weights in enumerate(eager):
        pattern = trace[f"blocks.{layer}.attn.hook_pattern"]
        torch.testing.assert_close(pattern, weights.float(), atol=2e-6, rtol=0)
        phantom = trace.get(f"blocks.{layer}.attn.hook_phantom")
        total = pattern.sum(-1) + (phantom if phantom is not None else 0)  # (1, H, T)
        torch.testing.assert_close(total, torch.ones_like(total), atol=1e-5, rtol=0)
    assert ("blocks.0.attn.hook_phantom" in trace) == (family == "gpt_oss")
    scores, pattern = trace["blocks.0.attn.hook_attn_scores"], trace["blocks.0.attn.hook_pattern"]
    assert torch.isinf(scores[0, :, 0, 1:]).all()  # causal: -inf above the diagonal
    assert (pattern[torch.isinf(scores)] == 0).all() and (pattern[torch.isfinite(scores)] > 0).all()  # hidden: 0


def test_shapes_mlp_out_and_the_stack():
    model = build("llama")
    ids = random_ids(1, 10)
    trace = trace_ids(model, ids)
    H, D, C = model.config.num_attention_heads, model.config.head_dim, model.config.hidden_size
    assert trace["blocks.1.attn.hook_q"].shape == (1, 10, H, D)
    assert trace["blocks.1.attn.hook_k"].shape == (1, 10, model.config.num_key_value_heads, D)
    mlp_out = trace["blocks.1.hook_resid_post"] - trace["blocks.1.hook_resid_mid"]
    torch.testing.assert_close(trace["blocks.1.hook_mlp_out"], mlp_out)
    assert trace.stack("attn.hook_pattern").shape == (model.config.num_hidden_layers, 1, H, 10, 10)
    assert torch.equal(trace.tokens, ids)


def test_a_name_filter_keeps_only_what_it_names_and_an_unknown_name_is_one_sentence():
    model = build("llama")
    trace = trace_ids(model, random_ids(1, 8), names=["attn.hook_pattern", "blocks.0.hook_resid_post"])
    assert set(trace) == {f"blocks.{l}.attn.hook_pattern" for l in range(model.config.num_hidden_layers)} | {
        "blocks.0.hook_resid_post"}
    with pytest.raises(SinkscopeError, match="a trace has no 'attn.hook_patern'; did you mean 'attn.hook_pattern'"):
        trace_ids(model, random_ids(1, 8), names="attn.hook_patern")
    assert "hook_mlp_out" in TRACE_NAMES


def test_prompt_ids_in_every_form_and_none_too_many():
    assert as_ids([1, 2, 3], None).shape == (1, 3)
    assert as_ids(torch.tensor([[4, 5]]), None).tolist() == [[4, 5]]
    with pytest.raises(SinkscopeError, match="one prompt"):
        as_ids(torch.zeros(2, 3, dtype=torch.long), None)
    with pytest.raises(SinkscopeError, match="needs a tokenizer"):
        as_ids("hello", None)


def test_sinkscope_trace_takes_a_loaded_model_and_a_text(tokenizer):
    import sinkscope

    model = build("llama")
    trace = sinkscope.trace(model, "The quick brown fox", tokenizer, names="attn.hook_pattern")
    assert set(trace) == {f"blocks.{l}.attn.hook_pattern" for l in range(model.config.num_hidden_layers)}
    T = trace.tokens.shape[1]
    assert trace.tokens.tolist()[0] == tokenizer("The quick brown fox")["input_ids"]
    assert trace.pattern(1).shape == (1, model.config.num_attention_heads, T, T)
    assert len(trace.str_tokens) == T


def test_sinkscope_trace_loads_a_model_named_by_its_folder(tiny_llama_dir):
    import sinkscope

    trace = sinkscope.trace(str(tiny_llama_dir), [5, 6, 7, 8], names=["attn.hook_q", "hook_resid_post"])
    assert trace["blocks.0.attn.hook_q"].shape[:2] == (1, 4)
    with pytest.raises(SinkscopeError, match="tokenizer= goes with a loaded model"):
        sinkscope.trace(str(tiny_llama_dir), "text", tokenizer=object())
