"""Tests for sinkscope.data.corpus: windowing, BOS policy, corpus sources (no network)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from sinkscope.data import fetch as corpus_fetch
from sinkscope.data.corpus import (
    BOS_POLICIES,
    Corpus,
    bundled_corpus,
    dataset_corpus,
    load_corpus,
    make_windows,
    resolve_bos,
    text_file_corpus,
    tokenize_documents,
    tokenizer_adds_bos,
)
from sinkscope.errors import SinkscopeError

SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune,",
    "must be in want of a wife.",
    "However little known the feelings or views of such a man may be on his first entering a neighbourhood,",
    "this truth is so well fixed in the minds of the surrounding families.",
]


def assert_one_sentence(message: str) -> None:
    """A user-facing error: one line, one sentence, ending with a full stop."""
    assert message
    assert "\n" not in message, message
    assert message.rstrip().endswith("."), message
    assert re.search(r"[.!?]\s+[A-Z]", message) is None, message


@pytest.fixture(autouse=True)
def _isolated_corpus_env(monkeypatch, tmp_path):
    """Never look at the real ~/.cache/sinkscope corpus, never touch the hub."""
    monkeypatch.delenv("SINKSCOPE_CORPUS_DIR", raising=False)
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "sinkscope-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# ---- tiny real tokenizers -----------------------------------------------------------------------


def tiny_tokenizer(*, post_bos: bool, bos: bool = True) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer trained on a few sentences.

    ``post_bos``: a TemplateProcessing post-processor prepends ``<s>`` (like Llama).
    ``bos``: whether the transformers wrapper declares ``<s>`` as its BOS token.
    """
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"]))
    if post_bos:
        bos_id = tok.token_to_id("<s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
    special = dict(bos_token="<s>", eos_token="</s>") if bos else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", **special)


# ---- make_windows -------------------------------------------------------------------------------


def ranged_docs(lengths: list[int]) -> list[np.ndarray]:
    """Document d holds the ids d*10000 + 0 .. d*10000 + len-1, so every id names its doc and offset."""
    return [np.arange(d * 10000, d * 10000 + n, dtype=np.int64) for d, n in enumerate(lengths)]


def check_windows_against_docs(windows, docs, seq_len, bos_id):
    body = seq_len - (1 if bos_id is not None else 0)
    tokens = windows.tokens
    assert len(windows.starts) == tokens.shape[0]
    for row, (d, start) in zip(tokens, windows.starts):
        chunk = row[1:] if bos_id is not None else row
        assert len(chunk) == body
        # never crosses a document boundary: every id of the chunk belongs to document d
        assert set((chunk // 10000).tolist()) == {d}
        # the chunk is the contiguous slice of the document at a multiple of the body length
        assert start % body == 0
        assert start + body <= len(docs[d])
        np.testing.assert_array_equal(chunk, docs[d][start:start + body])
        if bos_id is not None:
            assert row[0] == bos_id


@pytest.mark.parametrize("bos_id", [None, 7])
def test_make_windows_shape_dtype_and_provenance(bos_id):
    docs = ranged_docs([1000, 333, 10, 2000])
    windows = make_windows(docs, seq_len=32, n_seqs=40, seed=0, bos_id=bos_id)
    assert windows.tokens.shape == (40, 32)
    assert windows.tokens.dtype == np.int64
    assert windows.bos_id == bos_id
    assert windows.n_corpus_tokens == 1000 + 333 + 10 + 2000
    check_windows_against_docs(windows, docs, 32, bos_id)


def test_make_windows_is_deterministic_per_seed():
    docs = ranged_docs([5000, 3000])
    a = make_windows(docs, seq_len=16, n_seqs=20, seed=1234, bos_id=None)
    b = make_windows(docs, seq_len=16, n_seqs=20, seed=1234, bos_id=None)
    c = make_windows(docs, seq_len=16, n_seqs=20, seed=1235, bos_id=None)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.starts == b.starts
    assert a.sha256 == b.sha256
    assert not np.array_equal(a.tokens, c.tokens)
    assert a.sha256 != c.sha256


def test_make_windows_chunks_do_not_overlap_and_are_in_corpus_order():
    docs = ranged_docs([400, 250, 90, 600])
    windows = make_windows(docs, seq_len=10, n_seqs=60, seed=3, bos_id=None)
    starts = windows.starts
    # corpus order: sorted by (document, offset), strictly (no chunk drawn twice)
    assert starts == sorted(starts)
    assert len(set(starts)) == len(starts)
    # non-overlapping: two chunks of the same document are at least one body apart
    for (d1, s1), (d2, s2) in zip(starts, starts[1:]):
        if d1 == d2:
            assert s2 - s1 >= 10
    # the token ids themselves never repeat (each id is unique in the corpus)
    flat = windows.tokens.ravel()
    assert len(np.unique(flat)) == flat.size
    # rows in corpus order: the first id of each row increases
    assert np.all(np.diff(windows.tokens[:, 0]) > 0)


@pytest.mark.parametrize("bos_id", [None, 0, 5])
def test_make_windows_takes_every_chunk_when_asked_for_all(bos_id):
    """All chunks are drawn: exactly the multiples of body, remainders and short docs dropped."""
    seq_len = 9
    body = seq_len - (1 if bos_id is not None else 0)
    lengths = [3 * body + 5, body - 1, 2 * body, body]
    docs = ranged_docs(lengths)
    n_chunks = 3 + 0 + 2 + 1
    windows = make_windows(docs, seq_len=seq_len, n_seqs=n_chunks, seed=0, bos_id=bos_id)
    expected = [(0, 0), (0, body), (0, 2 * body), (2, 0), (2, body), (3, 0)]
    assert windows.starts == expected
    check_windows_against_docs(windows, docs, seq_len, bos_id)
    with pytest.raises(SinkscopeError):
        make_windows(docs, seq_len=seq_len, n_seqs=n_chunks + 1, seed=0, bos_id=bos_id)


def test_make_windows_bos_zero_is_still_a_bos():
    """A BOS id of 0 (falsy) is prepended like any other id."""
    docs = ranged_docs([100])
    windows = make_windows(docs, seq_len=8, n_seqs=5, seed=0, bos_id=0)
    assert np.all(windows.tokens[:, 0] == 0)
    assert all(start % 7 == 0 for _, start in windows.starts)


def test_make_windows_with_bos_uses_a_shorter_body():
    docs = ranged_docs([700])
    windows = make_windows(docs, seq_len=8, n_seqs=100, seed=0, bos_id=99999)
    assert windows.tokens.shape == (100, 8)
    assert np.all(windows.tokens[:, 0] == 99999)
    assert [s for _, s in windows.starts] == [7 * k for k in range(100)]
    np.testing.assert_array_equal(windows.tokens[:, 1:].ravel(), docs[0][:700])


def test_make_windows_too_short_corpus_is_one_sentence_with_the_token_count():
    docs = ranged_docs([50, 27])
    with pytest.raises(SinkscopeError) as info:
        make_windows(docs, seq_len=16, n_seqs=10, seed=0, bos_id=None)
    message = str(info.value)
    assert_one_sentence(message)
    assert "77 tokens" in message
    assert "--n-seqs" in message


@pytest.mark.parametrize("seq_len", [1, 0, -3])
def test_make_windows_rejects_short_seq_len(seq_len):
    with pytest.raises(SinkscopeError) as info:
        make_windows(ranged_docs([100]), seq_len=seq_len, n_seqs=1, seed=0, bos_id=None)
    assert_one_sentence(str(info.value))
    assert "--seq-len" in str(info.value)


@pytest.mark.parametrize("n_seqs", [0, -1])
def test_make_windows_rejects_no_seqs(n_seqs):
    with pytest.raises(SinkscopeError) as info:
        make_windows(ranged_docs([100]), seq_len=4, n_seqs=n_seqs, seed=0, bos_id=None)
    assert_one_sentence(str(info.value))
    assert "--n-seqs" in str(info.value)


def test_make_windows_accepts_seq_len_two_with_bos():
    windows = make_windows(ranged_docs([5]), seq_len=2, n_seqs=5, seed=0, bos_id=1)
    np.testing.assert_array_equal(windows.tokens, [[1, k] for k in range(5)])


# ---- BOS policy with real tokenizers ------------------------------------------------------------


def test_tokenizer_with_bos_post_processor_adds_bos():
    tok = tiny_tokenizer(post_bos=True)
    bos = tok.convert_tokens_to_ids("<s>")
    assert tok.bos_token_id == bos
    assert tok("a truth").input_ids[0] == bos
    assert tokenizer_adds_bos(tok) is True
    assert resolve_bos("auto", tok) == bos
    assert resolve_bos("add", tok) == bos
    assert isinstance(resolve_bos("add", tok), int)
    assert resolve_bos("none", tok) is None


def test_tokenizer_without_post_processor_does_not_add_bos():
    tok = tiny_tokenizer(post_bos=False)
    bos = tok.convert_tokens_to_ids("<s>")
    assert tok.bos_token_id == bos
    assert bos not in tok("a truth").input_ids
    assert tokenizer_adds_bos(tok) is False
    assert resolve_bos("auto", tok) is None
    assert resolve_bos("add", tok) == bos
    assert resolve_bos("none", tok) is None


def test_tokenizer_without_bos_token():
    tok = tiny_tokenizer(post_bos=False, bos=False)
    assert tok.bos_token_id is None
    assert tokenizer_adds_bos(tok) is False
    assert resolve_bos("auto", tok) is None
    assert resolve_bos("none", tok) is None
    with pytest.raises(SinkscopeError) as info:
        resolve_bos("add", tok)
    assert_one_sentence(str(info.value))
    assert "BOS" in str(info.value)


@pytest.mark.parametrize("policy", ["always", "", "AUTO", "yes"])
def test_unknown_bos_policy(policy):
    with pytest.raises(SinkscopeError) as info:
        resolve_bos(policy, tiny_tokenizer(post_bos=True))
    message = str(info.value)
    assert_one_sentence(message)
    for known in BOS_POLICIES:
        assert known in message


def test_tokenize_documents_never_adds_special_tokens():
    tok = tiny_tokenizer(post_bos=True)
    ids = tokenize_documents(tok, SENTENCES[:2])
    assert len(ids) == 2
    for text, arr in zip(SENTENCES[:2], ids):
        assert arr.dtype == np.int64
        assert tok.bos_token_id not in arr.tolist()
        assert arr.tolist() == tok(text, add_special_tokens=False).input_ids


def test_tokenize_then_window_end_to_end():
    tok = tiny_tokenizer(post_bos=True)
    bos = resolve_bos("auto", tok)
    docs = tokenize_documents(tok, SENTENCES * 10)
    windows = make_windows(docs, seq_len=6, n_seqs=12, seed=0, bos_id=bos)
    assert windows.tokens.shape == (12, 6)
    assert np.all(windows.tokens[:, 0] == bos)
    assert not np.any(windows.tokens[:, 1:] == bos)


# ---- text files -----------------------------------------------------------------------------------


def test_text_file_missing(tmp_path):
    path = tmp_path / "missing.txt"
    with pytest.raises(SinkscopeError) as info:
        text_file_corpus(str(path))
    assert_one_sentence(str(info.value))
    assert str(path) in str(info.value)


def test_text_file_is_a_directory(tmp_path):
    with pytest.raises(SinkscopeError) as info:
        text_file_corpus(str(tmp_path))
    assert_one_sentence(str(info.value))


@pytest.mark.parametrize("content", ["", "   \n\t\n"])
def test_text_file_empty(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SinkscopeError) as info:
        text_file_corpus(str(path))
    assert_one_sentence(str(info.value))
    assert "empty" in str(info.value)


def test_text_file_not_utf8(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\u00e9 au lait\n".encode("latin-1") + b"\xff\xfe")
    with pytest.raises(SinkscopeError) as info:
        text_file_corpus(str(path))
    message = str(info.value)
    assert_one_sentence(message)
    assert "UTF-8" in message
    assert "byte 3" in message


def test_text_file_good(tmp_path):
    text = "It is a truth universally acknowledged.\nCaf\u00e9 \u00a320,000.\n"
    path = tmp_path / "novel.txt"
    path.write_text(text, encoding="utf-8")
    corpus = text_file_corpus(str(path))
    assert isinstance(corpus, Corpus)
    assert corpus.name == "novel.txt"
    assert corpus.documents == [text]
    assert corpus.info == {"kind": "text_file", "path": str(path), "abs_path": str(path.resolve())}


def test_corpus_sha256_is_stable_and_content_sensitive(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one two three", encoding="utf-8")
    first = text_file_corpus(str(path)).sha256
    assert first == text_file_corpus(str(path)).sha256
    assert re.fullmatch(r"[0-9a-f]{64}", first)
    # the name and info are not part of the hash; the documents are
    assert Corpus("other", ["one two three"], {"x": 1}).sha256 == first
    path.write_text("one two three!", encoding="utf-8")
    assert text_file_corpus(str(path)).sha256 != first
    # document boundaries and order matter
    assert Corpus("c", ["ab", "c"]).sha256 != Corpus("c", ["a", "bc"]).sha256
    assert Corpus("c", ["a", "b"]).sha256 != Corpus("c", ["b", "a"]).sha256


# ---- the bundled corpus ---------------------------------------------------------------------------


def fake_austen(dest: Path) -> dict[str, str]:
    """A complete (fake) corpus written by corpus_fetch.write_corpus, names given out of order."""
    texts = {name: f"The text of {name}.\n" * (i + 1) for i, name in enumerate(corpus_fetch.AUSTEN_NAMES)}
    reversed_texts = dict(reversed(list(texts.items())))
    corpus_fetch.write_corpus(dest, reversed_texts, "1.0.0-1", "0" * 64)
    return texts


def test_bundled_corpus_missing_says_how_to_fetch(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("SINKSCOPE_CORPUS_DIR", str(empty))
    with pytest.raises(SinkscopeError) as info:
        bundled_corpus()
    message = str(info.value)
    assert_one_sentence(message)
    assert "python -m sinkscope.data.fetch" in message
    assert str(empty) in message


def test_bundled_corpus_incomplete_is_missing(tmp_path, monkeypatch):
    dest = tmp_path / "austen"
    fake_austen(dest)
    (dest / "SOURCE.json").unlink()
    monkeypatch.setenv("SINKSCOPE_CORPUS_DIR", str(dest))
    with pytest.raises(SinkscopeError, match="python -m sinkscope.data.fetch"):
        bundled_corpus()


def test_bundled_corpus_reads_six_documents_in_sorted_file_order(tmp_path, monkeypatch):
    dest = tmp_path / "austen"
    texts = fake_austen(dest)
    monkeypatch.setenv("SINKSCOPE_CORPUS_DIR", str(dest))
    corpus = bundled_corpus()
    assert corpus.name == "austen"
    names = sorted(corpus_fetch.AUSTEN_NAMES)
    assert len(corpus.documents) == 6
    assert corpus.info["files"] == [corpus_fetch.austen_filename(n) for n in names]
    assert corpus.documents == [texts[n] for n in names]
    assert corpus.info["kind"] == "bundled"
    assert corpus.info["path"] == str(dest)
    assert corpus.sha256 == bundled_corpus().sha256


def test_bundled_corpus_default_location_is_under_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    texts = fake_austen(tmp_path / "cache" / "corpus" / "austen")
    corpus = load_corpus()
    assert corpus.documents == [texts[n] for n in sorted(corpus_fetch.AUSTEN_NAMES)]


# ---- load_corpus / datasets -------------------------------------------------------------------------


def test_load_corpus_both_sources_is_an_error(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("hello", encoding="utf-8")
    with pytest.raises(SinkscopeError) as info:
        load_corpus(text_file=str(path), dataset="wikitext:wikitext-2-raw-v1")
    message = str(info.value)
    assert_one_sentence(message)
    assert "--text-file" in message and "--dataset" in message


def test_load_corpus_text_file(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("hello there", encoding="utf-8")
    corpus = load_corpus(text_file=str(path))
    assert corpus.documents == ["hello there"]


def test_dataset_corpus_without_the_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(SinkscopeError) as info:
        dataset_corpus("wikitext:wikitext-2-raw-v1:test")
    assert_one_sentence(str(info.value))
    assert "datasets" in str(info.value)


def test_random_inputs_are_uniform_over_the_ordinary_ids_with_the_seed():
    from sinkscope.data.corpus import synthetic_windows

    windows, record = synthetic_windows("random", 50, {0, 1, 2}, seq_len=400, n_seqs=30, seed=5, bos_id=1)
    tokens = windows.tokens
    assert tokens.shape == (30, 400) and (tokens[:, 0] == 1).all()  # BOS first
    body = tokens[:, 1:]
    assert body.min() >= 3 and body.max() <= 49  # no special id inside a window
    counts = np.bincount(body.ravel(), minlength=50)[3:]  # 47 ids, 11,970 draws: about 255 each
    expected = body.size / 47
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 90  # 46 degrees of freedom: p < 1e-4 above this
    again, _ = synthetic_windows("random", 50, {0, 1, 2}, seq_len=400, n_seqs=30, seed=5, bos_id=1)
    other, _ = synthetic_windows("random", 50, {0, 1, 2}, seq_len=400, n_seqs=30, seed=6, bos_id=1)
    assert (again.tokens == tokens).all() and (other.tokens != tokens).any()
    expected_body = np.arange(3, 50)[np.random.default_rng(5).integers(0, 47, size=(30, 399))]
    assert (body == expected_body).all()  # the rule the manifest states
    assert record["kind"] == "random" and record["excluded_ids"] == [0, 1, 2] and record["bos_first"]


def test_repeated_inputs_repeat_one_id_per_window():
    from sinkscope.data.corpus import synthetic_windows

    windows, record = synthetic_windows("repeated", 50, {0}, seq_len=64, n_seqs=6, seed=2, bos_id=None)
    tokens = windows.tokens
    assert tokens.shape == (6, 64)
    assert (tokens == tokens[:, :1]).all()  # every position is the window's one id
    assert record["token_ids"] == tokens[:, 0].tolist() and 0 not in record["token_ids"]
    assert not record["bos_first"]


def test_the_bos_policies_live_in_a_module_that_imports_nothing():
    """The command line checks --bos before numpy or torch load: data/bos.py imports nothing."""
    import ast

    import sinkscope.data.bos as bos

    assert bos.BOS_POLICIES == ("auto", "add", "none")
    tree = ast.parse(Path(bos.__file__).read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
