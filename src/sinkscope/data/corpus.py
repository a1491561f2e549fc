"""Text corpora and the deterministic token windows every run evaluates.

Sources: the bundled default (six Jane Austen novels, fetched at set-up from the Debian package
``r-cran-janeaustenr`` by ``python -m sinkscope.data.fetch``), a UTF-8 text file
(``--text-file``), or a ``datasets`` dataset (``--dataset NAME[:CONFIG][:SPLIT]``, when the
``datasets`` package and the data are available locally).

Windowing (documented in docs/getting-started.md, "Corpus and windows", and recorded in the manifest):

1. Each document (a novel, the text file, one dataset row) is tokenised on its own with no
   special tokens. A document longer than :data:`SEGMENT_CHARS` characters is tokenised in
   segments (SPEC.md "Windows of a long text"): its tokens are the segments' in order, and only the
   segments the windows need are held, so a large text costs little more than its windows.
2. Every document is cut into non-overlapping chunks of ``body = seq_len - 1`` tokens if a BOS
   token is prepended, else ``seq_len``, starting at its first token; the remainder is dropped.
   Windows never cross a document boundary.
3. ``n_seqs`` chunks are drawn without replacement from all chunks of all documents by
   ``numpy.random.default_rng(seed)`` and put back in corpus order.
4. With the BOS policy ``add`` each window is ``[bos] + chunk``. ``auto`` adds BOS exactly when
   the tokenizer adds one to plain text by default (Llama yes; SmolLM2 and GPT-2 no).

The result is an int64 array of shape (n_seqs, seq_len), saved as ``tokens.npy`` with each run.
"""

from __future__ import annotations

import codecs
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from sinkscope.data.fetch import AUSTEN_NAMES, austen_filename, default_corpus_dir, is_complete_corpus
from sinkscope.data.bos import BOS_POLICIES
from sinkscope.data.token_cache import cached_ids
from sinkscope.errors import SinkscopeError, check_seed, option
from sinkscope.runtime.memory import ram_available



#: a document longer than this many characters is tokenised in segments of about this many (SPEC.md
#: "Windows of a long text"); the bundled novels (at most 883,279 bytes) are one segment each.
SEGMENT_CHARS = 1 << 20
#: a segment ends before the first whitespace that follows a non-space within this many characters past
#: SEGMENT_CHARS (a token boundary for every tokenizer we know), else at SEGMENT_CHARS exactly.
SEARCH_CHARS = 1 << 16
#: each segment is tokenised after this many characters of the one before (whose tokens are then dropped),
#: so that it starts as it does inside the text (no start-of-text prefix space).
CONTEXT_CHARS = 64
#: a text file is streamed in pieces of this many characters (validating, hashing, segmenting).
READ_CHARS = 1 << 20
_BREAK = re.compile(r"(?<=\S)\s", re.ASCII)



class FileText(Sequence):
    """A text file larger than one segment as a corpus's one document, left on disk.

    ``text[0]`` reads it whole (the trainer does); the windows read it through :meth:`pieces`, in
    :data:`READ_CHARS`-character pieces with the newline translation of ``Path.read_text``, so the
    pieces joined are exactly ``read_text(encoding="utf-8")``.
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(1))]
        if index not in (0, -1):
            raise IndexError("a text file is one document")
        return self.path.read_text(encoding="utf-8")

    def pieces(self) -> Iterator[str]:
        with open(self.path, encoding="utf-8") as handle:
            while piece := handle.read(READ_CHARS):
                yield piece

    def __reduce__(self):
        return FileText, (self.path,)


def _text_pieces(text: str) -> Callable[[], Iterator[str]]:
    return lambda: (text[i:i + READ_CHARS] for i in range(0, len(text), READ_CHARS))


def segments(pieces: Iterable[str]) -> Iterator[str]:
    """The text given in ``pieces`` cut into segments (SPEC.md "Windows of a long text").

    From the start of what is left, a segment runs to the first whitespace that follows a
    non-space at or past :data:`SEGMENT_CHARS` characters and before SEGMENT_CHARS +
    :data:`SEARCH_CHARS` (exclusive), else SEGMENT_CHARS characters; the last segment is what
    remains (at most SEGMENT_CHARS). The cuts depend on the text only, never on how it is split
    into pieces; a text of at most SEGMENT_CHARS characters is one segment.
    """
    buffer = ""
    for piece in pieces:
        buffer += piece
        while len(buffer) > SEGMENT_CHARS + SEARCH_CHARS:  # every cut sees its whole search range
            cut = _cut(buffer)
            yield buffer[:cut]
            buffer = buffer[cut:]
    while len(buffer) > SEGMENT_CHARS:
        cut = _cut(buffer)
        yield buffer[:cut]
        buffer = buffer[cut:]
    if buffer:
        yield buffer


def _cut(buffer: str) -> int:
    found = _BREAK.search(buffer, SEGMENT_CHARS, SEGMENT_CHARS + SEARCH_CHARS)
    return found.start() if found else SEGMENT_CHARS


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def segment_ids(tokenizer, segment: str, context: str) -> np.ndarray:
    """A segment's ids (int64) as they are inside the text: tokenised after ``context`` (the end of
    the segment before), whose own ids are then dropped; alone where they are not a prefix."""
    if context:
        head, both = _ids(tokenizer, context), _ids(tokenizer, context + segment)
        if both[:len(head)] == head:
            return np.asarray(both[len(head):], dtype=np.int64)
    return np.asarray(_ids(tokenizer, segment), dtype=np.int64)


class SegmentedIds:
    """The ids of a document longer than one segment, tokenised on demand, one segment at a time.

    Nothing holds the whole document's ids: :meth:`prefix` tokenises segments until it has enough;
    ``len()`` counts every segment's tokens once (and the unknown token's, for
    :func:`check_unknown_share`), keeping only the counts; :meth:`take` streams through the text
    again and tokenises only the segments that hold the windows asked for.
    """

    def __init__(self, tokenizer, pieces: Callable[[], Iterator[str]]):
        self.tokenizer = tokenizer
        self.pieces = pieces  # a fresh iterator over the document's text on each call
        self.counts: np.ndarray | None = None  # (n_segments,) tokens per segment, once counted
        self.unknown = 0  # unknown tokens in the whole document, once counted
        self.read = 0  # tokens of the segments :meth:`prefix` read

    def _segments(self) -> Iterator[tuple[str, str]]:
        """(segment, context) in order: the context is the last CONTEXT_CHARS characters before it."""
        context = ""
        for segment in segments(self.pieces()):
            yield segment, context
            context = segment[-CONTEXT_CHARS:]

    def _count(self) -> np.ndarray:
        if self.counts is None:
            unk = getattr(self.tokenizer, "unk_token_id", None)
            counts = []
            for segment, context in self._segments():
                ids = segment_ids(self.tokenizer, segment, context)
                counts.append(len(ids))
                if unk is not None:
                    self.unknown += int((ids == unk).sum())
            self.counts = np.asarray(counts, dtype=np.int64)
        return self.counts

    def __len__(self) -> int:
        return int(self._count().sum())

    def prefix(self, n: int | None) -> np.ndarray:
        """The document's first ``n`` ids (all of them for None), reading segments only until there are enough."""
        parts, have = [], 0
        for segment, context in self._segments():
            if n is not None and have >= n:
                break
            parts.append(segment_ids(self.tokenizer, segment, context))
            have += len(parts[-1])
        self.read = have
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return ids if n is None else ids[:n]

    def take(self, starts: Sequence[int], length: int) -> list[np.ndarray]:
        """``ids[s:s + length]`` for each s of ``starts`` (ascending), in one pass over the text."""
        ends = np.cumsum(self._count())  # (n_segments,) exclusive end of each segment's ids
        out = [np.zeros(0, np.int64)] * len(starts)
        wanted = [(i, s) for i, s in enumerate(starts)]
        begin = 0
        for k, (segment, context) in enumerate(self._segments()):
            end = int(ends[k])
            overlapping = [(i, s) for i, s in wanted if s < end and s + length > begin]
            if overlapping:
                ids = segment_ids(self.tokenizer, segment, context)
                for i, s in overlapping:
                    out[i] = np.concatenate([out[i], ids[max(0, s - begin):max(0, s + length - begin)]])
            wanted = [(i, s) for i, s in wanted if s + length > end]
            begin = end
            if not wanted:
                break
        return out


@dataclass
class Corpus:
    """Documents plus a description of where they came from.

    Attributes:
        name: short name (``austen``, the file name, the dataset name).
        documents: the texts, in corpus order (a text file larger than a segment: a :class:`FileText`,
            read in pieces).
        info: provenance recorded in the manifest (paths as the user gave them, hashes).
    """

    name: str
    documents: Sequence[str]
    info: dict = field(default_factory=dict)

    def describe(self) -> str:
        """``'austen' (6 documents)``, for progress messages; a text file by its full path."""
        n = len(self.documents)
        path = self.info.get("abs_path") if isinstance(self.info, dict) else None
        return f"{str(path) if path else self.name!r} ({n} document{'' if n == 1 else 's'})"

    @property
    def sha256(self) -> str:
        """Hash of the documents in order (what the manifest calls the corpus hash)."""
        digest = hashlib.sha256()
        if isinstance(self.documents, FileText):  # the same hash as the text read whole, streamed
            inner = hashlib.sha256()
            for piece in self.documents.pieces():
                inner.update(piece.encode("utf-8"))
            digest.update(inner.digest())
            return digest.hexdigest()
        for text in self.documents:
            digest.update(hashlib.sha256(text.encode("utf-8")).digest())
        return digest.hexdigest()


def bundled_corpus() -> Corpus:
    """The default Austen corpus, or a sentence saying how to fetch it."""
    folder = default_corpus_dir()
    if not is_complete_corpus(folder):
        raise SinkscopeError(
            f"the bundled corpus is not in {folder}; run `python -m sinkscope.data.fetch` "
            f"(or `make demo`), or pass {option('text_file')} PATH."
        )
    files = [folder / austen_filename(name) for name in sorted(AUSTEN_NAMES)]
    return Corpus("austen", [f.read_text(encoding="utf-8") for f in files],
                  {"kind": "bundled", "path": str(folder), "files": [f.name for f in files],
                   "source": "Debian package r-cran-janeaustenr (texts public domain)"})


def text_file_corpus(path: str) -> Corpus:
    """One UTF-8 text file as a single document (one larger than a segment stays on disk: :class:`FileText`)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise SinkscopeError(f"no text file at {path}.")
    info = {"kind": "text_file", "path": path, "abs_path": str(file.resolve())}
    if file.stat().st_size > SEGMENT_CHARS:
        _check_utf8_text(file, path)
        return Corpus(file.name, FileText(file), info)
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise SinkscopeError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}).") from error
    if not text.strip():
        raise SinkscopeError(f"the text file {path} is empty.")
    return Corpus(file.name, [text], info)


def _check_utf8_text(file: Path, path: str) -> None:
    """What ``text_file_corpus`` checks of a small file, streamed: UTF-8 throughout and not blank."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, blank = 0, True
    with open(file, "rb") as handle:
        while True:
            block = handle.read(READ_CHARS)
            pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as error:
                raise SinkscopeError(f"{path} is not UTF-8 text ({error.reason} at byte "
                                     f"{offset - pending + error.start}).") from error
            blank = blank and not text.strip()
            offset += len(block)
            if not block:
                break
    if blank:
        raise SinkscopeError(f"the text file {path} is empty.")


def dataset_corpus(spec: str, text_column: str = "text") -> Corpus:
    """``NAME[:CONFIG][:SPLIT]`` through the ``datasets`` library (local cache or online)."""
    try:
        import datasets  # type: ignore
    except ImportError as error:
        raise SinkscopeError(f"{option('dataset')} needs the datasets package; pip install datasets.") from error
    name, config, split = (spec.split(":") + [None, None])[:3]
    try:
        data = datasets.load_dataset(name, config or None, split=split or "train")
    except Exception as error:  # noqa: BLE001 - any loading failure becomes one sentence
        raise SinkscopeError(f"the dataset {spec!r} is not available ({str(error).splitlines()[0][:200]}).") from error
    if text_column not in data.column_names:
        raise SinkscopeError(f"the dataset {spec!r} has no {text_column!r} column; it has {data.column_names}.")
    docs = [t for t in data[text_column] if t and t.strip()]
    return Corpus(name, docs, {"kind": "dataset", "spec": spec, "column": text_column})


def load_corpus(text_file: str | None = None, dataset: str | None = None) -> Corpus:
    """The corpus chosen by the options (bundled default when neither is given)."""
    if text_file and dataset:
        raise SinkscopeError(f"pass either {option('text_file')} or {option('dataset')}, not both.")
    if text_file:
        return text_file_corpus(text_file)
    if dataset:
        return dataset_corpus(dataset)
    return bundled_corpus()


def tokenizer_adds_bos(tokenizer) -> bool:
    """Whether the tokenizer prepends its BOS token to plain text by default."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    ids = tokenizer("a").input_ids
    return bool(ids) and ids[0] == bos


def resolve_bos(policy: str, tokenizer) -> int | None:
    """The BOS id to prepend to each window, or None, under ``policy``."""
    if policy not in BOS_POLICIES:
        raise SinkscopeError(f"unknown BOS policy {policy!r}; use one of {', '.join(BOS_POLICIES)}.")
    bos = getattr(tokenizer, "bos_token_id", None)
    if policy == "none":
        return None
    if policy == "add":
        if bos is None:
            raise SinkscopeError(f"{option('bos')} add was asked for but the tokenizer has no BOS token; use {option('bos')} none.")
        return int(bos)
    return int(bos) if tokenizer_adds_bos(tokenizer) else None


def tokenize_documents(tokenizer, documents: Sequence[str]) -> list[np.ndarray | SegmentedIds]:
    """Each document's token ids (no special tokens), int64.

    A document longer than :data:`SEGMENT_CHARS` (and a :class:`FileText`) gives a
    :class:`SegmentedIds`, tokenised only as far as the windows need (``text_window``,
    ``make_windows``); a shorter one is tokenised whole, as it always was.
    """
    if isinstance(documents, FileText):
        return [SegmentedIds(tokenizer, documents.pieces)]
    out: list[np.ndarray | SegmentedIds] = []
    for text in documents:
        if len(text) > SEGMENT_CHARS:
            out.append(SegmentedIds(tokenizer, _text_pieces(text)))
        else:  # read back when this text and tokenizer were seen before (data/token_cache.py)
            out.append(cached_ids(tokenizer, text, lambda t: _ids(tokenizer, t), _vocab_size(tokenizer)))
    return out


def _vocab_size(tokenizer) -> int | None:
    try:
        return len(tokenizer)
    except TypeError:
        return None


#: above this share of unknown tokens a text is refused; above UNKNOWN_WARN a warning is logged.
UNKNOWN_REFUSE, UNKNOWN_WARN = 0.5, 0.05


def check_unknown_share(doc_ids: list[np.ndarray | SegmentedIds], tokenizer, model_label: str, log,
                        hint: str = "") -> None:
    """Refuse a text the tokenizer cannot read: most of its tokens are the unknown token.

    A tokenizer with a small word-level vocabulary (a trigger-task checkpoint's) maps every word it
    does not know to its unknown token, so an English text becomes one id repeated and every
    number measured on it is meaningless. More than ``UNKNOWN_REFUSE`` of the corpus's tokens
    unknown is one sentence; more than ``UNKNOWN_WARN`` a warning.
    """
    unk = getattr(tokenizer, "unk_token_id", None)
    total = sum(len(ids) for ids in doc_ids)
    if unk is None or total == 0:
        return
    share = sum(ids.unknown if isinstance(ids, SegmentedIds) else int((ids == unk).sum()) for ids in doc_ids) / total
    token = getattr(tokenizer, "unk_token", None)
    what = f"the tokenizer of {model_label} maps {share:.0%} of the text's {total:,} tokens to its unknown token " \
           f"{token!r} (id {unk})"
    if share > UNKNOWN_REFUSE:
        raise SinkscopeError(f"{what}, so the windows would be that one id over and over; the tokenizer does not "
                             f"cover this text{hint}.")
    if share > UNKNOWN_WARN:
        log(f"warning: {what}; the numbers measure a text with those words missing.")


@dataclass
class Windows:
    """The token windows of a run and how they were drawn."""

    tokens: np.ndarray  # (n_seqs, seq_len) int64
    bos_id: int | None
    starts: list[tuple[int, int]]  # (document index, token offset) of each window's body
    n_corpus_tokens: int

    @property
    def sha256(self) -> str:
        return hashlib.sha256(np.ascontiguousarray(self.tokens).tobytes()).hexdigest()


def check_token_range(tokens: np.ndarray, n_embeddings: int | None) -> None:
    """Every window id must index the model's embedding (a tokenizer of another model does not).

    Run before the forward pass: an id past the embedding is an ``IndexError`` on CPU and a
    device-side assert on a GPU. ``n_embeddings`` None (unknown) checks nothing.
    """
    if tokens.size and int(tokens.min()) < 0:
        raise SinkscopeError(f"the windows hold the negative token id {int(tokens.min())}; token ids start at 0.")
    if n_embeddings is None or tokens.size == 0:
        return
    largest = int(tokens.max())
    if largest >= n_embeddings:
        raise SinkscopeError(
            f"the tokenizer produced the token id {largest}, but the model's embedding has only {n_embeddings} rows "
            f"(ids 0 to {n_embeddings - 1}); the tokenizer does not belong to this model.")


#: ``sinks --inputs``: Gu et al.'s three inputs (ICLR 2025, Table 1).
INPUTS = ("text", "random", "repeated")


def synthetic_windows(kind: str, vocab_size: int, excluded: set[int], *, seq_len: int, n_seqs: int, seed: int,
                      bos_id: int | None) -> tuple[Windows, dict]:
    """Gu et al.'s ``random`` and ``repeated`` inputs (SPEC.md "Gu et al.'s inputs"): (windows, manifest record).

    The ids are drawn from the tokenizer's ids ``0 .. vocab_size - 1`` less ``excluded`` (its special
    tokens: no BOS or EOS inside a window) with ``numpy.random.default_rng(seed)``:

        random     every position of every window uniform over those ids
        repeated   one id per window, uniform over them, repeated over the window

    BOS comes first when ``bos_id`` is set (``--bos``), as for text windows.
    """
    check_seed(seed)
    need = 2 * 8 * int(n_seqs) * int(seq_len)  # the draw and the ids it picks, int64 each
    memory = ram_available()
    if memory is not None and need > memory:
        raise SinkscopeError(f"{n_seqs:,} windows of {seq_len:,} {kind} tokens take {need / 1e9:,.1f} GB to draw, more "
                             f"than the {memory / 1e9:,.1f} GB of memory available; lower {option('seq_len')} or "
                             f"{option('n_seqs')}.")
    allowed = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), np.fromiter(excluded, dtype=np.int64))
    if len(allowed) == 0:
        raise SinkscopeError("the tokenizer has no ordinary token to draw windows from.")
    body = seq_len - (1 if bos_id is not None else 0)
    rng = np.random.default_rng(seed)
    if kind == "random":
        rows = allowed[rng.integers(0, len(allowed), size=(n_seqs, body))]  # (n, body)
        record = {"kind": "random", "rule": "ids uniform over the tokenizer's ids less its special ones, "
                                            "numpy.random.default_rng(seed).integers"}
    elif kind == "repeated":
        chosen = allowed[rng.integers(0, len(allowed), size=n_seqs)]  # (n,) one id per window
        rows = np.repeat(chosen[:, None], body, axis=1)  # (n, body)
        record = {"kind": "repeated", "token_ids": [int(t) for t in chosen],
                  "rule": "one id per window, uniform over the tokenizer's ids less its special ones, repeated"}
    else:
        raise SinkscopeError(f"unknown {option('inputs')} {kind!r}; use {', '.join(INPUTS)}.")
    if bos_id is not None:
        rows = np.concatenate([np.full((n_seqs, 1), bos_id, dtype=np.int64), rows], axis=1)
    record.update(vocab_size=int(vocab_size), excluded_ids=sorted(int(i) for i in excluded), bos_first=bos_id is not None,
                  seed=int(seed))
    return Windows(np.ascontiguousarray(rows, dtype=np.int64), bos_id, [], 0), record


def text_window(doc_ids: list[np.ndarray | SegmentedIds], *, seq_len: int | None, bos_id: int | None) -> Windows:
    """One window: the documents' tokens in order (BOS first when ``bos_id`` is set), cut at ``seq_len``.

    ``sinkscope explore``'s window is the text itself; fewer than 2 tokens is one sentence. A
    document read in segments is read only as far as the window needs (its ``n_corpus_tokens``
    then counts the tokens of the segments read).
    """
    need = None if seq_len is None else max(0, seq_len - (1 if bos_id is not None else 0))
    parts, have = [], 0
    for ids in doc_ids:
        if need is not None and have >= need:
            break
        part = ids.prefix(None if need is None else need - have) if isinstance(ids, SegmentedIds) else \
            np.asarray(ids, dtype=np.int64)
        parts.append(part)
        have += len(part)
    counted = sum(ids.read if isinstance(ids, SegmentedIds) else len(ids) for ids in doc_ids)
    body = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    row = np.concatenate([np.asarray([bos_id], dtype=np.int64), body]) if bos_id is not None else body
    if seq_len is not None:
        row = row[:seq_len]
    if len(row) < 2:
        raise SinkscopeError(f"the text is {len(row)} token{'s' if len(row) != 1 else ''} long; the explorer needs at "
                             "least 2 (a query and a key): give a longer text.")
    return Windows(row[None, :].astype(np.int64), bos_id, [(0, 0)], int(counted))


def make_windows(doc_ids: list[np.ndarray | SegmentedIds], *, seq_len: int, n_seqs: int, seed: int,
                 bos_id: int | None) -> Windows:
    """Draw ``n_seqs`` windows of ``seq_len`` tokens (see the module docstring for the rule).

    The chunks are counted, not listed: document d has ``len_d // body`` of them, chunk c of all
    is the one numbered c in corpus order, so the draw is over ``sum_d len_d // body`` chunks.
    """
    check_seed(seed)
    if seq_len < 2:
        raise SinkscopeError(f"{option('seq_len')} must be at least 2 (got {seq_len}).")
    if n_seqs < 1:
        raise SinkscopeError(f"{option('n_seqs')} must be at least 1 (got {n_seqs}).")
    body = seq_len - (1 if bos_id is not None else 0)
    lengths = np.asarray([len(ids) for ids in doc_ids], dtype=np.int64)  # (D,)
    per_doc = lengths // body  # (D,) chunks of each document: starts 0, body, ... while a whole chunk fits
    n_chunks, total = int(per_doc.sum()), int(lengths.sum())
    if n_chunks < n_seqs:
        raise SinkscopeError(
            f"the corpus has {total} tokens, enough for {n_chunks} windows of {seq_len} tokens, "
            f"but {option('n_seqs')} {n_seqs} were asked for; lower {option('n_seqs')} or {option('seq_len')}, or use a longer text."
        )
    rng = np.random.default_rng(seed)
    picked = np.sort(rng.choice(n_chunks, size=n_seqs, replace=False))  # (n_seqs,) chunk numbers
    first = np.cumsum(per_doc) - per_doc  # (D,) number of each document's first chunk
    # (n_seqs,) the document of each chunk: the last whose first chunk is at or before it (never an empty one,
    # whose first chunk number is the next document's)
    docs = np.searchsorted(first, picked, side="right") - 1
    starts = [(int(d), int((c - first[d]) * body)) for d, c in zip(docs.tolist(), picked.tolist())]
    bodies: dict[int, np.ndarray] = {}
    for d in sorted(set(docs.tolist())):
        mine = [i for i, (dd, _) in enumerate(starts) if dd == d]
        ids = doc_ids[d]
        rows_d = ids.take([starts[i][1] for i in mine], body) if isinstance(ids, SegmentedIds) else \
            [ids[starts[i][1]:starts[i][1] + body] for i in mine]
        bodies.update(zip(mine, rows_d))
    rows = []
    for i in range(n_seqs):
        row = np.asarray(bodies[i], dtype=np.int64)
        if bos_id is not None:
            row = np.concatenate([np.asarray([bos_id], dtype=np.int64), row])
        rows.append(row)
    return Windows(np.stack(rows).astype(np.int64), bos_id, starts, total)


def given_windows(tokens) -> Windows:
    """Token ids a caller handed over as ``windows=``, checked: integers, (n_seqs >= 1, seq_len >= 2), ids >= 0.

    A numpy array, a torch tensor (read through ``detach().cpu()``, no torch import here) or nested
    lists; floats are refused rather than truncated.
    """
    if hasattr(tokens, "detach") and hasattr(tokens, "cpu"):  # a torch tensor
        tokens = tokens.detach().cpu().numpy()
    try:
        array = np.asarray(tokens)
    except (ValueError, TypeError) as error:  # ragged lists
        raise SinkscopeError(f"windows must be a rectangular array of token ids (n_seqs, seq_len) ({error}).") from error
    if array.dtype == bool or not np.issubdtype(array.dtype, np.integer):
        kind = "floats" if np.issubdtype(array.dtype, np.floating) else f"{array.dtype} values"
        raise SinkscopeError(f"windows must be integer token ids, not {kind}; convert them with .astype(int) if "
                             "they are ids.")
    if array.ndim != 2 or array.shape[0] < 1 or array.shape[1] < 2:
        raise SinkscopeError(f"windows must be token ids of shape (n_seqs >= 1, seq_len >= 2), not {array.shape}; "
                             "one window is windows=[ids].")
    array = np.ascontiguousarray(array.astype(np.int64))
    check_token_range(array, None)  # negative ids
    return Windows(array, None, [], int(array.size))
