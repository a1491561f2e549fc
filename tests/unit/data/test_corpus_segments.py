"""A long document is tokenised in segments, only as far as its windows need (issue 60, SPEC.md
"Windows of a long text"): the cut rule, the ids against the whole text's, and what is read.

The segment sizes are shrunk (monkeypatched) so that a few kilobytes make many segments.
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from conftest import SAMPLE_TEXT, make_tokenizer
from sinkscope.data import corpus
from sinkscope.data.corpus import (
    Corpus,
    FileText,
    SegmentedIds,
    make_windows,
    segments,
    text_file_corpus,
    text_window,
    tokenize_documents,
)
from sinkscope.errors import SinkscopeError
from sinkscope.runtime import memory

#: paragraphs, line breaks and runs of spaces, so cuts meet every kind of whitespace.
TEXT = ("\n\n".join(SAMPLE_TEXT for _ in range(3)) + "  \n") * 30


@pytest.fixture(autouse=True)
def small_segments(monkeypatch):
    monkeypatch.setattr(corpus, "SEGMENT_CHARS", 500)
    monkeypatch.setattr(corpus, "SEARCH_CHARS", 50)
    monkeypatch.setattr(corpus, "READ_CHARS", 128)


def sentencepiece_like() -> PreTrainedTokenizerFast:
    """Llama's legacy scheme: a '▁' prepended to the text and spaces as '▁' (what a segment start would add)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.train_from_iterator(SAMPLE_TEXT.split(". "), trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


TOKENIZERS = {"byte-level BPE": make_tokenizer, "sentencepiece-like": sentencepiece_like}


class Counting:
    """A tokenizer that counts the characters it is asked to tokenise."""

    def __init__(self, tokenizer):
        self.tokenizer, self.chars = tokenizer, 0

    def __call__(self, text, **kwargs):
        self.chars += len(text)
        return self.tokenizer(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def whole_ids(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text, add_special_tokens=False).input_ids, dtype=np.int64)


# ---- the cut rule ------------------------------------------------------------------------------------------


def test_segments_cut_before_a_space_after_a_word_whatever_the_pieces():
    cut = list(segments([TEXT]))
    assert "".join(cut) == TEXT and len(cut) > 10
    for before, after in zip(cut, cut[1:]):
        assert 500 <= len(before) < 550
        assert not before[-1].isspace() and after[0].isspace()
    for size in (1, 7, 128, 499, 501):
        assert list(segments(TEXT[i:i + size] for i in range(0, len(TEXT), size))) == cut


def test_a_text_without_a_break_is_cut_at_the_segment_size():
    assert [len(s) for s in segments(["x" * 1234])] == [500, 500, 234]


def test_a_document_of_one_segment_is_tokenised_whole_as_before():
    tokenizer = make_tokenizer()
    short = TEXT[:500]
    [ids] = tokenize_documents(tokenizer, [short])
    assert isinstance(ids, np.ndarray)
    np.testing.assert_array_equal(ids, whole_ids(tokenizer, short))


# ---- the ids ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_a_long_document_in_segments_has_the_whole_texts_ids(kind):
    """Each segment is tokenised after the end of the one before: a sentencepiece-like tokenizer's
    start-of-text '▁' does not appear at every segment (tokenised alone, the segments give other ids)."""
    tokenizer = TOKENIZERS[kind]()
    [ids] = tokenize_documents(tokenizer, [TEXT])
    assert isinstance(ids, SegmentedIds)
    whole = whole_ids(tokenizer, TEXT)
    assert len(ids) == len(whole)
    np.testing.assert_array_equal(ids.prefix(None), whole)
    np.testing.assert_array_equal(ids.prefix(100), whole[:100])
    if kind == "sentencepiece-like":
        alone = np.concatenate([whole_ids(tokenizer, s) for s in segments([TEXT])])
        assert len(alone) != len(whole)


@pytest.mark.parametrize("bos_id", [None, 0])
def test_windows_of_a_long_document_are_the_whole_texts_windows(bos_id):
    tokenizer = make_tokenizer()
    doc_ids = tokenize_documents(tokenizer, [TEXT[:3000], TEXT])
    whole = [whole_ids(tokenizer, TEXT[:3000]), whole_ids(tokenizer, TEXT)]
    got = make_windows(doc_ids, seq_len=40, n_seqs=30, seed=3, bos_id=bos_id)
    want = make_windows(whole, seq_len=40, n_seqs=30, seed=3, bos_id=bos_id)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert got.starts == want.starts and got.n_corpus_tokens == want.n_corpus_tokens
    one = text_window(tokenize_documents(tokenizer, [TEXT]), seq_len=64, bos_id=bos_id)
    np.testing.assert_array_equal(one.tokens, text_window([whole[1]], seq_len=64, bos_id=bos_id).tokens)


def test_the_first_window_reads_only_the_first_segment():
    """``explore``: the text's first tokens, not the text."""
    tokenizer = Counting(make_tokenizer())
    window = text_window(tokenize_documents(tokenizer, [TEXT * 10]), seq_len=64, bos_id=None)
    assert window.tokens.shape == (1, 64)
    assert tokenizer.chars <= 550 < len(TEXT * 10) / 100


def test_drawn_windows_tokenise_the_text_once_and_their_segments_again():
    tokenizer = Counting(make_tokenizer())
    text = TEXT * 4
    n_segments = len(list(segments([text])))
    doc_ids = tokenize_documents(tokenizer, [text])
    make_windows(doc_ids, seq_len=32, n_seqs=2, seed=0, bos_id=None)
    context = corpus.CONTEXT_CHARS * 2 * n_segments  # each segment's context, tokenised alone and before it
    assert tokenizer.chars <= len(text) + 4 * 550 + context


# ---- a text file larger than a segment ----------------------------------------------------------------


def test_a_large_text_file_stays_on_disk_with_the_same_text_and_hash(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(TEXT.replace("\n", "\r\n").encode("utf-8"))  # read_text turns CRLF into LF
    loaded = text_file_corpus(str(path))
    assert isinstance(loaded.documents, FileText) and len(loaded.documents) == 1
    text = path.read_text(encoding="utf-8")
    assert "".join(loaded.documents.pieces()) == text == loaded.documents[0] == list(loaded.documents)[0]
    assert loaded.sha256 == Corpus("x", [text]).sha256
    assert loaded.describe() == f"'{path.resolve()}' (1 document)"  # a text file by its full path (issue 60)
    tokenizer = make_tokenizer()
    [ids] = tokenize_documents(tokenizer, loaded.documents)
    np.testing.assert_array_equal(ids.prefix(None), whole_ids(tokenizer, text))


def test_a_large_file_that_is_not_utf8_names_the_byte(tmp_path):
    data = TEXT.encode("utf-8")
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_bytes(data[:300] + b"\xff")
    large.write_bytes(data[:300] + data + b"caf\xc3" + b"\xff" + data)
    with pytest.raises(SinkscopeError) as error:
        text_file_corpus(str(large))
    assert str(error.value) == f"{large} is not UTF-8 text (invalid continuation byte at byte {300 + len(data) + 3})."
    with pytest.raises(SinkscopeError, match="at byte 300"):
        text_file_corpus(str(small))
    large.write_bytes(data + b"\xe2\x82")  # a character cut short at the end
    with pytest.raises(SinkscopeError, match=f"unexpected end of data at byte {len(data)}"):
        text_file_corpus(str(large))


def test_a_large_blank_file_is_empty(tmp_path):
    path = tmp_path / "blank.txt"
    path.write_text(" \n" * 2000, encoding="utf-8")
    with pytest.raises(SinkscopeError, match="is empty"):
        text_file_corpus(str(path))


# ---- the memory a window draw may use ------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_a_memory_cgroup_limit_bounds_the_room(tmp_path, version):
    groups = tmp_path / "cgroup"
    if version == 2:
        groups.write_text("0::/job\n")
        folder = tmp_path / "fs" / "job"
        files = {"memory.max": "4000000000", "memory.current": "1500000000", "memory.stat": "inactive_file 500000000\n"}
    else:
        groups.write_text("4:memory:/job\n0::/\n")
        folder = tmp_path / "fs" / "memory" / "job"
        files = {"memory.limit_in_bytes": "4000000000", "memory.usage_in_bytes": "1500000000",
                 "memory.stat": "cache 9\ntotal_inactive_file 500000000\n"}
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    assert memory._cgroup_room(str(groups), str(tmp_path / "fs")) == 3_000_000_000
    (folder / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(
        "max" if version == 2 else str(2**63 - 4096))
    assert memory._cgroup_room(str(groups), str(tmp_path / "fs")) is None


def test_the_least_room_counts(monkeypatch):
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 8_000_000_000)
    monkeypatch.setattr(memory, "_cgroup_room", lambda: 3_000_000_000)
    monkeypatch.setattr(memory, "_address_space_room", lambda: None)
    assert memory.ram_available() == 3_000_000_000
    monkeypatch.setattr(memory, "_cgroup_room", lambda: None)
    monkeypatch.setattr(memory, "_meminfo_available", lambda: None)
    assert memory.ram_available() is None
