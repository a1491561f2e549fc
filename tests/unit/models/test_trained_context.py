"""``sinkscope.models.trained_context``: the trained length, learned position tables, and runs past them.

Past a computed-position model's trained context the run continues after one warning line and
its manifest records the trained length; past a learned position table it stops in one
sentence before the forward would fail with an index error (SPEC.md "Past the trained context").
"""

from __future__ import annotations

import pytest
import torch
from transformers import OPTConfig, OPTForCausalLM

from sinkscope import api
from sinkscope.errors import SinkscopeError, phrase
from sinkscope.models.trained_context import (
    config_context,
    is_native_config,
    learned_positions,
    require_positions,
    warn_past_context,
)
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT
from tests.tiny_models import build, random_ids


def test_the_trained_context_is_read_from_dicts_and_configs_in_key_order():
    assert config_context({"block_size": 64, "max_position_embeddings": 128}) == 64
    assert config_context({"n_positions": 1024}) == 1024 and config_context({"n_ctx": 2048}) == 2048
    assert config_context({"max_position_embeddings": True}) is None  # not a length
    assert config_context({"max_position_embeddings": 0}) is None and config_context(None) is None
    assert config_context(build("llama").config) == 512 and config_context(build("gpt2").config) == 512
    assert is_native_config({"block_size": 64}) and not is_native_config({"max_position_embeddings": 64})


def test_learned_tables_are_found_and_computed_positions_are_not():
    assert learned_positions(build("gpt2")) == ("transformer.wpe", 512)
    assert learned_positions(build("llama")) is None and learned_positions(build("gpt_neox")) is None
    opt = OPTForCausalLM(OPTConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                                   num_attention_heads=2, max_position_embeddings=24, word_embed_proj_dim=16))
    assert learned_positions(opt) == ("model.decoder.embed_positions", 24)  # its 2 offset rows are no positions
    native = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_embd=16))
    assert learned_positions(native) == ("transformer.wpe", 32)


def test_past_a_learned_table_is_one_sentence_and_past_a_computed_context_one_warning():
    require_positions(512, ("transformer.wpe", 512))  # at the table's length: fine
    with pytest.raises(SinkscopeError) as caught:
        require_positions(513, ("transformer.wpe", 512))
    assert phrase(str(caught.value)) == ("--seq-len 513 is past the model's learned position table (transformer.wpe, "
                                         "512 positions): positions past 512 do not exist in it; use at most 512.")
    lines: list[str] = []
    assert warn_past_context(512, 512, lines.append) is False and lines == []
    assert warn_past_context(None, 512, lines.append) is False and warn_past_context(600, None, lines.append) is False
    assert warn_past_context(600, 512, lines.append) is True
    assert lines == ["warning: the windows (600 tokens) are past the model's trained context of 512 tokens; positions "
                     "512 to 599 were never trained on (the run continues, and its manifest records it)."]


def test_a_run_past_a_rope_models_context_warns_once_continues_and_records_the_trained_length():
    model = build("llama")
    model.config.max_position_embeddings = 16
    messages: list[str] = []
    result = api.measure("p0_mass", model, windows=random_ids(1, 24).numpy(), log=messages.append)
    warnings = [m for m in messages if "trained context" in m]
    assert warnings == [warnings[0]] and "(24 tokens)" in warnings[0] and "of 16 tokens" in warnings[0]
    assert result.manifest["windows"]["trained_context"] == 16 and result.manifest["windows"]["seq_len"] == 24
    assert torch.isfinite(torch.tensor(result.table.value.to_numpy())).all()


def test_a_run_past_gpt2s_position_table_stops_before_the_forward():
    model = build("gpt2")
    model.config.n_positions = 16
    model.transformer.wpe = torch.nn.Embedding(16, model.config.n_embd)
    with pytest.raises(SinkscopeError, match=r"seq_len 24 is past the model's learned position table \(transformer"
                                             r"\.wpe, 16 positions\)"):
        api.measure("p0_mass", model, windows=random_ids(1, 24).numpy(), log=lambda m: None)
