"""The capture observes without perturbing, for every supported family."""

from __future__ import annotations

import pytest
import torch

from collect import Collect
from sinkscope.capture import ModelSpec, capture
from sinkscope.errors import SinkscopeError
from tiny_models import FAMILY_NAMES, build, random_ids


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_capture_leaves_logits_unchanged(family):
    model = build(family)
    ids = random_ids(2, 24)
    with torch.no_grad():
        reference = model(ids).logits
        collect = Collect()
        with capture(model, collect, mode="explicit") as spec:
            captured = model(ids).logits
        after = model(ids).logits
    torch.testing.assert_close(captured, reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(after, reference, atol=0, rtol=0)
    assert model.config._attn_implementation == "eager"  # restored on exit
    assert [r.layer for r in collect.records] == list(spec.attention_layers)
    assert sorted(collect.residual) == list(range(spec.n_layers))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_records_match_eager_attention_weights(family):
    """The record's weights are exactly output_attentions of eager, causal mask included."""
    model = build(family)
    ids = random_ids(2, 24)
    with torch.no_grad():
        eager = model(ids, output_attentions=True).attentions
        collect = Collect()
        with capture(model, collect, mode="explicit") as spec:
            model(ids)
    assert len(eager) == len(collect.records)
    for weights, record in zip(eager, collect.records):
        assert record.weights.shape == (2, spec.n_heads, 24, 24)
        assert record.key.shape[1] == spec.n_kv_heads and record.value.shape[1] == spec.n_kv_heads
        torch.testing.assert_close(record.weights, weights.float(), atol=0, rtol=0)
        upper = torch.triu(torch.ones(24, 24, dtype=torch.bool), diagonal=1)
        assert record.weights[..., upper].abs().max() == 0  # the mask interface is registered
        # The record's own logits reproduce the weights: softmax over real keys (+ phantom).
        logits = record.logits()
        if record.has_phantom:
            b = record.sink_logits.view(1, -1, 1, 1).expand(2, -1, 24, 1)
            full = torch.softmax(torch.cat([logits, b], dim=-1), dim=-1)[..., :-1]
        else:
            full = torch.softmax(logits, dim=-1)
        torch.testing.assert_close(full, record.weights, atol=1e-6, rtol=0)


def test_gpt_oss_phantom_mass_is_sigmoid_of_sink_minus_lse():
    model = build("gpt_oss")
    ids = random_ids(3, 24)
    collect = Collect()
    with torch.no_grad(), capture(model, collect, mode="explicit"):
        model(ids)
    for record in collect.records:
        phi = record.phantom_mass()  # sigmoid(b_h - LSE_i)
        one_minus_rowsum = 1 - record.weights.sum(-1)
        torch.testing.assert_close(phi, one_minus_rowsum, atol=2e-6, rtol=0)
        assert 0.05 < float(phi.mean()) < 0.95
        lse = torch.logsumexp(record.logits(), -1)
        torch.testing.assert_close(phi, torch.sigmoid(record.sink_logits.view(1, -1, 1) - lse), atol=1e-7, rtol=0)
    # The sliding-window layer hides keys further back than the window.
    sliding = collect.records[0]
    assert sliding.sliding_window == 8
    assert sliding.weights[:, :, 20, :13].abs().max() == 0


def test_qwen3_next_output_gate_is_read_not_reimplemented():
    """record.output_gate * attention output == what o_proj receives (the model's own gating)."""
    model = build("qwen3_next")
    ids = random_ids(2, 16)
    seen = {}
    layer = model.model.layers[1].self_attn
    handle = layer.o_proj.register_forward_pre_hook(lambda m, args: seen.__setitem__("o_in", args[0]))
    collect = Collect()
    with torch.no_grad(), capture(model, collect, mode="explicit"):
        model(ids)
    handle.remove()
    record = collect.records[0]  # layer 0 is linear attention: the first record is layer 1's
    assert [r.layer for r in collect.records] == [1, 2] and record.output_gate.shape == (2, 16, 4, 16)
    groups = record.n_heads // record.n_kv_heads
    out = torch.matmul(record.weights, record.value.repeat_interleave(groups, 1)).transpose(1, 2)  # (B, T, H, D)
    gated = (out * record.output_gate).reshape(2, 16, -1)
    torch.testing.assert_close(gated, seen["o_in"], atol=1e-6, rtol=0)


def test_a_module_that_is_not_a_transformers_model_is_one_sentence():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(SinkscopeError) as info:
        ModelSpec.from_model(model)
    assert "not a transformers model" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(SinkscopeError):
        with capture(model, Collect()):
            pass
