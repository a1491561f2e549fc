"""Stage 1 of a run: a :class:`~sinkscope.run.plan.Plan` made ready to load (a :class:`Prepared`).

Everything left before the model loads, in the order a user's mistakes are found in: the run
folder's lock (and its check under the lock: another writer may have written there since the
plan), the corpus, the device and dtype, the model's config (its sizes, ``Command.check_source``),
the lengths. The plan's own checks (options, command, model, text file) are not repeated.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinkscope.commands.spec import Command, longest, RunOptions, seq_lens
from sinkscope.data import corpus as corpus_mod
from sinkscope.data.corpus import given_windows as _given_windows
from sinkscope.errors import option, SinkscopeError
from sinkscope.forward import distributed
from sinkscope.models.model_config import check_model_size, config_file_dict, context_length
from sinkscope.models.devices import check_device_map, resolve_device, resolve_dtype
from sinkscope.models.resolve import Source
from sinkscope.models.trained_context import config_context, is_native_config, require_positions
from sinkscope.run.plan import Plan
from sinkscope.run.result import _locked
from sinkscope.store.files import check_inputs_outside
from sinkscope.store.results import check_run_dir, default_run_dir
from sinkscope.store.statefile import read_header


DEFAULT_SEQ_LEN = 512
#: the most tokens of its text a one-window command (``explore``) reads when --seq-len is not given.
ONE_WINDOW_SEQ_LEN = 4096


@dataclass
class Inputs:
    """What a caller may hand over instead of names: a loaded model, texts, windows."""

    model: torch.nn.Module | None = None
    tokenizer: Any = None
    texts: list[str] | None = None
    windows: np.ndarray | None = None


@dataclass
class Prepared:
    """A :class:`~sinkscope.run.plan.Plan` made ready to load: its lock taken, corpus read, lengths settled."""

    command: Command
    options: RunOptions
    source: Source
    out_dir: Path | None
    corpus: corpus_mod.Corpus | None
    device: str
    rank: int = 0
    world_size: int = 1
    inputs: Inputs = field(default_factory=Inputs)
    #: what to undo when the run ends: the run folder's lock, a TransformerBridge's components.
    cleanup: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    #: a trainer checkpoint with no text given: windows come from its own validation split.
    checkpoint_split: bool = False
    #: columns that hold for every row beyond the source's own (a series' ``step`` and ``revision``).
    conditions: dict = field(default_factory=dict)
    #: the sha256 of the token windows this run must measure (a series: the first revision's), or None.
    expect_tokens: str | None = None
    #: the plan this run was prepared from (the manifest's ``plan``).
    plan: Plan | None = None
    #: ``sinks --inputs random|repeated``: how the windows were drawn (the manifest's ``windows.inputs``).
    inputs_record: dict | None = None

    @property
    def progress_file(self) -> Path | None:
        """Where a run keeps its accumulator checkpoint for ``--resume`` (beside the run folder)."""
        return None if self.out_dir is None else progress_path(self.out_dir)


def progress_path(out_dir: Path) -> Path:
    """``.NAME.progress.safetensors`` beside the run folder: the accumulators for ``--resume``.

    A safetensors file with a JSON header (``store/statefile.py``): reading it runs no code. Earlier
    versions wrote a pickle, ``.NAME.progress.pt``, which is never read (:func:`_check_progress`).
    """
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}.progress.safetensors"


def _check_progress(out_dir: Path) -> None:
    """``--resume`` needs a progress file of this version; an old pickle one is named, never loaded."""
    if progress_path(out_dir).is_file():
        read_header(progress_path(out_dir), "the progress file of the interrupted run")  # damaged: now, not after loading
        return
    if (Path(out_dir).parent / f".{Path(out_dir).name}.progress.pt").is_file():
        raise SinkscopeError(f"the interrupted run at {out_dir} was checkpointed by an earlier sinkscope in a pickle "
                             f"file, which is not read (loading a pickle can run code); run without {option('resume', True)}.")
    raise SinkscopeError(f"there is no interrupted run to resume at {out_dir}; run without {option('resume', True)}.")


def first_inputs(options: RunOptions, inputs: Inputs | None) -> tuple[RunOptions, Inputs]:
    """Windows handed over are checked and converted first: their shape decides ``n_seqs`` (and the
    checks see it) and ``seq_len``."""
    inputs = inputs or Inputs()
    if inputs.windows is not None:
        inputs = replace(inputs, windows=_given_windows(inputs.windows).tokens)
        options = replace(options, n_seqs=int(inputs.windows.shape[0]))
    return options, inputs


def prepare(planned: Plan, inputs: Inputs | None = None, *, write: bool = True,
            cleanup: contextlib.ExitStack | None = None) -> Prepared:
    """Everything left before the model loads, in the order a user's mistakes are found in.

    The plan's checks (``plan.plan``: options, command, model, text file, run folder) are not
    repeated. Here: the run folder's lock (process 0, into ``cleanup``, held until the folder is
    written: a second writer fails now, and the place is proven writable), the corpus, the device
    and dtype, the model's config (its sizes, ``Command.check_source``), the lengths.
    """
    from sinkscope.commands import get_command

    inputs = inputs or Inputs()
    command, options, source = get_command(planned.command), planned.options, planned.source
    cleanup = cleanup if cleanup is not None else contextlib.ExitStack()
    rank, world_size = distributed.world()
    if world_size > 1 and options.resume:
        raise SinkscopeError(f"{option('resume', True)} is not supported in a data-parallel (torchrun) run; run it in one process.")
    out_dir = None
    if write:
        out_dir = Path(options.out) if options.out else default_run_dir(source.label or source.location, options.seed,
                                                                             command.name)
        if rank == 0:
            cleanup.enter_context(_locked(out_dir))
    # A trainer checkpoint measured without a text of the user's is measured on its own validation
    # split (never training text), under the window policy it was trained with.
    checkpoint_split = (inputs.model is None and source.kind == "checkpoint" and inputs.windows is None
                        and inputs.texts is None and not options.text_file and not options.dataset
                        and getattr(options, "inputs", "text") == "text")
    corpus = None
    if inputs.windows is None and not checkpoint_split:
        text = getattr(options, "text", None)  # explore --text
        if inputs.texts is None and text is not None:
            inputs = replace(inputs, texts=[text])
        corpus = corpus_mod.Corpus("texts", list(inputs.texts), {"kind": "texts"}) if inputs.texts is not None \
            else corpus_mod.load_corpus(options.text_file, options.dataset)
    device = distributed.local_device(options.device) if world_size > 1 else options.device
    resolve_dtype(options.dtype, resolve_device(device))  # a bad --device/--dtype fails here, in a second
    check_device_map(options.device_map, source)
    if inputs.model is None:
        check_model_size(source)  # sizes in config.json: positive, and a model that fits in memory
        command.check_source(options, source)
    result = Prepared(command, options, source, out_dir, corpus, device, rank, world_size, inputs, cleanup,
                      checkpoint_split, dict(planned.conditions), plan=planned)
    if out_dir is not None:
        if not options.resume:
            check_run_dir(out_dir, options.overwrite)
        else:
            _check_progress(out_dir)
        check_inputs_outside(out_dir, {"the model": source.path, "the text file": options.text_file})
    lengths = seq_lens(options.seq_len)
    if lengths is not None and len(lengths) == 1:  # seq_len=[512] is the plain run at 512
        options = replace(options, seq_len=lengths[0])
    elif lengths is not None:
        options = replace(options, seq_len=lengths)  # sorted, distinct
    result.options = options
    if len(lengths or ()) > 1 and inputs.windows is not None:
        raise SinkscopeError("windows= are measured at their own length; several seq_len values need texts or a corpus.")
    limit = context_length(source) if inputs.model is None else _model_context(inputs.model)
    if options.seq_len is None and inputs.windows is None and not checkpoint_split:
        cap = ONE_WINDOW_SEQ_LEN if command.one_window else DEFAULT_SEQ_LEN  # explore: the text, up to 4,096 tokens
        result.options = replace(options, seq_len=min(cap, limit or cap))
    elif inputs.windows is not None:
        result.options = replace(options, seq_len=int(inputs.windows.shape[1]), n_seqs=int(inputs.windows.shape[0]))
    if not command.reads_past_context and inputs.model is None and is_native_config(config_file_dict(source)):
        require_positions(longest(result.options.seq_len), ("wpe", limit))  # the trainer's table, before loading
    return result


def _model_context(model: torch.nn.Module) -> int | None:
    return config_context(getattr(model, "config", None))
