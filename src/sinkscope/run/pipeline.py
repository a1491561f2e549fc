"""One pipeline for every measuring command: plan -> load -> run -> write, once.

    plan     validate every option a user can get wrong, resolve the model source, the output
             folder and the corpus (seconds; nothing heavy is loaded)
    load     the tokenizer first (a corpus too short for the windows costs seconds, not a model
             load), the windows, then the model in the requested dtype
    run      the command's probes over the windows (forward/runner.py), with resume from accumulator
             checkpoints, Ctrl-C, torchrun data parallelism and out-of-memory back-off
    write    the tidy table, the manifest and the token ids into the run folder, atomically,
             then the report

A command (``commands/``) only declares its options, its probes and its checks; the CLI and the
Python API (``api.py``) are two thin faces of :func:`execute`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch

from sinkscope.data import corpus as corpus_mod
from sinkscope.forward import distributed
from sinkscope.capture import hooks as hp
from sinkscope.capture.families import ModelSpec, layer_windows
from sinkscope.errors import Interrupted, SinkscopeError, option
from sinkscope.store.files import check_inputs_outside
from sinkscope.models.bridge import is_bridge, unbridged
from sinkscope.commands.spec import Command, RunOptions, check_options, seq_lens
from sinkscope.run.plan import Plan as RunPlan
from sinkscope.run.result import Result, _locked
from sinkscope.run.plan import plan as plan_runs
from sinkscope.probes import get_probe
from sinkscope.probes.base import Probe
from sinkscope.store.results import (
    NOT_CONDITIONS,
    base_manifest,
    check_run_dir,
    default_run_dir,
    layer_type_rows,
    rows_to_frame,
)
from sinkscope.forward.runner import check_capture, run_probes
from sinkscope.store.statefile import load_state, read_header, save_state
from sinkscope.models.trained_context import (
    config_context,
    is_native_config,
    learned_positions,
    require_positions,
    warn_past_context,
)
from sinkscope.run.loaders import LoadedModel, embedding_rows, load_model, load_tokenizer, remote_code_note, model_config_summary
from sinkscope.models.resolve import Source
from sinkscope.models.devices import check_device_map, resolve_device, resolve_dtype
from sinkscope.models.config import check_model_size, config_file_dict, context_length, vocab_size

DEFAULT_SEQ_LEN = 512
#: options that change how a run is carried out, not any number (left out of the resume fingerprint).
NOT_IN_FINGERPRINT = ("batch_size", "progress", "overwrite", "resume", "figures", "checkpoint_seconds", "out")


# ---- plan ----------------------------------------------------------------------------------------


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
    plan: RunPlan | None = None
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


def _in_memory_source(model: torch.nn.Module) -> Source:
    """A Source describing a model handed over as an object (nothing to reload)."""
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None) or type(model).__name__
    return Source("object", f"<{type(model).__name__}>", None, label=Path(str(name)).name or type(model).__name__)


def _inputs_first(command: Command, options: RunOptions, inputs: Inputs) -> tuple[RunOptions, Inputs]:
    """Windows handed over are checked and converted first: their shape decides ``n_seqs`` (and the
    checks see it) and ``seq_len``."""
    if inputs.windows is not None:
        inputs = replace(inputs, windows=_given_windows(inputs.windows).tokens)
        options = replace(options, n_seqs=int(inputs.windows.shape[0]))
    return options, inputs


def plan_run(command: Command, options: RunOptions, inputs: Inputs | None = None, *,
             write: bool = True) -> tuple[RunPlan, Inputs]:
    """The :class:`~sinkscope.run.plan.Plan` of one run (a model handed over as an object is its own source)."""
    inputs = inputs or Inputs()
    if options.revision is not None and "," in str(options.revision):
        raise SinkscopeError(f"revision {options.revision!r} names several; one run measures one revision (the command "
                             f"line's {option('revision')} A,B,... measures each into one folder: comparison.execute_several "
                             "with revisions= and series=True).")
    options, inputs = _inputs_first(command, options, inputs)
    if inputs.model is None:
        return plan_runs(command, options, write=write)[0], inputs
    check_options(options)
    command.check(options)
    return RunPlan(command.name, options, _in_memory_source(inputs.model)), inputs


def prepare(planned: RunPlan, inputs: Inputs | None = None, *, write: bool = True,
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
        out_dir = Path(options.out) if options.out else default_run_dir(source.label or source.location, options.seed)
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


def longest(seq_len: int | tuple[int, ...] | None) -> int | None:
    """The longest of the run's lengths (the windows are drawn at it; shorter ones are their prefixes)."""
    lengths = seq_lens(seq_len)
    return None if lengths is None else max(lengths)


def _model_context(model: torch.nn.Module) -> int | None:
    return config_context(getattr(model, "config", None))


# ---- load ------------------------------------------------------------------------------------------


@dataclass
class Loaded:
    """The model, its windows and what loading cost."""

    model: LoadedModel
    windows: corpus_mod.Windows
    spec: ModelSpec
    load_s: float
    #: the logits check of the capture on the first window (``runner.check_capture``), for the manifest
    capture_check: dict = field(default_factory=dict)
    #: the model's trained context (``trained_context.config_context``), None where its config does not say
    trained_context: int | None = None


#: the most tokens of its text a one-window command (``explore``) reads when --seq-len is not given.
ONE_WINDOW_SEQ_LEN = 4096


def _windows(plan_: Prepared, tokenizer, log) -> corpus_mod.Windows:
    options, corpus = plan_.options, plan_.corpus
    inputs = getattr(options, "inputs", "text")
    if inputs != "text":  # sinks --inputs random | repeated: Gu et al.'s inputs, no corpus read
        bos_id = corpus_mod.resolve_bos(options.bos, tokenizer)
        special = set(getattr(tokenizer, "all_special_ids", None) or [])
        windows, plan_.inputs_record = corpus_mod.synthetic_windows(
            inputs, len(tokenizer), special, seq_len=longest(options.seq_len), n_seqs=options.n_seqs,
            seed=options.seed, bos_id=bos_id)
        log(f"Drawing {options.n_seqs} windows of {inputs} tokens ...")
        return windows
    log(f"Tokenising the corpus {corpus.describe()} ...")
    bos_id = corpus_mod.resolve_bos(options.bos, tokenizer)
    doc_ids = corpus_mod.tokenize_documents(tokenizer, corpus.documents)
    if plan_.command.one_window:  # explore: the text itself, its first seq_len tokens
        windows = corpus_mod.text_window(doc_ids, seq_len=longest(options.seq_len), bos_id=bos_id)
        plan_.options = replace(options, seq_len=int(windows.tokens.shape[1]), n_seqs=1)
        return windows
    source = plan_.source
    hint = ("; a trigger-task checkpoint's vocabulary is its task's words: measure it without a text, on its own "
            "validation windows") if source.kind == "checkpoint" else ""
    corpus_mod.check_unknown_share(doc_ids, tokenizer, source.label or source.location, log, hint)
    return corpus_mod.make_windows(doc_ids, seq_len=longest(options.seq_len), n_seqs=options.n_seqs, seed=options.seed,
                                   bos_id=bos_id)


def _checkpoint_windows(plan_: Prepared, log) -> corpus_mod.Windows:
    """A trainer checkpoint's validation windows (``train.tasks.checkpoint_windows``); fixes seq_len."""
    from sinkscope.train.tasks import checkpoint_windows

    options = plan_.options
    log(f"Drawing {options.n_seqs} windows from the validation split of {plan_.source.location} (pass "
        "--text-file to measure other text) ...")
    windows = checkpoint_windows(plan_.source.path, seq_len=longest(options.seq_len), n_seqs=options.n_seqs,
                                 seed=options.seed)
    if len(seq_lens(options.seq_len) or ()) <= 1:
        plan_.options = replace(options, seq_len=int(windows.tokens.shape[1]))
    return windows


def _given_windows(tokens) -> corpus_mod.Windows:
    """Token ids a caller handed over as ``windows=``, checked: integers, (n_seqs >= 1, seq_len >= 2), ids >= 0.

    A numpy array, a torch tensor or nested lists; floats are refused rather than truncated.
    """
    if isinstance(tokens, torch.Tensor):
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
    corpus_mod.check_token_range(array, None)  # negative ids
    return corpus_mod.Windows(array, None, [], int(array.size))


def load(plan_: Prepared, log) -> Loaded:
    """Tokenizer, windows, model (in the requested dtype), its spec; checks that need them."""
    options, inputs = plan_.options, plan_.inputs
    windows = _given_windows(inputs.windows) if inputs.windows is not None else None
    started = time.perf_counter()
    if inputs.model is not None:
        model, tokenizer = inputs.model, inputs.tokenizer
        if is_bridge(model):
            model = plan_.cleanup.enter_context(unbridged(model))
            tokenizer = tokenizer if tokenizer is not None else getattr(inputs.model, "tokenizer", None)
        if windows is None and tokenizer is None:
            raise SinkscopeError("texts need a tokenizer: pass tokenizer=..., or token ids as windows=...")
        plan_.cleanup.callback(model.train, model.training)  # a caller's model leaves in the mode it came in
        loaded = LoadedModel(model.eval(), tokenizer, plan_.source, next(model.parameters()).dtype,
                             next(model.parameters()).device)
    else:
        if plan_.checkpoint_split:
            windows = _checkpoint_windows(plan_, log)
            options = plan_.options
        note = remote_code_note(plan_.source) if options.trust_remote_code else None
        if note:
            log(f"trust_remote_code: {note}")
        tokenizer = load_tokenizer(plan_.source, trust_remote_code=options.trust_remote_code)
        if windows is None and tokenizer is not None:
            windows = _windows(plan_, tokenizer, log)
            options = plan_.options  # a one-window command's length is its text's
            corpus_mod.check_token_range(windows.tokens, vocab_size(plan_.source))
        _check_same_windows(plan_, windows)  # before the model loads, when the tokenizer came first
        log(f"Loading {plan_.source.label or plan_.source.location} ...")
        _warn_if_unfinished(plan_.source, log)
        loaded = load_model(plan_.source, device=plan_.device, dtype=options.dtype, device_map=options.device_map,
                            trust_remote_code=options.trust_remote_code, tokenizer=tokenizer, log=log)
    load_s = time.perf_counter() - started
    spec = ModelSpec.from_model(loaded.model)  # also rejects unsupported families
    trained = _model_context(loaded.model)
    if not plan_.command.reads_past_context:  # a learned table stops the run; computed positions warn (models/trained_context.py)
        require_positions(longest(options.seq_len), learned_positions(loaded.model))
        warn_past_context(longest(options.seq_len), trained, log)
    plan_.command.check_model(options, spec)
    if windows is None:
        windows = _windows(plan_, loaded.tokenizer, log)
        options = plan_.options
    _check_same_windows(plan_, windows)
    corpus_mod.check_token_range(windows.tokens, embedding_rows(loaded.model))
    _fill_bos_token_id(plan_, loaded.tokenizer, windows)
    _check_measurable(plan_, loaded.model, spec, int(windows.tokens.shape[1]))
    check = check_capture(loaded.model, windows.tokens, attention=options.attention,
                          device=None if options.device_map else loaded.device)
    return Loaded(loaded, windows, spec, load_s, check, trained)


def _check_same_windows(plan_: Prepared, windows: corpus_mod.Windows | None) -> None:
    """A run of a series measures the first one's token windows, or stops in one sentence (before its model loads)."""
    if windows is None or plan_.expect_tokens is None or windows.sha256 == plan_.expect_tokens:
        return
    what = plan_.source.location + (f" at revision {plan_.source.revision}" if plan_.source.revision else "")
    raise SinkscopeError(f"{what} turns the corpus into other token windows than the first of the series (its "
                         "tokenizer differs), so its numbers would not be comparable; measure it on its own.")


def _check_measurable(plan_: Prepared, model, spec: ModelSpec, seq_len: int) -> None:
    """One sentence, before the run, for a probe that could only write an empty table on this model."""
    windows = layer_windows(model, spec.n_layers)
    for name, _ in plan_.command.probes(plan_.options, spec):
        reason = get_probe(name).unmeasurable(spec, windows, seq_len)
        if reason:
            raise SinkscopeError(f"the probe {name} cannot measure this model: {reason}.")
    from sinkscope.store.explorer_format import check_heads_exist

    check_heads_exist(plan_.options.explore_heads, spec.n_layers, spec.n_heads, spec.attention_layers)


def _warn_if_unfinished(source: Source, log) -> None:
    """A trainer checkpoint short of its schedule (stopped with --stop-at, interrupted) is measured with a warning."""
    if source.kind != "checkpoint":
        return
    from sinkscope.models.checkpoint_folder import read_config

    meta = read_config(source.path)
    recorded = meta.get("train_options")
    step, steps = meta.get("step"), recorded.get("steps") if isinstance(recorded, dict) else None
    if isinstance(step, int) and isinstance(steps, int) and step < steps:
        log(f"warning: the checkpoint {source.location} is at step {step} of the {steps} its training was scheduled "
            "for (stopped or interrupted); it is measured as it is (continue it with `sinkscope train --resume`).")


def _fill_bos_token_id(plan_: Prepared, tokenizer, windows: corpus_mod.Windows) -> None:
    """A command whose options have ``bos_token_id`` (``circuit``) gets the tokenizer's BOS id there, if unset.

    Else the windows' BOS; it stays None when neither has one. Filled before the run, so the
    manifest and the resume fingerprint record the id used.
    """
    if not hasattr(plan_.options, "bos_token_id") or plan_.options.bos_token_id is not None:
        return
    bos = getattr(tokenizer, "bos_token_id", None)
    bos = bos if bos is not None else windows.bos_id
    if bos is not None:
        plan_.options = replace(plan_.options, bos_token_id=int(bos))


# ---- run -------------------------------------------------------------------------------------------


def _fingerprint(options: RunOptions, tokens_sha256: str, source: Source) -> str:
    """What must match for a resume: everything that changes a number (not batch size etc.)."""
    keep = {k: v for k, v in asdict(options).items() if k not in NOT_IN_FINGERPRINT}
    blob = json.dumps({"options": keep, "tokens": tokens_sha256, "source": source.to_dict()}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def available_probes(command: Command, specs: list[tuple[str, dict]], spec: ModelSpec, log) -> list[tuple[str, dict]]:
    """The command's probes that the model's hook points allow (``ModelSpec.missing_hooks``).

    A hook point an architecture lacks is absent, not wrong: a probe reading it is left out of a
    command's run with a warning naming the point (``sinks`` on a model with hyper-connections runs
    without massive activations); a probe named by the user (``measure --probe``), or a command
    left with no probe, is one sentence.
    """
    missing = set(spec.missing_hooks)
    weights_only = spec.attention_path != "interface"
    if not missing and not weights_only:
        return specs
    kept = []
    for name, params in specs:
        probe = get_probe(name)
        lacking = sorted(set(probe.hooks) & missing)
        needs_qkv = weights_only and hp.ATTN in probe.hooks and not probe.reads_weights_only
        if not lacking and not needs_qkv:
            kept.append((name, params))
            continue
        what = (f"the probe {name} reads {', '.join(lacking)}, which this {spec.family} model does not have" if lacking
                else f"the probe {name} reads queries, keys or values, which the eager fallback for this "
                     f"{spec.family} model does not give (its attention does not call transformers' attention "
                     "interface; sinkscope reads its weights only)")
        if command.name == "measure":
            raise SinkscopeError(f"{what} (`sinkscope ls hooks MODEL` lists what it has); choose other probes.")
        log(f"warning: {what}; it is left out of this {command.name} run.")
    if not kept:
        raise SinkscopeError(f"none of the {command.name} probes can run on this {spec.family} model (it lacks "
                             f"{', '.join(sorted(missing))}).")
    return kept


def _progress_tree(tree, path: Path) -> dict:
    """The probes' states of a progress file, checked for shape (a damaged file is one sentence)."""
    if not (isinstance(tree, dict) and isinstance(tree.get("probes"), list) and isinstance(tree.get("done"), list)):
        raise SinkscopeError(f"the progress file {path} is damaged or was not written by sinkscope; delete it, or "
                             f"run without {option('resume', True)}.")
    return tree


def run(plan_: Prepared, loaded: Loaded, log) -> tuple[list[Probe], float] | None:
    """Run the probes; returns (probes with merged accumulators, seconds), or None on processes > 0.

    A command with a ``followup`` runs in two stages over the same windows: the first stage's
    probes see every window (and are merged over processes) before the followup chooses the
    second stage's probes from them, so a choice such as "the dormant heads" is made on all the
    windows, never on a first batch. The checkpoint for ``--resume`` records the stage; a run
    killed in the second stage resumes there with the first stage's finished accumulators.
    The table holds the rows of both stages.
    """
    options, windows = plan_.options, loaded.windows
    rank, world_size = plan_.rank, plan_.world_size
    spec, model = loaded.spec, loaded.model
    fingerprint = _fingerprint(options, windows.sha256, plan_.source)
    progress_file = plan_.progress_file
    first, stop = distributed.share(len(windows.tokens), rank, world_size)
    state = None
    if options.resume:  # the header first: nothing else of a file that is not this run's is read
        what = "the progress file of the interrupted run"
        header = read_header(progress_file, what)
        if header.get("fingerprint") != fingerprint:
            raise SinkscopeError(
                f"the interrupted run at {plan_.out_dir} was started with other options, model or tokens; "
                f"rerun it with the same options, or without {option('resume', True)}.")
        state = {**header, **_progress_tree(load_state(progress_file, what), progress_file)}
    elif progress_file is not None and rank == 0:
        progress_file.unlink(missing_ok=True)  # a stale checkpoint of an abandoned run

    last_save = [time.monotonic()]

    def checkpointer(probes: list[Probe], stage: int, done: list[Probe]):
        def checkpoint(next_window: int) -> None:
            if progress_file is None or world_size > 1 or next_window >= stop:
                return
            if time.monotonic() - last_save[0] < options.checkpoint_seconds:
                return
            progress_file.parent.mkdir(parents=True, exist_ok=True)
            save_state(progress_file, {"probes": [p.state_dict() for p in probes],
                                       "done": [p.state_dict() for p in done]},
                       header={"fingerprint": fingerprint, "stage": stage, "next": next_window})
            last_save[0] = time.monotonic()
        return checkpoint

    def run_stage(probes: list[Probe], stage: int, done: list[Probe]) -> None:
        start = first
        if state is not None and state.get("stage", 0) == stage:
            for probe, probe_state in zip(probes, state["probes"]):
                probe.load_state_dict(probe_state)
            start = state["next"]
            log(f"Resuming at window {start} of {stop}" + (f" (stage {stage + 1})." if stage else "."))
        try:
            reader = plan_.command.read_windows or run_probes
            reader(model.model, windows.tokens[:stop], probes, batch_size=options.batch_size,
                       device=None if options.device_map else model.device, progress=options.progress and rank == 0,
                       attention=options.attention, start=start, on_batch_done=checkpointer(probes, stage, done),
                       log=log)
        except KeyboardInterrupt:
            if progress_file is not None and progress_file.is_file():
                raise Interrupted(f"interrupted; rerun the same command with {option('resume', True)} to continue from "
                                  f"{plan_.out_dir}'s last checkpoint.") from None
            raise

    def build(specs: list[tuple[str, dict]]) -> list[Probe]:
        return [get_probe(name)(spec, **params) for name, params in specs]

    if spec.attention_path != "interface":
        from sinkscope.capture.discover import EAGER_FALLBACK

        log(f"note: attention is read through the {EAGER_FALLBACK}.")
    log(f"Running {spec.family} ({spec.n_layers} layers x {spec.n_heads} heads) over "
        f"{windows.tokens.shape[0]} window{'s' if windows.tokens.shape[0] != 1 else ''} of {windows.tokens.shape[1]} tokens on {model.device} in "
        f"{str(model.dtype)[6:]}" + (f", {world_size} processes" if world_size > 1 else "") + " ...")
    started = time.perf_counter()
    first_specs = available_probes(plan_.command, plan_.command.probes(options, spec), spec, log)
    probes = build(first_specs)
    if state is not None and state.get("stage", 0) == 1:  # the first stage had finished
        for probe, probe_state in zip(probes, state["done"]):
            probe.load_state_dict(probe_state)
    else:
        run_stage(probes, 0, [])
    is_main = True
    if world_size > 1:
        is_main = distributed.merge_into_rank0(probes, lambda: build(first_specs))
    second: list[Probe] = []
    if plan_.command.followup is not None:
        specs = plan_.command.followup(options, spec, probes) if is_main else None
        if specs:
            specs = available_probes(plan_.command, specs, spec, log)
        if world_size > 1:
            specs = distributed.broadcast_from_rank0(specs)
        if specs:
            second = build(specs)
            log("Second stage over the same windows: " + "; ".join(
                f"{p.name} ({', '.join(f'{k}={v}' for k, v in p.options().items()) or 'no parameters'})"
                for p in second) + " ...")
            run_stage(second, 1, probes)
            if world_size > 1:
                distributed.merge_into_rank0(second, lambda: build(specs))
    run_s = time.perf_counter() - started
    if not is_main:
        return None
    return probes + second, run_s


# ---- assemble and write ------------------------------------------------------------------------


def run_conditions(source: Source) -> dict:
    """Columns that hold for every row of a run: a trainer checkpoint's variant, seed, step, tier."""
    if source.kind != "checkpoint":
        return {}
    from sinkscope.models.checkpoint_folder import read_config

    meta = read_config(source.path)
    return {key: meta.get(key) for key in ("variant", "seed", "step", "tier")}


def assemble(plan_: Prepared, loaded: Loaded, probes: list[Probe], run_s: float, rows: list | None = None) -> Result:
    """The table and the manifest of a finished run (``rows``: the table's rows, if not the probes')."""
    options, windows, source = plan_.options, loaded.windows, plan_.source
    conditions = {**run_conditions(source), **plan_.conditions}
    rows = list(rows) if rows is not None else [row for probe in probes for row in probe.rows()]
    model = loaded.model
    windows_per_layer = layer_windows(model.model, loaded.spec.n_layers)
    rows += layer_type_rows(rows, windows_per_layer)
    if not rows:
        raise SinkscopeError(f"the {plan_.command.name} run produced no numbers on this model "
                             f"({', '.join(p.name for p in probes)}: nothing to measure); no run folder was written.")
    frame = rows_to_frame(rows, run_conditions=conditions)
    decode_token_ids(frame, model.tokenizer)
    manifest = base_manifest(plan_.command.name, asdict(options))
    manifest.update(
        model={
            "source": source.to_dict(),
            "float32_cache": model.cache_path,
            "family": loaded.spec.family,
            "spec": asdict(loaded.spec),
            "n_parameters": sum(p.numel() for p in model.model.parameters()),
            "config": model_config_summary(model.model),
            "device_map": getattr(model.model, "hf_device_map", None),
            "layer_windows": windows_per_layer,
        },
        conditions=conditions,
        dtype=str(model.dtype).removeprefix("torch."),
        device=str(model.device),
        processes=plan_.world_size,
        corpus=_corpus_record(plan_, windows),
        windows={
            "seq_len": int(windows.tokens.shape[1]), "n_seqs": int(windows.tokens.shape[0]), "seed": options.seed,
            "bos_policy": options.bos, "bos_id": windows.bos_id, "tokens_sha256": windows.sha256,
            "tokenizer_bos_id": getattr(model.tokenizer, "bos_token_id", None),
            "rule": _window_rule(plan_),
            "trained_context": loaded.trained_context,
            "starts": [list(s) for s in windows.starts],
            **({"inputs": plan_.inputs_record} if plan_.inputs_record else {}),
        },
        probes={p.name: {"options": p.options(), "metrics": {m: asdict(i) for m, i in p.metrics.items()}}
                for p in probes},
        kernels=_kernel_choices(),
        capture_check=loaded.capture_check,
        timing={"load_s": round(loaded.load_s, 3), "run_s": round(run_s, 3),
                "tokens_per_s": round(windows.tokens.size / max(run_s, 1e-9), 1)},
        plan=None if plan_.plan is None else plan_.plan.to_dict(),  # what produced the run (plan.Plan)
    )
    arrays = {name: array for probe in probes for name, array in probe.arrays().items()}
    return Result(frame, manifest, windows.tokens, arrays=arrays)


# ---- several lengths, one run ------------------------------------------------------------------------


def prefix_windows(windows: corpus_mod.Windows, seq_len: int) -> corpus_mod.Windows:
    """The first ``seq_len`` tokens of every window (same documents, same starts, same BOS)."""
    return corpus_mod.Windows(np.ascontiguousarray(windows.tokens[:, :seq_len]), windows.bos_id, windows.starts,
                              windows.n_corpus_tokens)


def run_lengths(plan_: Prepared, loaded: Loaded, lengths: tuple[int, ...], log) -> list | None:
    """Run the command's probes once per length on prefixes of the same windows.

    The windows are drawn once at the longest length (``load``); the run at length n sees the
    first n tokens of each, so every length measures the same documents from the same starts.
    Each length is a complete run of :func:`run` (a causal model's first n positions are the
    same in the long window, but a probe's per-sequence quantities such as the value-norm
    median over the sequence are not, so nothing is cut out of the longest pass). Returns
    ``[(length, probes, seconds), ...]``, or None on processes other than 0. No accumulator
    checkpoint is kept (``--resume`` is refused with several lengths).
    """
    out = []
    for n in lengths:
        sub_plan = replace(plan_, options=replace(plan_.options, seq_len=n), out_dir=None)
        finished = run(sub_plan, replace(loaded, windows=prefix_windows(loaded.windows, n)), log)
        if finished is not None:
            out.append((n, *finished))
    return out if plan_.rank == 0 else None


def assemble_lengths(plan_: Prepared, loaded: Loaded, finished: list) -> Result:
    """One table over the lengths (a ``seq_len`` column on every row) plus the leak-model fit.

    The manifest is the run's at its longest length (its tokens are the longest windows; the
    shorter ones are their prefixes), with ``windows.seq_lens`` listing every length.
    """
    from sinkscope.stats.leak import LEAK_METRICS, P0_ERROR_NOT_REPORTED, error_not_reported, leak_rows

    rows = [replace(row, conditions=(*row.conditions, ("seq_len", n)))
            for n, probes, _ in finished for probe in probes for row in probe.rows()]
    windows = layer_windows(loaded.model.model, loaded.spec.n_layers)
    rows += leak_rows(rows, windows)
    longest_n, probes, _ = finished[-1]
    run_s = sum(seconds for _, _, seconds in finished)
    result = assemble(plan_, loaded, probes, run_s, rows=rows)
    result.manifest["windows"]["seq_lens"] = [n for n, _, _ in finished]
    result.manifest["timing"]["run_s_per_length"] = {str(n): round(s, 3) for n, _, s in finished}
    if any(row.probe == "leak_fit" for row in rows):
        exempt = error_not_reported(windows, finished[0][0])
        result.manifest["probes"]["leak_fit"] = {"options": {"fitted_at": finished[0][0], **(
            {"p0_error_not_reported": {"layers": exempt, "reason": P0_ERROR_NOT_REPORTED}} if exempt else {})},
                                                 "metrics": {m: asdict(i) for m, i in LEAK_METRICS.items()}}
    return result


def _warn_non_finite(table: pd.DataFrame, log) -> None:
    """A table with NaN or infinite values is written, with a warning naming where they are."""
    bad = table[~np.isfinite(table["value"].to_numpy(dtype=float))]
    if bad.empty:
        return
    extra = [c for c in table.columns if c not in NOT_CONDITIONS]
    first = bad.iloc[0]
    where = ", ".join(f"{c} {first[c]}" for c in extra if not pd.isna(first[c]))
    log(f"warning: {len(bad)} of the {len(table)} numbers are not finite (NaN or inf), the first {first['metric']}"
        f"{f' at {where}' if where else ''}; the model's arithmetic overflowed there (a dose or a --dtype too large "
        "for it).")


def _kernel_choices() -> list[dict]:
    """Which fused attention kernel ran for each kind of call (capture/kernels.py), for the manifest."""
    from sinkscope.capture.kernels import kernel_choices

    return kernel_choices()


def decode_token_ids(frame: pd.DataFrame, tokenizer) -> None:
    """Rows that carry a ``token_id`` (per-token rows, e.g. ``token_gate``) get its text in ``token``.

    The column goes right after ``token_id``: ``tokenizer.decode([id])`` as the model's tokenizer
    writes that one token (special tokens kept, no clean-up); empty without a tokenizer.
    """
    if "token_id" not in frame.columns:
        return
    ids = frame["token_id"]
    texts = [None if pd.isna(i) or tokenizer is None else
             tokenizer.decode([int(i)], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    frame["token_id"] = ids.astype("Int64")
    frame.insert(frame.columns.get_loc("token_id") + 1, "token", pd.Series(texts, dtype="string", index=frame.index))


def _corpus_record(plan_: Prepared, windows: corpus_mod.Windows) -> dict | None:
    corpus = plan_.corpus
    if plan_.inputs_record:  # no text was read
        return {"kind": f"{plan_.inputs_record['kind']} tokens", "name": plan_.inputs_record["kind"], "n_tokens": 0}
    if plan_.checkpoint_split:
        return {"kind": "checkpoint validation split", "checkpoint": plan_.source.location,
                "checkpoint_abs_path": str(Path(plan_.source.path).resolve()), "n_tokens": windows.n_corpus_tokens}
    if corpus is None:
        return None
    return {**corpus.info, "name": corpus.name, "sha256": corpus.sha256, "n_documents": len(corpus.documents),
            "n_tokens": windows.n_corpus_tokens}


def _window_rule(plan_: Prepared) -> str:
    if plan_.inputs_record:
        return plan_.inputs_record["rule"] + " (seeded by seed); BOS prepended when bos_id is set"
    if plan_.checkpoint_split:
        return ("the checkpoint's validation split under the window policy it was trained with "
                "(sinkscope.train.tasks.checkpoint_windows, seeded by seed); the BOS policy is the task's")
    if plan_.corpus is None:
        return "token ids given by the caller"
    return ("non-overlapping per-document chunks, drawn without replacement by numpy.random.default_rng(seed), "
            "kept in corpus order; BOS prepended when bos_id is set")


def execute(command: Command, options: RunOptions, inputs: Inputs | None = None, *, write: bool = True,
            log: Callable[[str], None] | None = None) -> Result | None:
    """plan -> load -> run -> assemble -> (write): one run, the whole pipeline.

    Returns the :class:`Result` (saved in ``options.out`` or ``reports/<run-id>`` when
    ``write``), or None on data-parallel processes other than 0. Several models or revisions:
    ``plan.plan`` then ``executors.execute``.
    """
    planned, inputs = plan_run(command, options, inputs, write=write)
    return run_plan(planned, inputs, write=write, log=log)


def run_plan(planned: RunPlan, inputs: Inputs | None = None, *, write: bool = True,
             log: Callable[[str], None] | None = None) -> Result | None:
    """Prepare, load, run and write one plan (``plan.plan``'s checks are not repeated)."""
    log = log or (lambda message: print(message, file=sys.stderr))
    with contextlib.ExitStack() as cleanup:  # the run folder's lock; a bridge's components set aside
        prepared = prepare(planned, inputs, write=write, cleanup=cleanup)
        return carry_out(prepared, write, log)


def carry_out(plan_: Prepared, write: bool, log, *, finish: bool = True) -> Result | None:
    """load -> run -> assemble -> (write) for a plan; ``finish`` ends the data-parallel group after."""
    if plan_.world_size > 1:
        distributed.init()
        if plan_.rank != 0:
            log = lambda message: None  # noqa: E731 - only process 0 talks
    loaded = load(plan_, log)
    lengths = seq_lens(plan_.options.seq_len) or ()
    finished = run_lengths(plan_, loaded, lengths, log) if len(lengths) > 1 else run(plan_, loaded, log)
    if finished is None:
        if finish:
            distributed.finish()
        return None
    result = assemble_lengths(plan_, loaded, finished) if len(lengths) > 1 else assemble(plan_, loaded, *finished)
    if len(lengths) <= 1:
        _add_explorer(plan_, loaded, result, log)
    _warn_non_finite(result.table, log)
    if write:
        result.save(plan_.out_dir, overwrite=plan_.options.overwrite,
                    figures=plan_.options.figures)
        if plan_.progress_file is not None:
            plan_.progress_file.unlink(missing_ok=True)
        log(f"Wrote {plan_.out_dir}")
    if plan_.world_size > 1 and finish:
        distributed.finish()
    return result


def _run_p0(table: pd.DataFrame, spec: ModelSpec):
    """The run's per-head ``p0_mass`` as an (L, H) array (NaN where it has none), or None without such rows."""
    rows = table[(table.metric == "p0_mass") & table.layer.notna() & table["head"].notna()]
    if rows.empty or rows.duplicated(["layer", "head"]).any():
        return None
    p0 = np.full((spec.n_layers, spec.n_heads), np.nan)
    p0[rows.layer.astype(int).to_numpy(), rows["head"].astype(int).to_numpy()] = rows["value"].to_numpy(dtype=float)
    return p0


def _add_explorer(plan_: Prepared, loaded: Loaded, result: Result, log) -> None:
    """The explorer's patterns (``forward/explore.py``) into the result and its manifest (``explorer``)."""
    from sinkscope.forward.explore import explore

    options = plan_.options
    if plan_.command.read_windows is not None:  # stream: its windows are read through a bounded cache
        return
    found = explore(loaded.model.model, loaded.model.tokenizer, loaded.spec, loaded.windows.tokens,
                    heads=options.explore_heads, windows=options.explore_windows, max_mb=options.explore_max_mb,
                    seed=options.seed, attention=options.attention,
                    device=None if options.device_map else loaded.model.device, log=log,
                    run_p0=_run_p0(result.table, loaded.spec), batch_size=options.batch_size)
    if found is not None:
        result.explorer, result.manifest["explorer"] = found


def option_fields(options_cls: type[RunOptions]) -> list[str]:
    """The option names of a command (for recipes and the API)."""
    return [f.name for f in fields(options_cls)]
