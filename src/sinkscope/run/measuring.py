"""Stage 3 of a run: the command's probes over the windows (``forward.runner``; ``stream`` reads
its own way), with resume from accumulator checkpoints, Ctrl-C, torchrun data parallelism and the
out-of-memory back-off; several lengths on prefixes of the same windows; the explorer's patterns.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from sinkscope.capture import hooks as hp
from sinkscope.capture.families import ModelSpec
from sinkscope.commands.spec import Command, RunOptions
from sinkscope.data import corpus as corpus_mod
from sinkscope.errors import Interrupted, option, SinkscopeError
from sinkscope.forward import distributed
from sinkscope.forward.runner import run_probes
from sinkscope.models.resolve import Source
from sinkscope.probes import get_probe
from sinkscope.probes.base import Probe
from sinkscope.run.load import Loaded
from sinkscope.run.prepare import Prepared
from sinkscope.run.result import Result
from sinkscope.store.statefile import load_state, read_header, save_state


#: options that change how a run is carried out, not any number (left out of the resume fingerprint).
NOT_IN_FINGERPRINT = ("batch_size", "progress", "overwrite", "resume", "figures", "checkpoint_seconds", "out")


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


def measure(prepared: Prepared, loaded: Loaded, log, riders: tuple[Probe, ...] = ()) -> tuple[list[Probe], float] | None:
    """Run the probes; returns (probes with merged accumulators, seconds), or None on processes > 0.

    A command with a ``followup`` runs in two stages over the same windows: the first stage's
    probes see every window (and are merged over processes) before the followup chooses the
    second stage's probes from them, so a choice such as "the dormant heads" is made on all the
    windows, never on a first batch. The checkpoint for ``--resume`` records the stage; a run
    killed in the second stage resumes there with the first stage's finished accumulators.
    The table holds the rows of both stages. ``riders`` run in the first stage's forward beside its probes
    but are not among those returned, checkpointed or merged (the explorer's probe: ``explorer_pass.rider``).
    """
    options, windows = prepared.options, loaded.windows
    rank, world_size = prepared.rank, prepared.world_size
    spec, model = loaded.spec, loaded.model
    fingerprint = _fingerprint(options, windows.sha256, prepared.source)
    progress_file = prepared.progress_file
    first, stop = distributed.share(len(windows.tokens), rank, world_size)
    state = None
    if options.resume:  # the header first: nothing else of a file that is not this run's is read
        what = "the progress file of the interrupted run"
        header = read_header(progress_file, what)
        if header.get("fingerprint") != fingerprint:
            raise SinkscopeError(
                f"the interrupted run at {prepared.out_dir} was started with other options, model or tokens; "
                f"rerun it with the same options, or without {option('resume', True)}.")
        state = {**header, **_progress_tree(load_state(progress_file, what), progress_file)}
    elif progress_file is not None and rank == 0:
        progress_file.unlink(missing_ok=True)  # a stale checkpoint of an abandoned run

    last_save = [time.monotonic()]

    def checkpointer(probes: list[Probe], stage: int, done: list[Probe]):
        def checkpoint(next_window: int, force: bool = False) -> None:
            """Save the accumulators for --resume at most every --checkpoint-seconds; ``force``: now (a reader
            interrupted at a point it can resume from: ``stream`` between two conditions)."""
            if progress_file is None or world_size > 1 or (next_window >= stop and not force):
                return
            if not force and time.monotonic() - last_save[0] < options.checkpoint_seconds:
                return
            progress_file.parent.mkdir(parents=True, exist_ok=True)
            save_state(progress_file, {"probes": [p.state_dict() for p in probes],
                                       "done": [p.state_dict() for p in done]},
                       header={"fingerprint": fingerprint, "stage": stage, "next": next_window})
            last_save[0] = time.monotonic()
            if not options.progress and not force and prepared.command.read_windows is None:
                # no bar: one line per checkpoint says the run moves (stream's reader says each condition it reads)
                log(f"Checkpoint: {next_window - first} of {stop - first} windows measured"
                    + (f" (stage {stage + 1})" if stage else "") + ", kept for --resume.")
        return checkpoint

    def run_stage(probes: list[Probe], stage: int, done: list[Probe], riding: tuple[Probe, ...] = ()) -> None:
        start = first
        if state is not None and state.get("stage", 0) == stage:
            for probe, probe_state in zip(probes, state["probes"]):
                probe.load_state_dict(probe_state)
            start = state["next"]
            log(f"Resuming at window {start} of {stop}" + (f" (stage {stage + 1})." if stage else "."))
        try:
            reader = prepared.command.read_windows or run_probes
            reader(model.model, windows.tokens[:stop], [*probes, *riding], batch_size=options.batch_size,
                       device=None if options.device_map else model.device, progress=options.progress and rank == 0,
                       attention=options.attention, start=start, on_batch_done=checkpointer(probes, stage, done),
                       log=log)
        except KeyboardInterrupt:
            if progress_file is not None and progress_file.is_file():
                raise Interrupted(f"interrupted; rerun the same command with {option('resume', True)} to continue from "
                                  f"{prepared.out_dir}'s last checkpoint.") from None
            raise

    def build(specs: list[tuple[str, dict]]) -> list[Probe]:
        return [get_probe(name)(spec, **params) for name, params in specs]

    if spec.attention_path != "interface":
        from sinkscope.capture.discover import EAGER_FALLBACK

        log(f"note: attention is read through the {EAGER_FALLBACK}.")
    log(f"Running {spec.family} ({spec.n_layers} layers x {spec.n_heads} heads) over "
        f"{windows.tokens.shape[0]} window{'s' if windows.tokens.shape[0] != 1 else ''} of {windows.tokens.shape[1]} tokens on {model.device} in "
        f"{str(model.dtype)[6:]}" + (f", {world_size} processes" if world_size > 1 else "") + " ...")
    for rider in riders:  # the explorer's probe says what it keeps as the windows are measured
        if getattr(rider, "announcement", None):
            log(rider.announcement)
    started = time.perf_counter()
    first_specs = available_probes(prepared.command, prepared.command.probes(options, spec), spec, log)
    probes = build(first_specs)
    if state is not None and state.get("stage", 0) == 1:  # the first stage had finished
        for probe, probe_state in zip(probes, state["done"]):
            probe.load_state_dict(probe_state)
    else:
        run_stage(probes, 0, [], riders)
    is_main = True
    if world_size > 1:
        is_main = distributed.merge_into_rank0(probes, lambda: build(first_specs))
    second: list[Probe] = []
    if prepared.command.followup is not None:
        specs = prepared.command.followup(options, spec, probes) if is_main else None
        if specs:
            specs = available_probes(prepared.command, specs, spec, log)
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


def prefix_windows(windows: corpus_mod.Windows, seq_len: int) -> corpus_mod.Windows:
    """The first ``seq_len`` tokens of every window (same documents, same starts, same BOS)."""
    return corpus_mod.Windows(np.ascontiguousarray(windows.tokens[:, :seq_len]), windows.bos_id, windows.starts,
                              windows.n_corpus_tokens)


def measure_lengths(prepared: Prepared, loaded: Loaded, lengths: tuple[int, ...], log) -> list | None:
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
        sub_plan = replace(prepared, options=replace(prepared.options, seq_len=n), out_dir=None)
        finished = measure(sub_plan, replace(loaded, windows=prefix_windows(loaded.windows, n)), log)
        if finished is not None:
            out.append((n, *finished))
    return out if prepared.rank == 0 else None


def explorer_rider(prepared: Prepared, loaded: Loaded):
    """The explorer's probe to ride the measuring forward (``explorer_pass.rider``), and why not when it cannot:
    (rider or None, a phrase or None)."""
    from sinkscope.forward.explorer_pass import rider

    options = prepared.options
    if prepared.command.read_windows is not None:  # stream: its windows are read through a bounded cache
        return None, None
    if options.resume:
        return None, "the run was resumed, so an earlier process measured its first windows"
    if prepared.world_size > 1:
        return None, f"the windows were measured by {prepared.world_size} processes"
    if hp.ATTN in loaded.spec.missing_hooks:
        return None, None
    return rider(loaded.spec, loaded.model.tokenizer, loaded.windows.tokens, heads=options.explore_heads,
                 windows=options.explore_windows, max_mb=options.explore_max_mb, seed=options.seed), None


def _add_explorer(prepared: Prepared, loaded: Loaded, result: Result, log, riding=None,
                  why_not: str | None = None) -> None:
    """The explorer's patterns into the result and its manifest (``explorer``): from the probe that rode the
    measuring forward, else from a pass of their own (``forward/explorer_pass.py``), saying why in one line."""
    from sinkscope.forward.explorer_pass import explore, p0_by_head

    options = prepared.options
    if prepared.command.read_windows is not None:  # stream: its windows are read through a bounded cache
        return
    if riding is not None:
        found = riding.package(log)
        if found is not None:
            result.explorer, result.manifest["explorer"] = found
        return
    if why_not:
        log(f"The explorer reads its windows in a pass of their own: {why_not}.")
    found = explore(loaded.model.model, loaded.model.tokenizer, loaded.spec, loaded.windows.tokens,
                    heads=options.explore_heads, windows=options.explore_windows, max_mb=options.explore_max_mb,
                    seed=options.seed, attention=options.attention,
                    device=None if options.device_map else loaded.model.device, log=log,
                    run_p0=p0_by_head(result.table, loaded.spec.n_layers, loaded.spec.n_heads), batch_size=options.batch_size)
    if found is not None:
        result.explorer, result.manifest["explorer"] = found
