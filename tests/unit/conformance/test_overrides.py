"""The tiny config of one model type: generic shrink, then per-type quirks (src/sinkscope/conformance/overrides.py).

The references are the config classes of the installed transformers and the quirks' own comments.
"""

from __future__ import annotations

from sinkscope.conformance import kinds, overrides, tiny
from sinkscope.conformance.overrides import OVERRIDES, tiny_config, tiny_overrides


def test_the_overrides_name_only_causal_lm_types():
    assert set(OVERRIDES) <= set(kinds.model_types())


def test_a_plain_decoder_gets_the_generic_sizes_only():
    kwargs = tiny_overrides("llama")
    assert (kwargs["hidden_size"], kwargs["num_hidden_layers"], kwargs["vocab_size"]) == (64, 2, 128)
    config = tiny_config("llama")
    assert type(config).__name__ == "LlamaConfig" and config.hidden_size == 64 and config.intermediate_size == 128


def test_the_per_type_quirks_apply_after_the_generic_rules():
    assert tiny_overrides("reformer")["is_decoder"] is True  # a plain value
    assert tiny_config("dbrx").attn_config.clip_qkv == 8.0  # a nested dict, merged into the sub-config
    dory = tiny_overrides("dory")  # a "__fn__" post-processing the result
    assert dory["num_hidden_layers"] == 4 and "rope_parameters" not in dory


def test_tiny_re_exports_the_config_recipe():
    assert tiny.tiny_config is overrides.tiny_config and tiny.tiny_overrides is overrides.tiny_overrides
    assert tiny.OVERRIDES is overrides.OVERRIDES
