"""Where the trainer's windows come from: a small data-source protocol and its tasks.

The training loop consumes a :class:`Task`; it never knows whether the windows are text or
generated. A task owns its tokenizer (saved with the checkpoint, so every probe command loads a
checkpoint of any task the same way), its training batches, its fixed validation windows and a
description recorded in the checkpoint's ``config.json`` (``"data"``).

    text      the corpus (bundled Austen, ``--text-file``, ``--dataset``) through the BPE of
              ``data.py``; windows by ``--windows doc-start|random`` (``data`` module docstring).
    trigger   the trigger-conditional task of SPEC.md (:class:`TriggerTask`): generated, nothing to
              download, a no-op sink forms within CPU minutes.

Probe runs on a checkpoint should measure the checkpoint's own validation data with its window
policy: :func:`checkpoint_windows` rebuilds the task from ``config.json`` and returns the windows
as :class:`sinkscope.data.corpus.Windows` (text: the validation split, never training text;
synthetic: a seeded validation draw of the task).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from sinkscope.data.corpus import Windows
from sinkscope.errors import SinkscopeError, option, suggest
from sinkscope.train import data as tdata

#: ``--task`` names.
TASKS = ("text", "trigger")


class Batches(Protocol):
    """A resumable stream of training batches (``data.TrainBatches`` is one)."""

    index: int

    def next(self, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of this process, each (batch / world_size, T) int64 on CPU."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Task(Protocol):
    """What the training loop needs from a data source."""

    name: str
    tokenizer: object  # saved with the checkpoint (``save_pretrained``)
    info: dict  # config.json "data": provenance, sizes, ``fingerprint``

    def train_batches(self, batch_size: int, seed: int) -> Batches: ...

    def eval_batches(self, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed validation (inputs, targets), each (n, T): the same for every seed and variant."""

    def windows(self, *, seq_len: int, n_seqs: int, seed: int) -> Windows:
        """``n_seqs`` validation windows of ``seq_len`` tokens for probe runs."""

    def extra_files(self) -> dict[str, bytes]:
        """Files to write into the checkpoint folder besides the model and tokenizer."""


def _derived_seed(*parts) -> int:
    digest = hashlib.sha256("-".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


# ---- text ------------------------------------------------------------------------------------------


class TextTask:
    """A corpus as one token stream, split validation-first, windowed by ``windows`` (``data``)."""

    name = "text"

    def __init__(self, corpus, tokenizer, block_size: int, *, windows: str = "doc-start",
                 val_tokens: int | None = None):
        if windows not in tdata.WINDOW_POLICIES:
            raise SinkscopeError(f"unknown --windows {windows!r}; use {' or '.join(tdata.WINDOW_POLICIES)}.")
        self.corpus, self.tokenizer, self.block_size, self.policy = corpus, tokenizer, block_size, windows
        prepared = tdata.prepare_data(corpus, tokenizer, block_size, val_tokens)
        self.val, self.train = prepared.val, prepared.train
        self.bos = tdata.end_of_text_id(tokenizer) if windows == "doc-start" else None
        self.info = {**prepared.info, "task": "text", "windows": windows,
                     "fingerprint": prepared.info["stream_sha256"]}
        if windows == "doc-start":
            starts, ends = tdata.passage_index(corpus, tokenizer)
            n_val, n = len(self.val), len(self.val) + len(self.train)
            self.val_starts = tdata.window_starts(starts, ends, 0, n_val, block_size)  # into self.val
            self.train_starts = tdata.window_starts(starts, ends, n_val, n, block_size)  # into self.train
            self.passage_index = (starts, ends)
            self.info.update(bos_id=self.bos, passages=int(len(starts)), val_windows=int(len(self.val_starts)),
                             train_windows=int(len(self.train_starts)))

    def train_batches(self, batch_size: int, seed: int) -> tdata.TrainBatches:
        if self.policy == "doc-start":
            return tdata.TrainBatches(self.train, self.block_size, batch_size, seed, starts=self.train_starts,
                                      bos=self.bos)
        return tdata.TrainBatches(self.train, self.block_size, batch_size, seed)

    def eval_batches(self, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.policy == "doc-start":
            return tdata.eval_start_batches(self.val, self.val_starts, self.block_size, n_windows, self.bos)
        return tdata.eval_batches(self.val, self.block_size, n_windows)

    def windows(self, *, seq_len: int, n_seqs: int, seed: int) -> Windows:
        """Validation windows drawn without replacement by ``numpy.random.default_rng(seed)``, kept
        in stream order: doc-start ``[BOS] + seq_len - 1`` tokens at a validation passage start;
        random: non-overlapping ``seq_len`` chunks of the validation split. ``Windows.starts`` holds
        ``(0, offset of the window's body in the validation split)``."""
        if seq_len < 2:
            raise SinkscopeError(f"{option('seq_len')} must be at least 2 (got {seq_len}).")
        if self.policy == "doc-start":
            candidates = tdata.window_starts(*self.passage_index, 0, len(self.val), seq_len - 1)
            what = f"passage starts followed by {seq_len - 1} tokens of one document"
        else:
            candidates = np.arange(0, len(self.val) - seq_len + 1, seq_len, dtype=np.int64)
            what = f"non-overlapping windows of {seq_len} tokens"
        if len(candidates) < n_seqs:
            raise SinkscopeError(
                f"the checkpoint's validation split ({len(self.val)} tokens) holds {len(candidates)} {what}, "
                f"fewer than {option('n_seqs')} {n_seqs}; lower {option('n_seqs')} or {option('seq_len')}."
            )
        rng = np.random.default_rng(seed)
        picked = np.sort(candidates[rng.choice(len(candidates), size=n_seqs, replace=False)])
        rows = tdata.window_rows(self.val, picked, seq_len, self.bos)  # (n_seqs, seq_len)
        return Windows(rows, self.bos, [(0, int(s)) for s in picked], int(len(self.val)))

    def extra_files(self) -> dict[str, bytes]:
        return {}


# ---- the trigger-conditional task ------------------------------------------------------------------


@dataclass(frozen=True)
class TriggerOptions:
    """Options of the trigger task (``--task-set key=value``)."""

    # Vocabulary size V: <bos> (id 0), <trigger> (id 1) and V - 2 content tokens t2 .. t{V-1}.
    # 64 is SPEC.md's measured setting; the model's vocab_size is V.
    vocab: int = 64
    # Probability p that a position (not right after a trigger) is the trigger token. SPEC.md: 0.12.
    trigger_rate: float = 0.12
    # Tokens per window (the model's input length T); 0 = the model's block_size (SPEC.md: 64).
    length: int = 0
    # Seed of the task itself (the successor cycle); the run's --seed sets only which windows are
    # drawn, so every run seed trains on the same task.
    task_seed: int = 0


class TriggerTask:
    """SPEC.md "Trigger-conditional task": heads are needed only conditionally.

    A window (T + 1 tokens, inputs = the first T, targets = the last T) is

        x_0 = <bos>,  x_1 = k (the key: a content token, uniform),
        x_t = k          if x_{t-1} = <trigger>
            = <trigger>  with probability p otherwise
            = succ(x_{t-1}) otherwise                                    (t >= 2)

    where succ is one fixed cycle through all V - 2 content tokens (drawn from ``task_seed``;
    a single cycle, so no token is its own successor and a chain never repeats before V - 2
    steps). What a head must do: nothing, almost always — the next content token is a function
    of the current one (the MLP's job) and mixing in other positions only adds noise; after a
    trigger the target is k, which only a head reading position 1 can supply. A head that is
    needed only sometimes must be able to do nothing the rest of the time: a no-op sink (mass on
    BOS, whose value is small) or, in abstention variants, the phantom. The Bayes-optimal loss
    is 0 after a trigger, H(p) = -p ln p - (1-p) ln(1-p) at every other position (0.367 nats at
    p = 0.12) and ln(V - 2) at position 0 (the key itself, unpredictable; excluded from
    ``val_loss``): about H(p) / (1 + p) = 0.33 nats per position >= 1 at p = 0.12.

    Draws: ``sample(n, length, generator)`` draws one float64 uniform matrix (n, length + 2) in
    row-major order (column 0 the key, column t the trigger coin of position t), so row i does
    not depend on n: the first N windows of a larger draw are the windows of a draw of N.
    """

    name = "trigger"
    BOS, TRIGGER = 0, 1

    def __init__(self, options: TriggerOptions, block_size: int):
        V, p = options.vocab, options.trigger_rate
        if not isinstance(V, int) or V < 4:
            raise SinkscopeError(f"the trigger task needs vocab >= 4 (<bos>, <trigger> and two content tokens), not {V!r}.")
        if not 0.0 <= p < 1.0:
            raise SinkscopeError(f"trigger_rate must be in [0, 1), not {p!r}.")
        length = options.length or block_size
        if not 2 <= length <= block_size:
            raise SinkscopeError(f"the trigger task's length must be between 2 and block_size ({block_size}), not {length}.")
        self.options, self.length, self.block_size = options, length, block_size
        self.n_content = V - 2
        order = np.random.default_rng(options.task_seed).permutation(self.n_content) + 2  # content ids
        succ = np.zeros(V, dtype=np.int64)  # succ[<bos>] = succ[<trigger>] = 0: never used
        succ[order] = np.roll(order, -1)  # one cycle through every content token
        self.successor = torch.from_numpy(succ)  # (V,)
        self.tokenizer = trigger_tokenizer(V)
        definition = json.dumps({**dataclasses.asdict(options), "length": length,
                                 "successor": succ.tolist()}, sort_keys=True)
        entropy = -p * math.log(p) - (1 - p) * math.log(1 - p) if p > 0 else 0.0
        self.info = {"task": "trigger", "options": dataclasses.asdict(options), "length": length,
                     "vocab_size": V, "bos_id": self.BOS, "trigger_id": self.TRIGGER,
                     "successor": succ.tolist(), "optimal_loss_per_position": entropy / (1 + p),
                     "fingerprint": hashlib.sha256(definition.encode()).hexdigest()}

    def token_names(self) -> list[str]:
        return trigger_token_names(self.options.vocab)

    def sample(self, n: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` windows of ``length + 1`` tokens, int64 (n, length + 1) (see the class docstring)."""
        u = torch.rand(n, length + 2, generator=generator, dtype=torch.float64)  # (n, length+2)
        keys = 2 + (u[:, 0] * self.n_content).long().clamp(max=self.n_content - 1)  # (n,)
        seq = torch.empty(n, length + 1, dtype=torch.long)  # (n, length+1)
        seq[:, 0] = self.BOS
        seq[:, 1] = keys
        p = self.options.trigger_rate
        for t in range(2, length + 1):
            prev = seq[:, t - 1]  # (n,)
            after = prev == self.TRIGGER  # (n,)
            fire = (u[:, t] < p) & ~after  # (n,)
            nxt = torch.where(fire, torch.full_like(prev, self.TRIGGER), self.successor[prev])  # (n,)
            seq[:, t] = torch.where(after, keys, nxt)  # (n,)
        return seq

    def _validation_generator(self, seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(_derived_seed("sinkscope-trigger-validation", self.info["fingerprint"], seed))

    def train_batches(self, batch_size: int, seed: int) -> "TriggerBatches":
        return TriggerBatches(self, batch_size, seed)

    def eval_batches(self, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n_windows`` windows of the validation draw with seed 0 (any run seed)."""
        seq = self.sample(n_windows, self.length, self._validation_generator(0))  # (n, T+1)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def windows(self, *, seq_len: int, n_seqs: int, seed: int) -> Windows:
        """A seeded validation draw: seed 0 and ``seq_len = length`` give the eval windows first.
        ``Windows.starts`` holds ``(0, index of the window in the draw)``."""
        if not 2 <= seq_len <= self.block_size:
            raise SinkscopeError(f"{option('seq_len')} must be between 2 and the model's context ({self.block_size}), not {seq_len}.")
        if n_seqs < 1:
            raise SinkscopeError(f"{option('n_seqs')} must be at least 1 (got {n_seqs}).")
        seq = self.sample(n_seqs, seq_len, self._validation_generator(seed))[:, :seq_len]  # (n, seq_len)
        return Windows(seq.numpy().astype(np.int64), self.BOS, [(0, i) for i in range(n_seqs)], n_seqs * seq_len)

    def validation_text(self, n: int = 256) -> str:
        """The first ``n`` validation windows as text, one per line (token names, space-separated)."""
        names = self.token_names()
        rows = self.windows(seq_len=self.length, n_seqs=n, seed=0).tokens
        return "\n".join(" ".join(names[i] for i in row) for row in rows) + "\n"

    def extra_files(self) -> dict[str, bytes]:
        """``validation.txt``: the task's validation windows as text, so that
        ``sinkscope sinks CKPT --text-file CKPT/validation.txt --bos none`` measures on them."""
        return {"validation.txt": self.validation_text().encode("utf-8")}


def trigger_token_names(vocab: int) -> list[str]:
    """The trigger task's tokens by id: ``<bos>``, ``<trigger>``, ``t2`` .. ``t{V-1}``."""
    return ["<bos>", "<trigger>"] + [f"t{i}" for i in range(2, vocab)]


def trigger_tokenizer(vocab: int):
    """A word-level tokenizer whose vocabulary is the task's tokens (ids as in the task).

    Text is split on whitespace; ``<bos>`` and ``<trigger>`` are special tokens (BOS and EOS are
    ``<bos>``). A word that is not a token maps to ``<bos>`` (there is no spare id for an unknown
    token: every id is one the task uses).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = trigger_token_names(vocab)
    backend = Tokenizer(models.WordLevel({name: i for i, name in enumerate(names)}, unk_token="<bos>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<bos>",
                                   unk_token="<bos>", additional_special_tokens=["<trigger>"])


@dataclass
class TriggerBatches(tdata.SeededOrder):
    """Training windows of the trigger task from a generator seeded by the run seed (paired)."""

    task: TriggerTask
    batch_size: int
    seed: int
    index: int = 0

    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(tdata.batch_seed(self.seed))

    def next(self, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        seq = self.task.sample(self.batch_size, self.task.length, self.generator)  # (B, T+1): the global batch
        self.index += 1
        per = self.batch_size // world_size
        mine = seq[rank * per:(rank + 1) * per]  # (B / world, T+1)
        return mine[:, :-1].contiguous(), mine[:, 1:].contiguous()


# ---- building a task from options --------------------------------------------------------------------


def parse_fields(defaults, items: list[str] | None, flag: str, *, where: str = "") -> dict:
    """``key=value`` strings (``flag``: ``--set``, ``--task-set``) as {field: value} for the dataclass ``defaults``.

    A value is a Python literal (``ast.literal_eval``), else the raw text. It must have the type
    of the field's value in ``defaults``: an int is taken for a float field, and a str field
    takes the raw text. Unknown keys (``where`` names what they were given for) and values of
    the wrong type raise a one-sentence :class:`SinkscopeError` that lists the valid keys.
    """
    names = [f.name for f in dataclasses.fields(defaults)]
    valid = ", ".join(names)
    out: dict = {}
    for item in items or []:
        key, sep, raw = str(item).partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise SinkscopeError(f"{flag} takes key=value, not {item!r}; valid keys: {valid}.")
        if key not in names:
            raise SinkscopeError(f"unknown {flag} key {key!r}{where}{suggest(key, names)}; valid keys: {valid}.")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        expected = type(getattr(defaults, key))
        if expected is str and not isinstance(value, str):
            value = raw
        elif expected is float and type(value) is int:
            value = float(value)
        if type(value) is not expected:
            raise SinkscopeError(f"{flag} {key} needs a {expected.__name__} value, not {raw!r}; valid keys: {valid}.")
        out[key] = value
    return out


def parse_task_options(task: str, items: list[str] | None) -> dict:
    """``key=value`` strings (``--task-set``) checked against the task's options; one-sentence errors."""
    if task == "text":
        if items:
            raise SinkscopeError(f"--task-set is for synthetic tasks; the text task takes {option('text_file')}, {option('dataset')}, "
                                 "--tokenizer and --windows.")
        return {}
    return parse_fields(TriggerOptions(), items, "--task-set", where=f" for the {task} task")


def make_task(task: str, block_size: int, *, corpus=None, tokenizer=None, windows: str | None = None,
              val_tokens: int | None = None, task_options: list[str] | None = None) -> Task:
    """The task named ``task`` for a model of context ``block_size``."""
    if task == "text":
        return TextTask(corpus, tokenizer, block_size, windows=windows or "doc-start", val_tokens=val_tokens)
    if task == "trigger":
        return TriggerTask(TriggerOptions(**parse_task_options(task, task_options)), block_size)
    raise SinkscopeError(f"unknown --task {task!r}{suggest(task, TASKS)}; tasks: {', '.join(TASKS)}.")


def checkpoint_windows(checkpoint_dir: str | os.PathLike, *, seq_len: int | None = None, n_seqs: int,
                       seed: int) -> Windows:
    """Validation windows of the task a checkpoint was trained on, for probe runs.

    Text tasks: the checkpoint's validation split (never training text) under its window policy
    (``TextTask.windows``); the corpus is reloaded from the recorded ``--text-file``/``--dataset``
    (or the bundled one) and must hash to the recorded stream. Synthetic tasks: a validation draw
    of the task seeded by ``seed`` (``TriggerTask.windows``). ``seq_len`` defaults to the task's
    window length (text: ``block_size``). Checkpoints from before tasks existed are text with
    ``random`` windows.
    """
    from sinkscope.models.checkpoint_folder import read_config

    meta = read_config(checkpoint_dir)
    options = meta.get("train_options", {})
    data = meta.get("data", {})
    block_size = int(meta["model"]["block_size"])
    task_name = options.get("task") or "text"
    if task_name == "text":
        from sinkscope.data.corpus import load_corpus

        corpus = load_corpus(options.get("text_file"), options.get("dataset"))
        if data.get("corpus_sha256") and corpus.sha256 != data["corpus_sha256"]:
            raise SinkscopeError(
                f"the corpus found now differs from the one the checkpoint in {checkpoint_dir} was trained on "
                "(corpus hash); its validation split cannot be rebuilt."
            )
        tokenizer = tdata.load_tokenizer_folder(Path(checkpoint_dir), f"of the checkpoint in {checkpoint_dir}")
        task = TextTask(corpus, tokenizer, block_size, windows=options.get("windows") or "random",
                        val_tokens=options.get("val_tokens"))
        if task.info["stream_sha256"] != data.get("stream_sha256", task.info["stream_sha256"]):
            raise SinkscopeError(
                f"the token stream rebuilt for the checkpoint in {checkpoint_dir} differs from the one it was trained on."
            )
    else:
        task = make_task(task_name, block_size, task_options=options.get("task_options"))
    length = getattr(task, "length", block_size)
    return task.windows(seq_len=length if seq_len is None else seq_len, n_seqs=n_seqs, seed=seed)
