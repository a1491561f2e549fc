"""Discovery finds each family's parts by watching one forward pass (``capture/discover.py``).

The reference is the table written by hand from each modeling file (``tiny_models.PATHS``); the
discovered parts must equal it, with no table in the package.
"""

from __future__ import annotations

import pytest
import torch

from sinkscope.capture.discover import discover
from sinkscope.capture.families import ModelSpec
from sinkscope.errors import SinkscopeError
from tiny_models import FAMILY_NAMES, PATHS, build


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_discovery_finds_the_hand_written_parts(family):
    model = build(family)
    parts, expected = discover(model), PATHS[family]
    for name in ("layers", "ln1", "attention", "out_proj", "attn_out", "ln2", "parallel", "mlp_pre", "mlp_pre_linear",
                 "out_proj_conv1d"):
        assert getattr(parts, name) == getattr(expected, name), name
    config = model.config
    assert parts.n_heads == config.num_attention_heads
    assert parts.n_kv_heads == (getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    assert parts.sink_form == ("column" if family == "gpt_oss" else None)
    layer_types = getattr(config, "layer_types", None)
    if family == "qwen3_next":  # only the full-attention layers have softmax attention
        assert parts.attention_layers == tuple(i for i, t in enumerate(layer_types) if t == "full_attention")
    else:
        assert parts.attention_layers == tuple(range(config.num_hidden_layers))


def test_discovery_leaves_the_model_as_it_was():
    model = build("llama")
    ids = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        before = model(ids).logits
    implementation = model.config._attn_implementation
    discover(model)
    assert model.config._attn_implementation == implementation
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_a_model_without_softmax_attention_is_one_sentence():
    from transformers import MambaConfig, MambaForCausalLM

    model = MambaForCausalLM(MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, state_size=4)).eval()
    with pytest.raises(SinkscopeError) as info:
        ModelSpec.from_model(model)
    assert "softmax attention" in str(info.value) and "\n" not in str(info.value)


def test_the_self_check_stops_a_capture_that_changes_the_logits(monkeypatch):
    import numpy as np

    from sinkscope.capture import attention
    from sinkscope.forward.runner import check_capture

    model = build("llama")
    ids = np.arange(1, 17).reshape(1, 16)
    result = check_capture(model, ids, attention="fused")
    assert result["relative"] <= result["tolerance"] and result["tokens"] == 16
    real = attention.sinkscope_fused_attention

    def off_by_a_little(module, query, key, value, attention_mask, **kwargs):
        return real(module, query * 1.5, key, value, attention_mask, **kwargs)  # a wrong scale, say

    monkeypatch.setattr(attention, "sinkscope_fused_attention", off_by_a_little)
    from transformers import AttentionInterface

    AttentionInterface.register(attention.FUSED_IMPLEMENTATION, off_by_a_little)
    try:
        with pytest.raises(SinkscopeError) as info:
            check_capture(model, ids, attention="fused")
        assert "'llama'" in str(info.value) and "logits" in str(info.value) and "\n" not in str(info.value)
    finally:
        AttentionInterface.register(attention.FUSED_IMPLEMENTATION, real)


def test_every_run_records_its_self_check(tiny_llama_dir, text_file, tmp_path):
    import sinkscope

    result = sinkscope.measure("p0_mass", str(tiny_llama_dir), text_file=str(text_file), seq_len=16, n_seqs=2)
    check = result.manifest["capture_check"]
    assert check["tokens"] == 16 and check["relative"] <= check["tolerance"]


def test_ls_hooks_of_a_model_names_what_it_lacks(tmp_path, tokenizer):
    from typer.testing import CliRunner

    from sinkscope.cli import app

    folder = tmp_path / "oss"
    build("gpt_oss").save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    result = CliRunner().invoke(app, ["ls", "hooks", str(folder)])
    assert result.exit_code == 0, result.output
    line = next(l for l in result.output.splitlines() if l.startswith("blocks.{l}.mlp.hook_pre "))
    assert "absent" in line and "mixture-of-experts" in line
    assert "learned sink (column)" in result.output
