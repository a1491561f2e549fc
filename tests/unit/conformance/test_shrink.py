"""The generic shrinking rules of the conformance models (src/sinkscope/conformance/shrink.py).

The reference is a hand-written reading of the rules on a made-up config dict (no config class,
so no field is treated as derived): every size tiny, special-token ids kept inside the vocabulary.
"""

from __future__ import annotations

from sinkscope.conformance import shrink
from sinkscope.conformance.shrink import _layer_plan, _shrink, _TokenIds

BIG = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 11008,
       "vocab_size": 32000, "num_hidden_layers": 32, "bos_token_id": 1, "eos_token_id": 32000,
       "pad_token_id": 32001, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "model_type": "x"}


def test_every_size_of_a_dense_gqa_config_shrinks_to_the_targets():
    assert _shrink(dict, BIG, _TokenIds(shrink.VOCAB)) == {
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 128, "num_hidden_layers": 2, "bos_token_id": 1, "eos_token_id": 127, "pad_token_id": 126,
        "max_position_embeddings": 256}


def test_mha_and_mqa_stay_what_they_are():
    mha = _shrink(dict, {**BIG, "num_key_value_heads": 32}, _TokenIds(128))
    mqa = _shrink(dict, {**BIG, "num_key_value_heads": 1}, _TokenIds(128))
    assert mha["num_key_value_heads"] == shrink.HEADS and "num_key_value_heads" not in mqa


def test_the_layer_plan_keeps_the_shortest_prefix_holding_every_kind():
    kinds = (["sliding_attention"] * 5 + ["full_attention"]) * 4
    assert _layer_plan({"layer_types": kinds}, 24) == (6, list(range(6)))
    shrunk = _shrink(dict, {"num_hidden_layers": 24, "layer_types": kinds}, _TokenIds(128))
    assert shrunk == {"num_hidden_layers": 6, "layer_types": kinds[:6]}


def test_token_ids_outside_the_vocabulary_get_distinct_ids_at_its_top():
    ids = _TokenIds(128)
    assert [ids(5), ids(50000), ids(50001), ids(50000), ids(-1)] == [5, 127, 126, 127, -1]
