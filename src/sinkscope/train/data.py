"""The trainer's data: an offline tokenizer, one cached token stream, a val/train split, batches.

Tokenizer (``tokenizer=``):

    "bpe4096" (default)  a byte-level BPE with 4,096 entries (``tokenizers``' ByteLevelBPE,
                         min frequency 2, special token ``<|endoftext|>`` = id 0) trained on the
                         corpus itself and cached under
                         ``cache_root()/tokenizers/bpe4096-<corpus sha256[:16]>/``. Why: it needs
                         no download, and tiny models need a small vocabulary; GPT-2's 50,257
                         entries x width 128 would be 6.4M of a 1.3M-parameter tiny model's
                         weights (research/tiny-tier-cpu.md). Training is deterministic (the
                         same corpus gives byte-identical tokenizer.json) and takes ~2 s on
                         the Austen corpus. It is trained on the whole corpus, validation text
                         included, as GPT-2's BPE was on all of WebText: the split is defined on
                         tokens, so it cannot exist before the tokenizer does. ``bpe<N>`` picks
                         another size.
    "gpt2"               GPT-2's BPE (Wang 2026's tokenizer for every published tier), from the
                         local Hugging Face cache only; a one-sentence error when it is absent.
    any other string     a tokenizer folder (``save_pretrained`` layout), e.g. a checkpoint's.

Token stream: every document tokenised on its own with no special tokens, the documents joined
with the end-of-text id between them (Wang 2026: "concatenated with an end-of-text token between
documents"), cached as ``cache_root()/tokens/<corpus sha[:16]>-<tokenizer fingerprint[:16]>.npy``
(uint16 when the vocabulary fits, else int32), written atomically.

Split (Wang 2026: "A validation set ... is taken first, so that it is disjoint from every
training set"): validation = the first ``val_tokens`` tokens of the stream (default 5%, and at
least ``min_val_windows`` windows of ``block_size + 1``), training = every token after it.

Window policies (``--windows``; SPEC.md "Training data (resolved)"):

    doc-start (default)  every window is ``[BOS] + block_size tokens`` that start at a passage
                         start and stay inside one document: BOS is the tokenizer's end-of-text
                         id (GPT-2's convention: one token is both), so position 0 is always the
                         same token, as in the P0-sink study's BOS-in-vocabulary setting. A passage starts
                         at a document's first non-blank character and after every blank line
                         (a paragraph; the Austen corpus has 10,298 in 1.07M tokens), so the
                         token after BOS is a real beginning, never mid-sentence. Why not only
                         document starts: six novels give six windows. Passage starts are found
                         from the tokenizer's character offsets (:func:`passage_index`); a slow
                         tokenizer without offsets gives document starts only.
    random               today's windows: ``block_size + 1`` consecutive tokens at any offset of
                         the stream (across document boundaries), no BOS.

Batches: :class:`TrainBatches` draws windows with replacement from the training tokens (any
offset, or one of the training split's passage starts) with a dedicated ``torch.Generator``
seeded from the run seed. Nothing else draws from it, so every variant with the same seed sees
the same batches in the same order (paired comparisons, SPEC.md), whatever its parameters,
micro-batching or process count: a step always draws the whole global batch and each process
keeps its rows. :func:`eval_batches` cuts fixed, evenly spaced, non-overlapping windows from the
validation tokens; :func:`eval_start_batches` takes evenly spaced passage starts of the
validation split. A doc-start window lies wholly inside its split.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sinkscope.data.corpus import Corpus
from sinkscope.errors import SinkscopeError, option
from sinkscope.store.files import atomic_write_bytes
from sinkscope.runtime.paths import cache_root

#: The end-of-text token of GPT-2, reused by the trained BPE (id 0 there).
EOS_TOKEN = "<|endoftext|>"
#: Default tokenizer spec: a 4,096-entry byte-level BPE trained on the corpus.
DEFAULT_TOKENIZER = "bpe4096"
#: Default validation share of the stream (Wang 2026 takes a fixed 5.2M tokens first; 5% here).
VAL_FRACTION = 0.05

_BPE_SPEC = re.compile(r"^bpe(\d+)$")
#: Window policies of text training (module docstring).
WINDOW_POLICIES = ("doc-start", "random")
#: A passage starts at a document's first non-blank character and after every blank line.
_PASSAGE = re.compile(r"(?:\A|\n[^\S\n]*\n)\s*(?=\S)")


# ---- tokenizers -------------------------------------------------------------------------------


def _wrap_fast(backend):
    """A transformers fast tokenizer around a ``tokenizers.Tokenizer`` with GPT-2's specials."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN,
                                   unk_token=EOS_TOKEN)


def train_bpe(documents: list[str], vocab_size: int = 4096):
    """Train a byte-level BPE on ``documents`` (deterministic for a given corpus)."""
    from tokenizers import ByteLevelBPETokenizer

    if vocab_size < 257 + 1:
        raise SinkscopeError(f"a byte-level BPE needs at least 258 entries (256 bytes + {EOS_TOKEN}), not {vocab_size}.")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(documents, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS_TOKEN],
                            show_progress=False)
    return _wrap_fast(bpe._tokenizer)


def load_tokenizer_folder(folder: Path, what: str, *, trust_remote_code: bool = False):
    """A tokenizer saved with ``save_pretrained``; ``what`` completes the error sentence.

    Code in the folder (an ``auto_map`` in its tokenizer_config.json) runs only with
    ``trust_remote_code`` (``train --trust-remote-code``); without it such a folder is one
    sentence, never transformers' "[y/N]" prompt. A checkpoint's own tokenizer is always loaded
    without (the trainer wrote it).
    """
    from transformers import AutoTokenizer

    from sinkscope.models.resolve import check_model_files

    check_model_files(folder, "the tokenizer's")  # a damaged JSON file: one sentence naming it, not transformers'
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                             trust_remote_code=bool(trust_remote_code))
    except Exception as error:  # noqa: BLE001 - any loading failure becomes one sentence
        if "trust_remote_code" in str(error):
            raise SinkscopeError(f"the tokenizer {what} needs code from its folder (an auto_map in its "
                                 "tokenizer_config.json), and sinkscope does not run it unless asked; rerun with "
                                 f"{option('trust_remote_code', True)} if you trust that code, or choose another --tokenizer.") from None
        raise SinkscopeError(f"could not load the tokenizer {what} ({str(error).splitlines()[0][:200]}).") from error


def load_tokenizer(spec: str | None, corpus: Corpus | None = None, *, trust_remote_code: bool = False):
    """The tokenizer named by ``spec`` (see the module docstring); ``corpus`` is needed for BPE.

    ``trust_remote_code`` lets code in a tokenizer folder run (``train --trust-remote-code``);
    sinkscope's own cached BPE is always loaded without.
    """
    spec = spec or DEFAULT_TOKENIZER
    match = _BPE_SPEC.match(spec)
    if match:
        if corpus is None:
            raise SinkscopeError(f"the {spec} tokenizer is trained on a corpus, and none was given.")
        vocab = int(match.group(1))
        folder = cache_root() / "tokenizers" / f"bpe{vocab}-{corpus.sha256[:16]}"
        if (folder / "tokenizer.json").is_file():
            return load_tokenizer_folder(folder, f"cached in {folder}")
        tokenizer = train_bpe(corpus.documents, vocab)
        folder.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            tokenizer.save_pretrained(str(stage))
            os.replace(stage, folder)  # atomic; another process may have won the race
        except OSError:
            shutil.rmtree(stage, ignore_errors=True)
        return tokenizer
    if spec == "gpt2":
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained("gpt2", local_files_only=True,
                                                 trust_remote_code=bool(trust_remote_code))
        except Exception as error:  # noqa: BLE001
            raise SinkscopeError(
                "the GPT-2 tokenizer is not in the local Hugging Face cache; download it once "
                "(`hf download gpt2 tokenizer.json vocab.json merges.txt tokenizer_config.json`) "
                "or use the default --tokenizer bpe4096."
            ) from error
    folder = Path(spec).expanduser()
    if not folder.is_dir():
        raise SinkscopeError(f"unknown tokenizer {spec!r}; use bpe4096 (or bpe<N>), gpt2, or a tokenizer folder.")
    return load_tokenizer_folder(folder, f"in {folder}", trust_remote_code=trust_remote_code)


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 of what decides the ids of plain text: normaliser, pre-tokeniser, model, EOS id."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        data = json.loads(backend.to_str())
        key = {k: data.get(k) for k in ("normalizer", "pre_tokenizer", "model", "added_tokens")}
    else:  # a slow tokenizer: its vocabulary is the best stable description we have
        key = {"vocab": sorted(tokenizer.get_vocab().items())}
    key["eos"] = end_of_text_id(tokenizer)
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def end_of_text_id(tokenizer) -> int:
    """The id joining documents: the tokenizer's EOS, else ``<|endoftext|>``."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
        if eos is None or eos == getattr(tokenizer, "unk_token_id", None):
            raise SinkscopeError("the tokenizer has no end-of-text token to put between documents; choose another --tokenizer.")
    return int(eos)


# ---- the token stream -------------------------------------------------------------------------


def encode_documents(tokenizer, documents: list[str]) -> list[list[int]]:
    """Each document's ids, no special tokens (the Rust batch encoder when there is one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return [enc.ids for enc in backend.encode_batch(documents, add_special_tokens=False)]
    return [tokenizer(text, add_special_tokens=False).input_ids for text in documents]


def token_stream(corpus: Corpus, tokenizer) -> np.ndarray:
    """The corpus as one id stream, documents joined by EOS, cached on disk (see module docstring)."""
    fingerprint = tokenizer_fingerprint(tokenizer)
    path = cache_root() / "tokens" / f"{corpus.sha256[:16]}-{fingerprint[:16]}.npy"
    if path.is_file():
        try:
            stream = np.load(path, allow_pickle=False)
            if stream.ndim == 1 and stream.dtype.kind in "ui":
                return stream
        except (OSError, ValueError):
            pass  # a damaged cache entry is rebuilt below (so is one of another shape or type)
    eos = end_of_text_id(tokenizer)
    dtype = np.uint16 if len(tokenizer) < 2**16 else np.int32
    pieces: list[np.ndarray] = []
    for i, ids in enumerate(encode_documents(tokenizer, corpus.documents)):
        if i:
            pieces.append(np.asarray([eos], dtype=dtype))
        pieces.append(np.asarray(ids, dtype=dtype))
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)
    buffer = io.BytesIO()
    np.save(buffer, stream)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return stream


def stream_sha256(stream: np.ndarray) -> str:
    """Hash of the ids as int64, so the storage dtype does not change it."""
    return hashlib.sha256(np.ascontiguousarray(stream, dtype=np.int64).tobytes()).hexdigest()


def _passage_char_starts(text: str) -> list[int]:
    """Character offsets of the passage starts of one document (see ``_PASSAGE``)."""
    return [m.end() for m in _PASSAGE.finditer(text)]


def passage_index(corpus: Corpus, tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)``: each passage start as an offset into :func:`token_stream`, and the end
    (exclusive) of its document there, int64 arrays of one length; cached beside the stream.

    The token of a passage start is the first token whose character span ends after the
    passage's first character (byte-level BPE glues a leading space to the word).
    """
    fingerprint = tokenizer_fingerprint(tokenizer)
    path = cache_root() / "tokens" / f"{corpus.sha256[:16]}-{fingerprint[:16]}-passages.npy"
    if path.is_file():
        try:
            index = np.load(path, allow_pickle=False)
            if index.ndim == 2 and index.shape[0] == 2 and index.dtype.kind in "ui":
                return index[0], index[1]
        except (OSError, ValueError, IndexError):
            pass  # a damaged cache entry is rebuilt below
    backend = getattr(tokenizer, "backend_tokenizer", None)
    starts: list[int] = []
    ends: list[int] = []
    offset = 0
    if backend is not None:
        encodings = backend.encode_batch(corpus.documents, add_special_tokens=False)
        lengths = [len(enc.ids) for enc in encodings]
    else:  # a slow tokenizer: no offsets, document starts only
        encodings = None
        lengths = [len(ids) for ids in encode_documents(tokenizer, corpus.documents)]
    for d, (text, n) in enumerate(zip(corpus.documents, lengths)):
        if n:
            if encodings is not None:
                token_ends = np.asarray([end for _, end in encodings[d].offsets], dtype=np.int64)  # (n,)
                firsts = np.searchsorted(token_ends, _passage_char_starts(text), side="right")
                firsts = np.unique(firsts[firsts < n])
            else:
                firsts = np.zeros(1, dtype=np.int64)
            starts.extend((offset + firsts).tolist())
            ends.extend([offset + n] * len(firsts))
        offset += n + 1  # the end-of-text id between documents
    index = np.asarray([starts, ends], dtype=np.int64).reshape(2, -1)  # (2, n_passages)
    buffer = io.BytesIO()
    np.save(buffer, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buffer.getvalue())
    return index[0], index[1]


def window_starts(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int, body: int) -> np.ndarray:
    """The passage starts s with ``lo <= s`` and ``s + body <= min(hi, end of its document)``,
    shifted to ``s - lo`` (offsets into the split ``stream[lo:hi]``)."""
    ok = (starts >= lo) & (starts + body <= np.minimum(ends, hi))
    return (starts[ok] - lo).astype(np.int64)


def split_stream(stream: np.ndarray, block_size: int, val_tokens: int | None = None,
                 min_val_windows: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """(val, train): the first ``val_tokens`` ids and the rest; disjoint, validation first."""
    window = block_size + 1
    if val_tokens is None:
        val_tokens = max(int(VAL_FRACTION * len(stream)), min_val_windows * window)
    if val_tokens < window:
        raise SinkscopeError(f"the validation split needs at least {window} tokens (one window), not {val_tokens}.")
    if len(stream) < val_tokens + window:
        raise SinkscopeError(
            f"the corpus has {len(stream)} tokens, too few for {val_tokens} validation tokens plus one "
            f"training window of {window}; use a longer text or a smaller block_size."
        )
    return stream[:val_tokens], stream[val_tokens:]


# ---- batches ----------------------------------------------------------------------------------


def batch_seed(seed: int) -> int:
    """The batch generator's seed, derived from the run seed.

    Derived rather than equal so the batch stream is not the init stream (torch's global
    generator after ``manual_seed(seed)``) replayed through another distribution.
    """
    digest = hashlib.sha256(f"sinkscope-train-batches-{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def window_rows(tokens: np.ndarray, starts: np.ndarray, length: int, bos: int | None = None) -> np.ndarray:
    """Rows of ``length`` tokens, int64 (n, length): ``tokens[s:s+length]``, or with ``bos``
    ``[bos] + tokens[s:s+length-1]`` (a doc-start window)."""
    body = length - (bos is not None)
    offsets = np.arange(body)
    rows = np.asarray(tokens)[np.asarray(starts)[:, None] + offsets[None, :]].astype(np.int64)  # (n, body)
    if bos is not None:
        rows = np.concatenate([np.full((rows.shape[0], 1), bos, dtype=np.int64), rows], axis=1)  # (n, length)
    return rows


def _windows(tokens: np.ndarray, starts: np.ndarray, block_size: int,
             bos: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    rows_t = torch.from_numpy(window_rows(tokens, starts, block_size + 1, bos))  # (B, T+1)
    return rows_t[:, :-1].contiguous(), rows_t[:, 1:].contiguous()  # (B, T) inputs, (B, T) targets


class SeededOrder:
    """The resumable part of a batch order: its seed, the batches drawn so far and the generator.

    Mixed into the training samplers (``TrainBatches``; ``tasks.TriggerBatches``), which define
    ``seed``, ``index`` and ``generator``.
    """

    def state_dict(self) -> dict:
        return {"seed": self.seed, "index": self.index, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        if int(state["seed"]) != int(self.seed):
            raise SinkscopeError(f"the saved batch order is for seed {state['seed']}, not {self.seed}.")
        self.index = int(state["index"])
        self.generator.set_state(state["generator"])


@dataclass
class TrainBatches(SeededOrder):
    """Training windows drawn with replacement from a generator seeded by the run seed.

    ``next(rank, world_size)`` draws the whole global batch (``batch_size`` rows) and returns
    this process's contiguous rows, so batches do not depend on the process count. With
    ``starts`` (doc-start windows) each row is ``[bos] + tokens[s:s+block_size]`` for a start s
    drawn from ``starts``; without, ``tokens[s:s+block_size+1]`` for any offset s.
    """

    tokens: np.ndarray
    block_size: int
    batch_size: int
    seed: int
    index: int = 0  # batches drawn so far
    starts: np.ndarray | None = None  # doc-start windows: the allowed starts (offsets into tokens)
    bos: int | None = None  # doc-start windows: the id put before each window
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.starts is None:
            self.n_starts = len(self.tokens) - self.block_size  # starts 0 .. len - (T+1)
            if self.n_starts < 1:
                raise SinkscopeError(
                    f"the training split has {len(self.tokens)} tokens, fewer than one window of {self.block_size + 1}."
                )
        else:
            self.n_starts = len(self.starts)
            if self.n_starts < 1:
                raise SinkscopeError(
                    f"the training split has no passage start (a document start or the line after a blank line) "
                    f"followed by {self.block_size} tokens of the same document; use --windows random, a smaller "
                    "block_size or a longer text."
                )
        self.generator = torch.Generator().manual_seed(batch_seed(self.seed))

    def next(self, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch_size / world_size, block_size) int64 on CPU."""
        drawn = torch.randint(0, self.n_starts, (self.batch_size,), generator=self.generator)  # (B,)
        self.index += 1
        per = self.batch_size // world_size
        mine = drawn[rank * per:(rank + 1) * per].numpy()
        if self.starts is not None:
            mine = self.starts[mine]
        return _windows(self.tokens, mine, self.block_size, self.bos)


def eval_batches(val_tokens: np.ndarray, block_size: int, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n_windows`` fixed windows, evenly spaced and non-overlapping, (n, block_size) each.

    Fewer when the validation split cannot hold that many (at least one).
    """
    window = block_size + 1
    n = min(int(n_windows), len(val_tokens) // window)
    if n < 1:
        raise SinkscopeError(f"the validation split ({len(val_tokens)} tokens) holds no window of {window} tokens.")
    stride = len(val_tokens) // n  # >= window, so windows never overlap
    starts = np.arange(n, dtype=np.int64) * stride
    return _windows(val_tokens, starts, block_size)


def eval_start_batches(val_tokens: np.ndarray, starts: np.ndarray, block_size: int, n_windows: int,
                       bos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Doc-start validation windows: ``n_windows`` evenly spaced entries of ``starts`` (fewer if
    there are fewer), each ``[bos] + block_size tokens``, (n, block_size) inputs and targets."""
    if len(starts) < 1:
        raise SinkscopeError(
            f"the validation split has no passage start followed by {block_size} tokens of the same document; "
            "use --windows random, a larger --val-tokens or a smaller block_size."
        )
    n = min(int(n_windows), len(starts))
    picked = starts[np.unique(np.linspace(0, len(starts) - 1, n).round().astype(np.int64))]
    return _windows(val_tokens, picked, block_size, bos)


# ---- everything a run needs -------------------------------------------------------------------


@dataclass
class TrainData:
    """The tokenizer, the split and where they came from (recorded in the checkpoint)."""

    tokenizer: object
    val: np.ndarray
    train: np.ndarray
    info: dict


def prepare_data(corpus: Corpus, tokenizer, block_size: int, val_tokens: int | None = None,
                 min_val_windows: int = 4) -> TrainData:
    """Tokenise (cached), split, and describe the data of a run."""
    stream = token_stream(corpus, tokenizer)
    val, train = split_stream(stream, block_size, val_tokens, min_val_windows)
    info = {
        "corpus": corpus.name,
        "corpus_sha256": corpus.sha256,
        "corpus_info": corpus.info,
        "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
        "vocab_size": len(tokenizer),
        "stream_tokens": int(len(stream)),
        "stream_sha256": stream_sha256(stream),
        "val_tokens": int(len(val)),
        "train_tokens": int(len(train)),
    }
    return TrainData(tokenizer, val, train, info)
