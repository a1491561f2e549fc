"""The classification table of the conformance models (src/sinkscope/conformance/kinds.py).

Every causal-LM type of the installed transformers gets one kind and a reason, and ``tiny``
(the entry point) hands out the very same table.
"""

from __future__ import annotations

import pytest

from sinkscope.conformance import kinds, tiny

KINDS = {"decoder", "hybrid", "multimodal-decoder", "encoder-decoder", "encoder", "attention-free"}


def test_every_type_has_one_known_kind_and_a_reason():
    types = kinds.model_types()
    assert types == sorted(types) and "llama" in types
    for t in types:
        assert kinds.classify(t) in KINDS
        assert kinds.CLASS_REASONS[t]
    assert kinds.classify("llama") == "decoder" and kinds.classify("mamba") == "attention-free"
    assert kinds.classify("jamba") == "hybrid" and kinds.classify("bert") == "encoder"


def test_an_unknown_type_is_a_key_error():
    with pytest.raises(KeyError, match="not a causal-LM model type"):
        kinds.classify("no-such-type")


def test_tiny_re_exports_the_same_table():
    assert tiny.classify is kinds.classify and tiny.model_types is kinds.model_types
    assert tiny.CLASSES is kinds.CLASSES and tiny.CLASS_REASONS is kinds.CLASS_REASONS
