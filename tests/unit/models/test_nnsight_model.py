"""models/nnsight_model.py: an nnsight LanguageModel is measured through the transformers model it wraps, to the
bare model's numbers exactly, and one whose weights are not loaded yet is one sentence."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import sinkscope
from sinkscope.errors import SinkscopeError
from sinkscope.models.nnsight_model import is_nnsight_model, unwrapped

nnsight = pytest.importorskip("nnsight")

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 6, "A second document, not the first one. " * 6]


def _language_model(folder):
    import warnings

    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nnsight 0.8 calls LanguageModel deprecated in favour of TransformersModel
        return nnsight.LanguageModel(model, tokenizer=tokenizer), model, tokenizer


def test_a_language_model_gives_the_bare_models_numbers(tiny_llama_dir):
    wrapped, bare, tokenizer = _language_model(tiny_llama_dir)
    assert is_nnsight_model(wrapped) and not is_nnsight_model(bare)
    assert unwrapped(wrapped) == (bare, tokenizer)
    options = dict(texts=TEXTS, seq_len=24, n_seqs=3, progress=False)
    through = sinkscope.measure("sinks", wrapped, **options).table  # its own tokenizer
    direct = sinkscope.measure("sinks", bare, tokenizer, **options).table
    pd.testing.assert_frame_equal(through, direct)
    assert not bare.training  # eval for the run ... and left as it came: from_pretrained gives eval


def test_weights_not_loaded_yet_are_one_sentence(tiny_llama_dir):
    wrapped, bare, _ = _language_model(tiny_llama_dir)
    with torch.device("meta"):
        vars(wrapped)["_module"] = type(bare)(bare.config)
    with pytest.raises(SinkscopeError, match="not loaded yet"):
        sinkscope.measure("sinks", wrapped, texts=TEXTS, seq_len=24, n_seqs=2, progress=False)


def test_trace_reads_the_wrapped_model(tiny_llama_dir):
    wrapped, bare, tokenizer = _language_model(tiny_llama_dir)
    ids = torch.arange(3, 19).unsqueeze(0)  # (1, 16)
    through = sinkscope.trace(wrapped, ids, names=["blocks.1.attn.hook_pattern"])
    direct = sinkscope.trace(bare, ids, names=["blocks.1.attn.hook_pattern"])
    assert torch.equal(through["blocks.1.attn.hook_pattern"], direct["blocks.1.attn.hook_pattern"])
