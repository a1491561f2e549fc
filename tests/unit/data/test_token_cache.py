"""Token ids cached by content (data/token_cache.py): the same text and tokenizer read their ids back, an
edited text or another tokenizer tokenises again, and a damaged entry is ignored, never trusted."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SAMPLE_TEXT, make_tokenizer
from sinkscope.data import token_cache
from sinkscope.data.corpus import tokenize_documents

TEXT = SAMPLE_TEXT * (token_cache.MIN_CHARS // len(SAMPLE_TEXT) + 2)


@pytest.fixture
def counted(monkeypatch, tmp_path):
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    calls = []
    real = token_cache.cached_ids

    def spy(tokenizer, text, tokenize, vocab_size):
        return real(tokenizer, text, lambda t: calls.append(len(t)) or tokenize(t), vocab_size)

    monkeypatch.setattr("sinkscope.data.corpus.cached_ids", spy)
    return calls


def test_the_second_read_of_a_text_is_the_cache_and_gives_the_same_ids(counted, tmp_path):
    tokenizer = make_tokenizer()
    first = tokenize_documents(tokenizer, [TEXT])[0]
    again = tokenize_documents(tokenizer, [TEXT])[0]
    assert np.array_equal(first, again) and len(counted) == 1
    assert np.array_equal(first, tokenizer(TEXT, add_special_tokens=False).input_ids)
    tokenize_documents(tokenizer, [TEXT + " more"])  # another text
    tokenize_documents(make_tokenizer(add_bos=True), [TEXT])  # another tokenizer (its post-processor)
    assert len(counted) == 3


def test_a_damaged_or_out_of_range_entry_is_ignored_and_rewritten(counted, tmp_path):
    tokenizer = make_tokenizer()
    ids = tokenize_documents(tokenizer, [TEXT])[0]
    entry, = (tmp_path / "cache" / "tokens").rglob("*.npy")
    entry.write_bytes(b"not an npy file")
    assert np.array_equal(tokenize_documents(tokenizer, [TEXT])[0], ids) and len(counted) == 2
    np.save(entry, np.full(3, 10 ** 6, dtype=np.int64))  # ids the vocabulary does not have
    assert np.array_equal(tokenize_documents(tokenizer, [TEXT])[0], ids) and len(counted) == 3


def test_short_texts_and_the_switch_skip_the_cache(counted, tmp_path, monkeypatch):
    tokenizer = make_tokenizer()
    tokenize_documents(tokenizer, [SAMPLE_TEXT])
    monkeypatch.setenv("SINKSCOPE_TOKEN_CACHE", "off")
    tokenize_documents(tokenizer, [TEXT])
    assert not (tmp_path / "cache" / "tokens").exists()
