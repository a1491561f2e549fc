"""``sinkscope sinks``: the sink measurements of SPEC.md, per layer and head, into a run folder.

Library entry point :func:`measure_sinks`; the CLI command is a thin wrapper over it.
Order of work: validate every option and the output folder first (seconds), then load the
model, tokenise and window the corpus, run the probes, and write the folder atomically.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from sinkscope import corpus as corpus_mod
from sinkscope import distributed
from sinkscope.capture.families import ModelSpec
from sinkscope.errors import Interrupted, SinkscopeError
from sinkscope.fileio import atomic_write_bytes
from sinkscope.probes import SINKS_PROBES, get_probe
from sinkscope.probes.sink_rate import SinkRate
from sinkscope.results import (
    base_manifest,
    check_run_dir,
    default_run_dir,
    lock_run_dir,
    rows_to_frame,
    staged_run_dir,
    write_tables,
)
from sinkscope.runner import run_probes
from sinkscope.sources import (
    check_device_map,
    check_layer_start,
    context_length,
    embedding_rows,
    layer_count,
    load_model,
    load_tokenizer,
    model_config_summary,
    resolve_device,
    resolve_dtype,
    resolve_source,
    vocab_size,
)


DEFAULT_SEQ_LEN = 512
DEFAULT_SINK_LAYER_START = 2  # seed 003's Sink_0^eps[2:]


@dataclass
class SinksOptions:
    """Everything that defines a ``sinks`` run (recorded verbatim in the manifest).

    Attributes:
        model: hub id, local folder, GGUF file; None for the embedded SmolLM2 default.
        out: run folder; None for ``reports/<run-id>``.
        text_file: a UTF-8 text file to use instead of the bundled corpus.
        dataset: a ``datasets`` name ``NAME[:CONFIG][:SPLIT]`` instead of the bundled corpus.
        seq_len: tokens per window, BOS included; None = 512 (a SmolLM2 run near a minute on 2
            cores), or the model's context if shorter (trainer checkpoints: 128 for ``tiny``).
        n_seqs: number of windows.
        batch_size: windows per forward pass (does not change the numbers).
        seed: seeds the window draw.
        bos: ``auto`` | ``add`` | ``none`` (see corpus.py).
        device, dtype, revision, trust_remote_code: model loading (see sources.py).
        sink_epsilon, sink_layer_start: Gu et al.'s threshold and the ``[s:]`` layer cut; a start
            given must name a layer, None = 2 (seed 003), with no ``[2:]`` row for a model of 2 layers.
        overwrite: replace an existing non-empty run folder.
        figures: draw the heatmaps and per-layer plots and write report.html.
        attention: ``fused`` (a fused kernel's log-sum-exp; memory linear in seq-len) or
            ``explicit`` (the model's eager weights; the reference). Same numbers (1e-5).
        resume: continue a killed or interrupted run into the same ``out`` from its last
            checkpoint of the accumulators (same options required); the table equals an
            uninterrupted run's.
        checkpoint_seconds: how often the accumulators are saved for ``resume`` (0: every batch).
        device_map: shard a large model over devices through accelerate (``auto``,
            ``balanced``, ``sequential``); probes run on each layer's device.
    """

    model: str | None = None
    out: str | None = None
    text_file: str | None = None
    dataset: str | None = None
    seq_len: int | None = None
    n_seqs: int = 16
    batch_size: int = 4
    seed: int = 0
    bos: str = "auto"
    device: str = "auto"
    dtype: str = "auto"
    revision: str | None = None
    trust_remote_code: bool = False
    sink_epsilon: float = 0.3
    sink_layer_start: int | None = None
    overwrite: bool = False
    figures: bool = True
    progress: bool = True
    attention: str = "fused"
    resume: bool = False
    checkpoint_seconds: float = 30.0
    device_map: str | None = None


def _validate(options: SinksOptions) -> None:
    if options.seq_len is not None and options.seq_len < 2:
        raise SinkscopeError(f"--seq-len must be at least 2 (got {options.seq_len}).")
    if options.n_seqs < 1:
        raise SinkscopeError(f"--n-seqs must be at least 1 (got {options.n_seqs}).")
    if options.batch_size < 1:
        raise SinkscopeError(f"--batch-size must be at least 1 (got {options.batch_size}).")
    if options.bos not in corpus_mod.BOS_POLICIES:
        raise SinkscopeError(f"unknown --bos {options.bos!r}; use one of {', '.join(corpus_mod.BOS_POLICIES)}.")
    if options.resume and not options.out:
        raise SinkscopeError("--resume needs the --out folder of the run to continue.")
    if options.attention not in ("fused", "explicit"):
        raise SinkscopeError(f"unknown --attention {options.attention!r}; use fused or explicit.")
    if not 0.0 < options.sink_epsilon < 1.0:
        raise SinkscopeError(f"--sink-epsilon must lie in (0, 1) (got {options.sink_epsilon}).")
    corpus_mod.check_seed(options.seed)
    check_layer_start(options.sink_layer_start, None)


def _require_context(seq_len: int, limit: int | None) -> None:
    if limit is not None and seq_len > limit:
        raise SinkscopeError(f"--seq-len {seq_len} exceeds the model's context of {limit} tokens.")


def _check_context(model: torch.nn.Module, seq_len: int) -> None:
    """The same check on the loaded model's config (hub models have no config file to read first)."""
    config = model.config
    _require_context(seq_len, getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
                     or getattr(config, "block_size", None))


def _progress_path(out_dir: Path) -> Path:
    """Where a run keeps its accumulator checkpoint for ``--resume`` (beside the run folder)."""
    return out_dir.parent / f".{out_dir.name}.progress.pt"


def _fingerprint(options: SinksOptions, tokens_sha256: str, source) -> str:
    """What must match for a resume: everything that changes a number (not batch size etc.)."""
    keep = {k: v for k, v in asdict(options).items()
            if k not in ("batch_size", "progress", "overwrite", "resume", "figures", "checkpoint_seconds", "out")}
    blob = json.dumps({"options": keep, "tokens": tokens_sha256, "source": source.to_dict()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _windows(corpus, tokenizer, options: SinksOptions, log) -> corpus_mod.Windows:
    log(f"Tokenising the corpus {corpus.describe()} ...")
    bos_id = corpus_mod.resolve_bos(options.bos, tokenizer)
    doc_ids = corpus_mod.tokenize_documents(tokenizer, corpus.documents)
    return corpus_mod.make_windows(doc_ids, seq_len=options.seq_len, n_seqs=options.n_seqs, seed=options.seed,
                                   bos_id=bos_id)


def _make_probes(spec: ModelSpec, options: SinksOptions) -> list:
    probes = []
    for name in SINKS_PROBES:
        cls = get_probe(name)
        if cls is SinkRate:
            start = DEFAULT_SINK_LAYER_START if options.sink_layer_start is None else options.sink_layer_start
            probes.append(cls(spec, epsilon=options.sink_epsilon, layer_start=start))
        else:
            probes.append(cls(spec))
    return probes


def measure_sinks(options: SinksOptions, log=None) -> Path | None:
    """Run the sink probes and write the run folder; returns its path (None on processes > 0)."""
    with ExitStack() as locks:  # the run folder's lock, held from the checks to the written folder
        return _measure_sinks(options, log, locks)


def _measure_sinks(options: SinksOptions, log, locks: ExitStack) -> Path | None:
    log = log or (lambda message: print(message, file=sys.stderr))
    _validate(options)
    rank, world_size = distributed.world()
    if world_size > 1:
        if options.resume:
            raise SinkscopeError("--resume is not supported in a data-parallel (torchrun) run; run it in one process.")
        distributed.init()
        if rank != 0:
            log = lambda message: None  # noqa: E731 - only process 0 talks
    source = resolve_source(options.model, options.revision)
    out_dir = Path(options.out) if options.out else default_run_dir(source.label or source.location, options.seed)
    progress_file = _progress_path(out_dir)
    if rank == 0:
        locks.enter_context(lock_run_dir(out_dir))  # a second writer fails now; also proves out is writable
    if not options.resume:
        check_run_dir(out_dir, options.overwrite)
        if rank == 0:
            progress_file.unlink(missing_ok=True)  # a stale checkpoint of an abandoned run
    elif not progress_file.is_file():
        raise SinkscopeError(f"there is no interrupted run to resume at {out_dir}; run without --resume.")
    corpus = corpus_mod.load_corpus(options.text_file, options.dataset)
    device = distributed.local_device(options.device) if world_size > 1 else options.device
    resolve_dtype(options.dtype, resolve_device(device))  # a bad --device/--dtype fails here, in a second
    check_device_map(options.device_map, source)
    check_layer_start(options.sink_layer_start, layer_count(source))
    limit = context_length(source)
    if options.seq_len is None:
        options = replace(options, seq_len=min(DEFAULT_SEQ_LEN, limit or DEFAULT_SEQ_LEN))
    _require_context(options.seq_len, limit)

    # The tokenizer first: a corpus too short for the windows costs seconds, not a model load.
    tokenizer = load_tokenizer(source, trust_remote_code=options.trust_remote_code)
    windows = None
    if tokenizer is not None:
        windows = _windows(corpus, tokenizer, options, log)
        corpus_mod.check_token_range(windows.tokens, vocab_size(source))

    started = time.perf_counter()
    log(f"Loading {source.label or source.location} ...")
    loaded = load_model(source, device=device, dtype=options.dtype, device_map=options.device_map,
                        trust_remote_code=options.trust_remote_code, tokenizer=tokenizer, log=log)
    load_s = time.perf_counter() - started
    spec = ModelSpec.from_model(loaded.model)  # also rejects unsupported families
    _check_context(loaded.model, options.seq_len)
    check_layer_start(options.sink_layer_start, spec.n_layers, spec.attention_layers)
    if windows is None:
        windows = _windows(corpus, loaded.tokenizer, options, log)
    corpus_mod.check_token_range(windows.tokens, embedding_rows(loaded.model))
    probes = _make_probes(spec, options)
    fingerprint = _fingerprint(options, windows.sha256, source)

    first, stop = distributed.share(len(windows.tokens), rank, world_size)
    if options.resume:
        state = torch.load(progress_file, weights_only=False)
        if state.get("fingerprint") != fingerprint:
            raise SinkscopeError(
                f"the interrupted run at {out_dir} was started with other options, model or tokens; "
                "rerun it with the same options, or without --resume.")
        for probe, probe_state in zip(probes, state["probes"]):
            probe.load_state_dict(probe_state)
        first = state["next"]
        log(f"Resuming at window {first} of {stop}.")

    last_save = [time.monotonic()]

    def checkpoint(next_window: int) -> None:
        if world_size > 1 or next_window >= stop:
            return
        if time.monotonic() - last_save[0] < options.checkpoint_seconds:
            return
        payload = {"fingerprint": fingerprint, "next": next_window, "probes": [p.state_dict() for p in probes]}
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        progress_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(progress_file, buffer.getvalue())
        last_save[0] = time.monotonic()

    log(f"Running {spec.family} ({spec.n_layers} layers x {spec.n_heads} heads) over "
        f"{options.n_seqs} windows of {options.seq_len} tokens on {loaded.device} in {str(loaded.dtype)[6:]}"
        + (f", {world_size} processes" if world_size > 1 else "") + " ...")
    run_started = time.perf_counter()
    try:
        run_probes(loaded.model, windows.tokens[:stop], probes, batch_size=options.batch_size,
                   device=None if options.device_map else loaded.device, progress=options.progress and rank == 0,
                   attention=options.attention, start=first, on_batch_done=checkpoint, log=log)
    except KeyboardInterrupt:
        if progress_file.is_file():
            raise Interrupted(f"interrupted; rerun the same command with --resume to continue from {out_dir}'s "
                              "last checkpoint.") from None
        raise
    run_s = time.perf_counter() - run_started
    if world_size > 1:
        is_writer = distributed.merge_into_rank0(probes, lambda: _make_probes(spec, options))
        if not is_writer:
            distributed.finish()
            return None

    frame = rows_to_frame(row for probe in probes for row in probe.rows())
    manifest = base_manifest("sinks", asdict(options))
    manifest.update(
        model={
            "source": source.to_dict(),
            "float32_cache": loaded.cache_path,
            "family": spec.family,
            "spec": asdict(spec),
            "n_parameters": sum(p.numel() for p in loaded.model.parameters()),
            "config": model_config_summary(loaded.model),
            "device_map": getattr(loaded.model, "hf_device_map", None),
        },
        dtype=str(loaded.dtype).removeprefix("torch."),
        device=str(loaded.device),
        processes=world_size,
        corpus={**corpus.info, "name": corpus.name, "sha256": corpus.sha256, "n_documents": len(corpus.documents),
                "n_tokens": windows.n_corpus_tokens},
        windows={
            "seq_len": options.seq_len, "n_seqs": options.n_seqs, "seed": options.seed,
            "bos_policy": options.bos, "bos_id": windows.bos_id, "tokens_sha256": windows.sha256,
            "tokenizer_bos_id": getattr(loaded.tokenizer, "bos_token_id", None),
            "rule": "non-overlapping per-document chunks, drawn without replacement by "
                    "numpy.random.default_rng(seed), kept in corpus order; BOS prepended when bos_id is set",
            "starts": [list(s) for s in windows.starts],
        },
        probes={p.name: {"options": p.options(), "metrics": {m: asdict(i) for m, i in p.metrics.items()}}
                for p in probes},
        timing={"load_s": round(load_s, 3), "run_s": round(run_s, 3),
                "tokens_per_s": round(windows.tokens.size / max(run_s, 1e-9), 1)},
    )
    with staged_run_dir(out_dir, options.overwrite) as stage:
        write_tables(stage, frame, manifest, windows.tokens)
        if options.figures:
            from sinkscope.report import build_report

            build_report([stage], out=stage, labels=[out_dir.name], shown_paths=[out_dir])
    progress_file.unlink(missing_ok=True)
    if world_size > 1:
        distributed.finish()
    log(f"Wrote {out_dir}")
    return out_dir
