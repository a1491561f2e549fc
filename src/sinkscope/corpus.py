"""Text corpora and the deterministic token windows every run evaluates.

Sources: the bundled default (six Jane Austen novels, fetched at set-up from the Debian package
``r-cran-janeaustenr`` by ``python -m sinkscope.corpus_fetch``), a UTF-8 text file
(``--text-file``), or a ``datasets`` dataset (``--dataset NAME[:CONFIG][:SPLIT]``, when the
``datasets`` package and the data are available locally).

Windowing (documented in docs/getting-started.md, "Corpus and windows", and recorded in the manifest):

1. Each document (a novel, the text file, one dataset row) is tokenised on its own with no
   special tokens.
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

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sinkscope.corpus_fetch import AUSTEN_NAMES, austen_filename, default_corpus_dir, is_complete_corpus
from sinkscope.errors import SinkscopeError, option
from sinkscope.options import BOS_POLICIES, check_seed  # noqa: F401 - part of this module's interface



@dataclass
class Corpus:
    """Documents plus a description of where they came from.

    Attributes:
        name: short name (``austen``, the file name, the dataset name).
        documents: the texts, in corpus order.
        info: provenance recorded in the manifest (paths as the user gave them, hashes).
    """

    name: str
    documents: list[str]
    info: dict = field(default_factory=dict)

    def describe(self) -> str:
        """``'austen' (6 documents)``, for progress messages."""
        n = len(self.documents)
        return f"{self.name!r} ({n} document{'' if n == 1 else 's'})"

    @property
    def sha256(self) -> str:
        """Hash of the documents in order (what the manifest calls the corpus hash)."""
        digest = hashlib.sha256()
        for text in self.documents:
            digest.update(hashlib.sha256(text.encode("utf-8")).digest())
        return digest.hexdigest()


def bundled_corpus() -> Corpus:
    """The default Austen corpus, or a sentence saying how to fetch it."""
    folder = default_corpus_dir()
    if not is_complete_corpus(folder):
        raise SinkscopeError(
            f"the bundled corpus is not in {folder}; run `python -m sinkscope.corpus_fetch` "
            f"(or `make demo`), or pass {option('text_file')} PATH."
        )
    files = [folder / austen_filename(name) for name in sorted(AUSTEN_NAMES)]
    return Corpus("austen", [f.read_text(encoding="utf-8") for f in files],
                  {"kind": "bundled", "path": str(folder), "files": [f.name for f in files],
                   "source": "Debian package r-cran-janeaustenr (texts public domain)"})


def text_file_corpus(path: str) -> Corpus:
    """One UTF-8 text file as a single document."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise SinkscopeError(f"no text file at {path}.")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise SinkscopeError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start}).") from error
    if not text.strip():
        raise SinkscopeError(f"the text file {path} is empty.")
    return Corpus(file.name, [text], {"kind": "text_file", "path": path, "abs_path": str(file.resolve())})


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


def tokenize_documents(tokenizer, documents: list[str]) -> list[np.ndarray]:
    """Each document's token ids (no special tokens), int64."""
    out = []
    for text in documents:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        out.append(np.asarray(ids, dtype=np.int64))
    return out


#: above this share of unknown tokens a text is refused; above UNKNOWN_WARN a warning is logged.
UNKNOWN_REFUSE, UNKNOWN_WARN = 0.5, 0.05


def check_unknown_share(doc_ids: list[np.ndarray], tokenizer, model_label: str, log, hint: str = "") -> None:
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
    share = sum(int((ids == unk).sum()) for ids in doc_ids) / total
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


def text_window(doc_ids: list[np.ndarray], *, seq_len: int | None, bos_id: int | None) -> Windows:
    """One window: the documents' tokens in order (BOS first when ``bos_id`` is set), cut at ``seq_len``.

    ``sinkscope explore``'s window is the text itself; fewer than 2 tokens is one sentence.
    """
    body = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in doc_ids]) if doc_ids else np.zeros(0, np.int64)
    row = np.concatenate([np.asarray([bos_id], dtype=np.int64), body]) if bos_id is not None else body
    if seq_len is not None:
        row = row[:seq_len]
    if len(row) < 2:
        raise SinkscopeError(f"the text is {len(row)} token{'s' if len(row) != 1 else ''} long; the explorer needs at "
                             "least 2 (a query and a key): give a longer text.")
    return Windows(row[None, :].astype(np.int64), bos_id, [(0, 0)], int(body.size))


def make_windows(doc_ids: list[np.ndarray], *, seq_len: int, n_seqs: int, seed: int, bos_id: int | None) -> Windows:
    """Draw ``n_seqs`` windows of ``seq_len`` tokens (see the module docstring for the rule)."""
    check_seed(seed)
    if seq_len < 2:
        raise SinkscopeError(f"{option('seq_len')} must be at least 2 (got {seq_len}).")
    if n_seqs < 1:
        raise SinkscopeError(f"{option('n_seqs')} must be at least 1 (got {n_seqs}).")
    body = seq_len - (1 if bos_id is not None else 0)
    chunks = [(d, start) for d, ids in enumerate(doc_ids) for start in range(0, len(ids) - body + 1, body)]
    total = int(sum(len(ids) for ids in doc_ids))
    if len(chunks) < n_seqs:
        raise SinkscopeError(
            f"the corpus has {total} tokens, enough for {len(chunks)} windows of {seq_len} tokens, "
            f"but {option('n_seqs')} {n_seqs} were asked for; lower {option('n_seqs')} or {option('seq_len')}, or use a longer text."
        )
    rng = np.random.default_rng(seed)
    picked = sorted(rng.choice(len(chunks), size=n_seqs, replace=False).tolist())
    starts = [chunks[i] for i in picked]
    rows = []
    for d, start in starts:
        row = doc_ids[d][start:start + body]
        if bos_id is not None:
            row = np.concatenate([np.asarray([bos_id], dtype=np.int64), row])
        rows.append(row)
    return Windows(np.stack(rows).astype(np.int64), bos_id, starts, total)
