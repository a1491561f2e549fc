"""A model's size from its config, checked before anything is allocated (src/sinkscope/models/size.py).

The reference is the parameter count of real (tiny) models built from the same config: the
estimate's formula must match it where the formula's assumptions hold (a gated MLP, an untied
head), and the check must refuse what cannot fit, naming the field, in one sentence.
"""

from __future__ import annotations

import math

import pytest

from sinkscope.errors import SinkscopeError
from sinkscope.models.size import check_config_sizes, estimate
from sinkscope.runtime.memory import available_memory

LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 300, "tie_word_embeddings": False}


def test_the_estimate_is_the_parameter_count_of_a_llama_without_its_norms():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**LLAMA))
    norms = sum(p.numel() for name, p in model.named_parameters() if "norm" in name)
    params, need, fields = estimate(LLAMA, "x")
    assert params == sum(p.numel() for p in model.parameters()) - norms
    assert need == 2 * params + 2 * 64 * 1024
    assert fields["layers"] == ("num_hidden_layers", 2) and fields["kv_heads"] == ("num_key_value_heads", 2)
    tied, _, _ = estimate({**LLAMA, "tie_word_embeddings": True}, "x")
    assert params - tied == 300 * 64


def test_trainer_and_gpt2_spellings_and_a_multimodal_text_config():
    gpt2 = {"n_layer": 3, "n_embd": 32, "n_head": 2, "vocab_size": 100}
    params, _, fields = estimate(gpt2, "x")
    assert fields["layers"] == ("n_layer", 3) and fields["width"] == ("n_embd", 32)
    assert params == 3 * (4 * 32 * 32 + 3 * 32 * 128) + 2 * 100 * 32  # F defaults to 4C
    wrapped = {"model_type": "llava", "text_config": LLAMA, "vision_config": {"hidden_size": 8}}
    assert estimate(wrapped, "x")[0] == estimate(LLAMA, "x")[0]


@pytest.mark.parametrize("field,value", [("num_hidden_layers", 0), ("num_hidden_layers", -1), ("hidden_size", math.nan),
                                         ("num_attention_heads", 0), ("vocab_size", "300"), ("intermediate_size", True),
                                         ("num_hidden_layers", 2.5)])
def test_a_size_that_is_not_a_positive_integer_names_the_field(field, value):
    with pytest.raises(SinkscopeError) as error:
        check_config_sizes({**LLAMA, field: value}, "the config.json of /m", memory=10 ** 12)
    sentence = str(error.value)
    assert sentence.startswith("the config.json of /m sets " + field) and sentence.count(". ") == 0


def test_a_config_without_its_sizes_gives_no_estimate_and_is_not_refused():
    """A config class fills in defaults (and custom code may compute sizes): only sizes given are checked."""
    assert check_config_sizes({"hidden_size": 64, "model_type": "llama"}, "x", memory=1) is None
    with pytest.raises(SinkscopeError, match="sets vocab_size = -3"):
        check_config_sizes({"vocab_size": -3}, "x", memory=10 ** 12)


def test_a_model_bigger_than_memory_is_refused_naming_its_most_unusual_size():
    with pytest.raises(SinkscopeError) as error:
        check_config_sizes({**LLAMA, "num_hidden_layers": 10 ** 9}, "the config.json of /m", memory=24 * 10 ** 9)
    sentence = str(error.value)
    assert "num_hidden_layers = 1,000,000,000" in sentence and "24.0 GB" in sentence
    with pytest.raises(SinkscopeError, match="hidden_size = 10,000,000"):
        check_config_sizes({**LLAMA, "hidden_size": 10 ** 7}, "x", memory=24 * 10 ** 9)
    assert check_config_sizes(LLAMA, "x", memory=24 * 10 ** 9) == estimate(LLAMA, "x")[0]  # a real model passes


def test_available_memory_is_a_positive_number_of_bytes_below_the_physical_total():
    import os

    memory = available_memory()
    assert memory is not None and 0 < memory <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") + 10 ** 15


# ---- round three (issue 60): every field that allocates, and the field at fault named -----------------------------
def test_a_huge_head_width_is_named_not_the_layer_count():
    with pytest.raises(SinkscopeError, match=r"\(head_dim = 1,000,000,000:"):
        check_config_sizes({**LLAMA, "head_dim": 10 ** 9}, "x", memory=24 * 10 ** 9)


def test_a_learned_position_table_counts_and_a_rotary_context_does_not():
    gpt2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 100}
    assert estimate({**gpt2, "n_positions": 1000}, "x")[0] - estimate(gpt2, "x")[0] == 1000 * 32
    rotary = {**LLAMA, "rope_theta": 10000.0}
    assert estimate({**rotary, "max_position_embeddings": 10 ** 12}, "x")[0] == estimate(rotary, "x")[0]
    with pytest.raises(SinkscopeError, match="n_positions = 10,000,000,000"):
        check_config_sizes({**gpt2, "n_positions": 10 ** 10}, "x", memory=24 * 10 ** 9)


def test_the_estimate_counts_gpt2s_position_table_as_the_model_holds_it():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 64}
    model = GPT2LMHeadModel(GPT2Config(**config))
    assert model.transformer.wpe.weight.numel() == estimate({**config, "n_positions": 128}, "x")[0] \
        - estimate(config, "x")[0] == 64 * 32


def test_a_per_layer_list_of_the_wrong_length_is_one_sentence():
    with pytest.raises(SinkscopeError) as error:
        check_config_sizes({**LLAMA, "layer_types": ["full_attention"] * 200_000}, "the config.json of /m",
                           memory=10 ** 12)
    assert "layer_types with 200,000 entries but num_hidden_layers = 2" in str(error.value)
    check_config_sizes({**LLAMA, "layer_types": ["full_attention"] * 2}, "x", memory=10 ** 12)


@pytest.mark.parametrize("field,value", [("rms_norm_eps", math.nan), ("layer_norm_epsilon", math.inf),
                                         ("rope_theta", math.nan)])
def test_a_nan_setting_or_an_infinite_epsilon_names_the_field(field, value):
    with pytest.raises(SinkscopeError, match=f"sets {field} = {value!r}; a model's settings must be finite"):
        check_config_sizes({**LLAMA, field: value}, "x", memory=10 ** 12)
    with pytest.raises(SinkscopeError, match="sets rms_norm_eps"):
        check_config_sizes({"text_config": {**LLAMA, "rms_norm_eps": math.nan}}, "x", memory=10 ** 12)
