"""The ``sinkscope`` command line: thin typer wrappers over library functions.

Every anticipated failure is a :class:`~sinkscope.errors.SinkscopeError` whose one sentence is
printed as ``error: ...`` with exit code 1 (never a traceback); Ctrl-C exits 130 wherever it lands.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from typing import Annotated, Optional

import typer

from sinkscope.errors import Interrupted, SinkscopeError

app = typer.Typer(
    name="sinkscope",
    help="Measure attention sinks in causal language models.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
)
# Examples in the commands' help are paragraphs that open with a line holding only ``\b``: click
# prints such a paragraph as written instead of rewrapping it, so every example can be pasted.


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        number = version("sinkscope")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from sinkscope import __version__ as number
    typer.echo(f"sinkscope {number}")
    raise typer.Exit()


@app.callback()
def _global_options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    debug: Annotated[bool, typer.Option("--debug", envvar="SINKSCOPE_DEBUG",
                                        help="Print the traceback behind an error (a plugin's, say) before its sentence.")] = False,
) -> None:
    """Measure attention sinks in causal language models."""
    _state["debug"] = debug


#: what the global options set for the command that runs (the callback runs before each command).
_state = {"debug": False}


def _echo_traceback(error: BaseException) -> None:
    """Under --debug: the error's traceback, with what caused it (a plugin's own frames)."""
    if _state["debug"]:
        import traceback

        typer.echo("".join(traceback.format_exception(error)).rstrip(), err=True)

# ---- options shared by commands --------------------------------------------------------------
ModelArg = Annotated[
    Optional[str],
    typer.Argument(help="Hub id, local save_pretrained folder or .gguf file; default: the bundled SmolLM2-135M."),
]
OutOpt = Annotated[Optional[str], typer.Option("--out", "-o", help="Run folder (default reports/<run-id>).")]
TextFileOpt = Annotated[Optional[str], typer.Option("--text-file", help="UTF-8 text to use instead of the bundled corpus.")]
DatasetOpt = Annotated[Optional[str], typer.Option("--dataset", help="A datasets corpus NAME[:CONFIG][:SPLIT].")]
SeqLenOpt = Annotated[Optional[str], typer.Option("--seq-len", help="Tokens per window, BOS included [default: 512, or the model's context if shorter]; several comma-separated lengths (128,512,2048) measure each in one run, on prefixes of the same windows.")]
NSeqsOpt = Annotated[int, typer.Option("--n-seqs", help="Number of windows.")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Windows per forward pass (numbers do not change).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the window draw.")]
BosOpt = Annotated[str, typer.Option("--bos", help="auto | add | none: prepend the BOS token to each window.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto (float32 on CPU, bfloat16 on GPU) | float32 | bfloat16 | float16.")]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="Hub revision (branch, tag or commit); several, comma-separated (step0,step1000,...), measure each on the same windows into one folder with a step column.")]
TrustOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Allow code from the model repository to run.")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an existing non-empty run folder.")]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")]
FiguresOpt = Annotated[bool, typer.Option("--figures/--no-figures", help="Draw heatmaps and per-layer plots and write report.html; --no-figures writes neither (add them later with `sinkscope report RUN`).")]
AttentionOpt = Annotated[str, typer.Option("--attention", help="fused (linear memory) | explicit (eager weights, the reference).")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run into the same --out.")]
DeviceMapOpt = Annotated[Optional[str], typer.Option("--device-map", help="Shard the model with accelerate: auto | balanced | sequential.")]
CheckpointSecondsOpt = Annotated[float, typer.Option("--checkpoint-seconds", help="Save the accumulators for --resume this often (0: every batch).")]


class _Stop:
    """The signal that stopped the command (None: Ctrl-C or still running)."""

    signal_name: str | None = None


def _on_stop_signal(signum, _frame):
    _Stop.signal_name = signal.Signals(signum).name
    raise KeyboardInterrupt  # the Ctrl-C paths: progress kept, the sentence that says how to resume


@contextlib.contextmanager
def _stop_signals():
    """SIGTERM (a scheduler's stop, `kill`) ends a command as Ctrl-C does, with its sentence, exit 143."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _Stop.signal_name = None
    previous = signal.signal(signal.SIGTERM, _on_stop_signal)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted() -> tuple[str, int]:
    """("interrupted", 130) after Ctrl-C; ("stopped by SIGTERM", 143) after SIGTERM (128 + 15)."""
    name = _Stop.signal_name
    return (f"stopped by {name}", 128 + signal.Signals[name].value) if name else ("interrupted", 130)


def _friendly_errors(func):
    """Turn anticipated failures into one sentence on stderr and a non-zero exit."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            with _stop_signals():
                return func(*args, **kwargs)
        except SinkscopeError as error:
            _echo_traceback(error)
            message, code = str(error), error.exit_code  # 1; 130 for an interrupted run (errors.Interrupted)
            if isinstance(error, Interrupted) and _Stop.signal_name:
                word, code = _interrupted()
                message = message.replace("interrupted", word, 1)
            typer.echo(f"error: {message}", err=True)
            raise typer.Exit(code) from None
        except KeyboardInterrupt:
            word, code = _interrupted()
            typer.echo(f"error: {word}; no run folder was written.", err=True)
            raise typer.Exit(code) from None
        except BrokenPipeError:  # `sinkscope ls probes | head`: the reader left, nothing is wrong
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise typer.Exit(0) from None
        except OSError as error:  # a full disk, a read-only or blocked output path, ...
            _echo_traceback(error)
            where = f" {error.filename}" if error.filename else ""
            typer.echo(f"error: could not write or read{where} ({error.strerror or error}); "
                       "results already written are unchanged.", err=True)
            raise typer.Exit(1) from None
        except Exception as error:
            if not _is_out_of_memory(error):
                raise
            typer.echo("error: out of memory; lower --batch-size or --seq-len, or use a larger device.", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _is_out_of_memory(error: BaseException) -> bool:
    """torch.OutOfMemoryError, recognised without importing torch (commands import it lazily)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(error, torch.OutOfMemoryError)


@app.command()
@_friendly_errors
def sinks(
    model: ModelArg = None,
    out: OutOpt = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    seq_len: SeqLenOpt = None,
    n_seqs: NSeqsOpt = 16,
    batch_size: BatchOpt = 4,
    seed: SeedOpt = 0,
    bos: BosOpt = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    sink_epsilon: Annotated[float, typer.Option("--sink-epsilon", help="Gu et al. threshold eps for sink_rate.")] = 0.3,
    sink_layer_start: Annotated[Optional[int], typer.Option("--sink-layer-start", help="First layer of the sink_rate_from_layer row (its layer_start column), a layer of the model [default: 2; no such row for a 2-layer model].")] = None,
    massive_top_k: Annotated[int, typer.Option("--massive-top-k", help="The K largest residual entries per layer (distinct position and channel) with channel, position, token and Sun et al.'s criterion [default: 0 = none; 10 with --massive-intervention].")] = 0,
    massive_min_abs: Annotated[float, typer.Option("--massive-min-abs", help="Massive: |h| above this (Sun et al.: 100).")] = 100.0,
    massive_min_ratio: Annotated[float, typer.Option("--massive-min-ratio", help="Massive: |h| at least this times the window's median |h| (Sun et al.: 1000).")] = 1000.0,
    massive_intervention: Annotated[Optional[str], typer.Option("--massive-intervention", help="zero | mean: then set the massive top-k entries (at their first layer) to 0 or their mean and report the loss change: a second pass, clean and intervened.")] = None,
    overwrite: OverwriteOpt = False,
    figures: FiguresOpt = True,
    progress: ProgressOpt = True,
    attention: AttentionOpt = "fused",
    resume: ResumeOpt = False,
    device_map: DeviceMapOpt = None,
    checkpoint_seconds: CheckpointSecondsOpt = 30.0,
) -> None:
    """Measure position-0 mass, sink rate, phantom mass, value-norm ratio and massive activations.

    Writes results.csv/.parquet, manifest.json, tokens.npy and figures into a run folder.

    Examples:

    \b
        sinkscope sinks                                  # SmolLM2-135M on the bundled Austen corpus

    \b
        sinkscope sinks EleutherAI/pythia-1b --seq-len 1024 --n-seqs 64

    \b
        sinkscope sinks model.gguf --text-file book.txt --bos add --out runs/book

    \b
        sinkscope sinks openai/gpt-oss-20b --device-map auto --dtype bfloat16

    \b
        sinkscope sinks --massive-top-k 10 --massive-intervention zero   # Sun et al.: set them to 0, loss change

    \b
        torchrun --nproc-per-node 4 -m sinkscope sinks EleutherAI/pythia-1b --n-seqs 256
    """
    _run("sinks", locals())


def _run(name: str, values: dict) -> None:
    """Build the command's options from the CLI's values (lists become tuples), check them before
    torch is imported, run the command through the pipeline, print the run folder.

    A command taking ``MODEL [MODEL ...]`` passes a list: one model runs as usual; several run one
    after the other into ``--out/<model>/`` and are compared on one page (``--group-by``).
    """
    from dataclasses import fields

    from sinkscope.commands import get_command
    from sinkscope.options import check_options
    from sinkscope.resolve import checkpoint_series, one_training, parse_revisions

    command = get_command(name)
    models = values.get("model")
    given = list(models) if isinstance(models, list) else [models] if models else []
    revisions = parse_revisions(values.get("revision"))
    series = None  # (models, revisions) of one model's checkpoints: docs/monitor.md
    if len(revisions) > 1:
        if len(given) > 1:
            raise SinkscopeError("several revisions are the checkpoints of one model; give one MODEL with "
                                 "--revision A,B,... (or several MODELs without it).")
        series = ([given[0] if given else None] * len(revisions), revisions)
    elif len(given) == 1 and checkpoint_series(given[0]):  # a folder of trainer checkpoints
        found = checkpoint_series(given[0])
        if one_training(found):
            series = (found, [revisions[0]] * len(found))
        else:  # several trainings' checkpoints: compared as several models
            given = found
    several = series is not None or len(given) > 1
    if isinstance(models, list) or several:
        values = {**values, "model": None if several or not given else given[0]}
    if series is not None:
        values = {**values, "revision": None}
    if values.get("group_by") and not several:
        raise SinkscopeError("--group-by averages runs of several models; give more than one MODEL.")
    if values.get("group_by") and series is not None:
        raise SinkscopeError("--group-by averages runs of several models; a model's checkpoints are drawn against the "
                             "step, not grouped.")
    from sinkscope.options import parse_seq_len

    if "seq_len" in values:
        values = {**values, "seq_len": parse_seq_len(values["seq_len"])}
    names = {f.name for f in fields(command.options)}
    options = command.options(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in names})
    check_options(options)
    command.check(options)
    if series is not None:
        _check_inputs(options, series[0], series[1])
    else:
        _check_inputs(options, given if several else [options.model])
    from sinkscope.pipeline import execute, execute_several

    if series is not None:
        page = execute_several(command, options, series[0], revisions=series[1], series=True)
        if page is not None:
            typer.echo(str(page))
        return
    if several:
        page = execute_several(command, options, given, group_by=values.get("group_by"))
        if page is not None:
            typer.echo(str(page))
        return
    result = execute(command, options)
    if result is not None:  # None on data-parallel processes other than 0
        typer.echo(str(result.path))


def _check_inputs(options, models: list, revisions: list | None = None) -> None:
    """The mistakes a user makes most (a missing model or text file, ``--out .``), refused before torch is
    imported, in the pipeline's order (``pipeline.plan`` checks them all again, with the rest)."""
    from sinkscope.resolve import resolve_source

    for model, revision in zip(models, revisions or [options.revision] * len(models)):
        resolve_source(model, revision)
    if options.text_file and not options.dataset and not os.path.isfile(os.path.expanduser(options.text_file)):
        raise SinkscopeError(f"no text file at {options.text_file}.")  # corpus.text_file_corpus's sentence
    if options.out and len(models) == 1 and revisions is None:  # several models: --out holds one run folder per model
        from sinkscope.results import _check_not_cwd, check_run_dir

        if options.resume:  # the pipeline then looks for the interrupted run's progress file
            _check_not_cwd(options.out)
        else:
            check_run_dir(options.out, options.overwrite)


@app.command()
@_friendly_errors
def selectivity(
    model: Annotated[Optional[list[str]], typer.Argument(metavar="MODEL", help="One or more gated models: trainer checkpoints with a value or output gate, or Hugging Face models with an output gate (Qwen3-Next). Several give one comparison page.")] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Run folder; with several models the folder holding one run per model and the comparison (default reports/<run-id>).")] = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    seq_len: SeqLenOpt = None,
    n_seqs: NSeqsOpt = 256,
    batch_size: BatchOpt = 4,
    seed: SeedOpt = 0,
    bos: BosOpt = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    min_count: Annotated[int, typer.Option("--min-count", help="token_share_frequent (its min_count column) and the token tables count tokens seen at least K times.")] = 50,
    group_by: Annotated[Optional[str], typer.Option("--group-by", help="Several models: average runs sharing a condition (variant, seed, step, tier) on the comparison page.")] = None,
    overwrite: OverwriteOpt = False,
    figures: FiguresOpt = True,
    progress: ProgressOpt = True,
    attention: AttentionOpt = "fused",
    resume: ResumeOpt = False,
    device_map: DeviceMapOpt = None,
    checkpoint_seconds: CheckpointSecondsOpt = 30.0,
) -> None:
    """Measure gates: selectivity, mean gate, token-identity share, per-token gates, output-gate statistics.

    A trainer checkpoint without a text is measured on its own validation windows.

    Examples:

    \b
        sinkscope selectivity ckpt/normgate

    \b
        sinkscope selectivity ckpt/normgate ckpt/sink+proj --out runs/gates

    \b
        sinkscope selectivity ckpt/*-s0 ckpt/*-s1 --group-by variant --out runs/by-variant

    \b
        sinkscope selectivity ckpt/outgate --n-seqs 64 --attention explicit

    With several models, --out holds one run folder per model and report.html compares them.
    """
    _run("selectivity", locals())


@app.command()
@_friendly_errors
def heads(
    model: Annotated[Optional[list[str]], typer.Argument(metavar="MODEL", help="One or more models (hub id, folder, .gguf, trainer checkpoint); several give one comparison; default: the bundled SmolLM2-135M.", show_default=False)] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Run folder; with several models the folder holding one run per model and the comparison (default reports/<run-id>).")] = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    seq_len: SeqLenOpt = None,
    n_seqs: NSeqsOpt = 16,
    batch_size: BatchOpt = 4,
    seed: SeedOpt = 0,
    bos: BosOpt = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    sink_set: Annotated[str, typer.Option("--sink-set", help="What A_sink sums: auto (the model's: its phantom if it has one, else key 0) | first | phantom | first+phantom | data (seed 004 §6.2: keys of high attention and low value norm, plus any phantom).")] = "auto",
    sink_attention: Annotated[float, typer.Option("--sink-attention", help="--sink-set data: a key's mean attention (Gu et al.'s alpha_j) must exceed this.")] = 0.3,
    sink_value_ratio: Annotated[float, typer.Option("--sink-value-ratio", help="--sink-set data: a key's value norm must be below this times the window's median.")] = 0.5,
    sink_min_queries: Annotated[int, typer.Option("--sink-min-queries", help="--sink-set data: a key needs at least this many scoring queries (capped at half the window's).")] = 16,
    dormant_below: Annotated[float, typer.Option("--dormant-below", help="A head whose importance is below this is dormant.")] = 0.1,
    ablate_dormant: Annotated[bool, typer.Option("--ablate-dormant", help="Then zero the dormant heads (found on all windows) and report the loss change: a second pass, clean and ablated.")] = False,
    group_by: Annotated[Optional[str], typer.Option("--group-by", help="Several models: average runs sharing a condition (variant, seed, step, tier) on the comparison page.")] = None,
    overwrite: OverwriteOpt = False,
    figures: FiguresOpt = True,
    progress: ProgressOpt = True,
    attention: AttentionOpt = "fused",
    resume: ResumeOpt = False,
    device_map: DeviceMapOpt = None,
    checkpoint_seconds: CheckpointSecondsOpt = 30.0,
) -> None:
    """Measure implicit gates, head importance, load imbalance (CV) and dormant heads (seed 004).

    Several models or checkpoints give one run each and one comparison page; --out is then the
    folder holding one run folder per model (named after it) and the page.

    Examples:

    \b
        sinkscope heads                                          # SmolLM2-135M on the bundled corpus

    \b
        sinkscope heads --ablate-dormant --dormant-below 0.2     # zero the dormant heads: loss change

    \b
        sinkscope heads openai/gpt-oss-20b --sink-set first+phantom --device-map auto

    \b
        sinkscope heads ckpt/base ckpt/lb --ablate-dormant --out runs/lb-vs-base
    """
    _run("heads", locals())


@app.command()
@_friendly_errors
def inject(
    model: Annotated[Optional[list[str]], typer.Argument(metavar="MODEL", help="One or more models (hub id, folder, .gguf, trainer checkpoint); several give one comparison; default: the bundled SmolLM2-135M.", show_default=False)] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Run folder; with several models the folder holding one run per model and the comparison (default reports/<run-id>).")] = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    seq_len: SeqLenOpt = None,
    n_seqs: NSeqsOpt = 16,
    eval_batch: Annotated[int, typer.Option("--eval-batch", help="Windows per evaluation batch: structured junk is drawn across it, so it is part of the measurement (recorded in the manifest, never halved); with structured junk --n-seqs must be a multiple of it (at least 2).")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the window draw and of the junk (per batch and layer).")] = 0,
    junk: Annotated[list[str], typer.Option("--junk", help="Junk types, repeatable or comma-separated: structured, same-context, gaussian, random-direction, own-direction (projection-gate checkpoints).")] = ["structured", "same-context", "gaussian"],  # noqa: B006
    cutoff: Annotated[list[str], typer.Option("--cutoff", help="Quiet-read cutoffs, repeatable or comma-separated: median, q25.")] = ["median", "q25"],  # noqa: B006
    doses: Annotated[str, typer.Option("--doses", help="Doses eps, comma-separated: the junk's norm is eps x the head's median read norm.")] = "0.2,0.4,0.8,1.6",
    draws: Annotated[int, typer.Option("--draws", help="Seeded draws of the junk per condition (draw d seeded by seed, batch, layer and d): the table gives the mean over draws and windows and its standard error over windows; K corrupted passes per condition, one shared clean pass.")] = 1,
    junk_source: Annotated[str, typer.Option("--junk-source", help="Where each layer's quiet set, median read norm m_h and transplanted junk come from: clean (the clean forward pass of the same batch, SPEC.md) or corrupted (the reads the layer receives after the layers below were corrupted; the protocol before 2026-12).")] = "clean",
    exposure: Annotated[bool, typer.Option("--exposure/--no-exposure", help="Also measure quiet and phantom mass on the clean pass.")] = True,
    bos: BosOpt = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    group_by: Annotated[Optional[str], typer.Option("--group-by", help="Several models: average runs sharing a condition (variant, seed, step, tier) on the comparison page.")] = None,
    overwrite: OverwriteOpt = False,
    figures: FiguresOpt = True,
    progress: ProgressOpt = True,
    attention: AttentionOpt = "fused",
    resume: ResumeOpt = False,
    device_map: DeviceMapOpt = None,
    checkpoint_seconds: CheckpointSecondsOpt = 30.0,
) -> None:
    """Corrupt every value head's quiet reads with junk and measure the loss increase (seed 000 §5).

    For each junk type, cutoff, dose and draw: one more forward pass per evaluation batch; the clean
    loss, the exposure (quiet and phantom mass) and, by default (--junk-source clean), each layer's
    quiet set, m_h and transplanted junk come from the clean pass of the same batches.
    Several models give one run each and one comparison page.

    Examples:

    \b
        sinkscope inject                                         # SmolLM2-135M: 3 junk types x 2 cutoffs x 4 doses

    \b
        sinkscope inject --junk gaussian --cutoff q25 --doses 0.4,0.8 --n-seqs 8 --seq-len 256

    \b
        sinkscope inject --junk structured,gaussian --doses 0.2,0.8 --draws 3   # mean ± se over 3 junk draws

    \b
        sinkscope inject ckpt/projgate --junk own-direction,structured

    \b
        sinkscope inject ckpt/baseline ckpt/sink+proj --out runs/inject-cmp
    """
    values = dict(locals())
    values["cutoffs"] = values.pop("cutoff")
    _run("inject", values)


@app.command()
@_friendly_errors
def circuit(
    model: Annotated[Optional[list[str]], typer.Argument(metavar="MODEL", help="One or more models (hub id, folder, .gguf, trainer checkpoint); several give one comparison; default: the bundled SmolLM2-135M.", show_default=False)] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Run folder; with several models the folder holding one run per model and the comparison (default reports/<run-id>).")] = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    seq_len: SeqLenOpt = None,
    n_seqs: NSeqsOpt = 16,
    batch_size: BatchOpt = 4,
    seed: SeedOpt = 0,
    bos: BosOpt = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    later_position: Annotated[int, typer.Option("--later-position", help="The later position whose cross-window cosine is shown beside position 0's (capped to seq-len - 1).")] = 64,
    norm_ratio: Annotated[float, typer.Option("--norm-ratio", help="Position 0 'separates' at the first layer where its norm exceeds this times the median of the others.")] = 2.0,
    subtract_head: Annotated[Optional[list[str]], typer.Option("--subtract-head", help="A layer-0 head 0.H whose output is subtracted before the MLP PCA (repeatable; subtracted together, exact through hook_result).")] = None,
    scatter_positions: Annotated[int, typer.Option("--scatter-positions", help="Positions >= 1 per window in the PCA scatter (evenly spaced).")] = 32,
    scatter_windows: Annotated[int, typer.Option("--scatter-windows", help="Windows whose other positions enter the scatter (position 0 of every window always does).")] = 64,
    outlier_top: Annotated[int, typer.Option("--outlier-top", help="Outlier channels reported per layer.")] = 5,
    bos_experiments: Annotated[bool, typer.Option("--bos-experiments/--no-bos-experiments", help="Run the BOS experiments (Sink_0^eps with/without BOS, repeated first token): 2 x len(repeats) extra passes.")] = True,
    repeats: Annotated[Optional[list[int]], typer.Option("--repeats", help="How many times the first token is repeated (repeatable; 1 is the reference) [default: 1 2 4 8].")] = None,
    sink_epsilon: Annotated[float, typer.Option("--sink-epsilon", help="Gu et al.'s threshold eps of Sink_0^eps.")] = 0.3,
    group_by: Annotated[Optional[str], typer.Option("--group-by", help="Several models: average runs sharing a condition (variant, seed, step, tier) on the comparison page.")] = None,
    overwrite: OverwriteOpt = False,
    figures: FiguresOpt = True,
    progress: ProgressOpt = True,
    attention: AttentionOpt = "fused",
    resume: ResumeOpt = False,
    device_map: DeviceMapOpt = None,
    checkpoint_seconds: CheckpointSecondsOpt = 30.0,
) -> None:
    """How the model makes position 0 special (seed 003): norms, direction, attention output, MLP PCA, BOS.

    Per layer: the position-0 residual norm against the other positions and the first layer
    where it separates; the cross-window cosine of position 0 beside a later position; layer
    0's attention-output norm per position; the PCA of layer 0's MLP pre-activation with a
    separation score (optionally without chosen heads); outlier channels before and after the
    pre-norm; Sink_0^eps with and without BOS and the loss when the first token is repeated.

    Examples:

    \b
        sinkscope circuit                                  # SmolLM2-135M, bundled corpus

    \b
        sinkscope circuit --bos none --subtract-head 0.3   # one head removed

    \b
        sinkscope circuit ckpt/base ckpt/forcesink -o runs/p0   # variants
    """
    values = dict(locals())
    values["subtract_head"] = tuple(subtract_head or ())
    values["repeats"] = tuple(repeats) if repeats else (1, 2, 4, 8)
    _run("circuit", values)


@app.command()
@_friendly_errors
def stream(
    model: Annotated[Optional[list[str]], typer.Argument(metavar="MODEL", help="One or more models (hub id, folder, .gguf); several give one comparison; default: the bundled SmolLM2-135M.", show_default=False)] = None,
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Run folder; with several models the folder holding one run per model and the comparison (default reports/<run-id>).")] = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    length: Annotated[int, typer.Option("--length", help="Tokens per document (window), BOS included; may exceed the model's context.")] = 2048,
    n_seqs: Annotated[int, typer.Option("--n-seqs", help="Documents (windows of --length tokens).")] = 1,
    cache: Annotated[str, typer.Option("--cache", help="Cache sizes, comma-separated: the keys a cache holds when a token arrives (its query sees them and itself; exact at any --chunk).")] = "256",
    sink_tokens: Annotated[str, typer.Option("--sink-tokens", help="The sinks policy's first tokens, comma-separated (0 = window).")] = "4",
    policy: Annotated[str, typer.Option("--policy", help="Policies, comma-separated: full (dense reference), window, sinks (StreamingLLM), h2o (heavy hitters + recent).")] = "full,window,sinks,h2o",
    positions: Annotated[str, typer.Option("--positions", help="cache (positions within the cache, keys re-rotated; RoPE models), original (kvpress's), or both.")] = "cache",
    chunk: Annotated[int, typer.Option("--chunk", help="Tokens read per forward pass; the cache is cut back after each.")] = 64,
    mode: Annotated[str, typer.Option("--mode", help="stream (through the cache: memory bounded by it) | mask (one dense pass with the cache's mask: the exact reference, short texts).")] = "stream",
    h2o_recent: Annotated[float, typer.Option("--h2o-recent", help="h2o: the share of the cache kept for the most recent keys.")] = 0.5,
    bucket: Annotated[int, typer.Option("--bucket", help="Tokens per position bucket of the table and figures.")] = 256,
    seed: SeedOpt = 0,
    bos: BosOpt = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    overwrite: OverwriteOpt = False,
    figures: FiguresOpt = True,
    progress: ProgressOpt = True,
    attention: AttentionOpt = "fused",
    resume: ResumeOpt = False,
    device_map: DeviceMapOpt = None,
    checkpoint_seconds: CheckpointSecondsOpt = 30.0,
) -> None:
    """Read a long text through a bounded KV cache: per-token NLL per policy, cache size and position convention.

    Every document is read once per condition: full (dense), window (recent keys only), sinks
    (StreamingLLM: the first tokens plus the recent ones), h2o (heavy hitters plus recent). p0
    mass is measured beside it on the same text. Several models give one comparison page.

    Examples:

    \b
        sinkscope stream                                  # SmolLM2: 2,048 tokens, cache 256, 4 sink tokens

    \b
        sinkscope stream --cache 128,256,512 --sink-tokens 0,1,4 --policy window,sinks,h2o --length 8192

    \b
        sinkscope stream --positions cache,original --n-seqs 4 --chunk 32

    \b
        sinkscope stream openai/gpt-oss-20b --sink-tokens 0 --policy full,window --device-map auto
    """
    _run("stream", dict(locals()))


@app.command()
@_friendly_errors
def measure(
    model: ModelArg = None,
    probe: Annotated[list[str], typer.Option("--probe", "-p", help="A registered probe (repeatable; see `sinkscope ls probes`).")] = [],  # noqa: B006
    param: Annotated[Optional[list[str]], typer.Option("--param", help="A probe parameter PROBE.NAME=VALUE (repeatable).")] = None,
    plugin: Annotated[Optional[list[str]], typer.Option("--plugin", help="A Python file that registers probes (repeatable).")] = None,
    out: OutOpt = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    seq_len: SeqLenOpt = None,
    n_seqs: NSeqsOpt = 16,
    batch_size: BatchOpt = 4,
    seed: SeedOpt = 0,
    bos: BosOpt = "auto",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    revision: RevisionOpt = None,
    trust_remote_code: TrustOpt = False,
    overwrite: OverwriteOpt = False,
    figures: FiguresOpt = True,
    progress: ProgressOpt = True,
    attention: AttentionOpt = "fused",
    resume: ResumeOpt = False,
    device_map: DeviceMapOpt = None,
    checkpoint_seconds: CheckpointSecondsOpt = 30.0,
) -> None:
    """Run any registered probes by name (a plugin file's included) and write a run folder.

    Examples:

    \b
        sinkscope measure --probe p0_mass --probe value_norm_ratio

    \b
        sinkscope measure ckpt/sinklogit --probe sink_rate --param sink_rate.epsilon=0.5

    \b
        sinkscope measure model.gguf --plugin my_probes.py --probe my_probe
    """
    _run("measure", {**locals(), "probes": probe, "params": param or [], "plugins": plugin or []})


@app.command()
@_friendly_errors
def report(
    run_dirs: Annotated[list[str], typer.Argument(help="One or more run folders.")],
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Output folder (default: the run folder for one run, reports/compare-<time> for several).")] = None,
    label: Annotated[Optional[list[str]], typer.Option("--label", help="A name per run, in order (default: folder names).")] = None,
    group_by: Annotated[Optional[str], typer.Option("--group-by", help="Average runs sharing a condition (variant, seed, step, tier) and compare the groups.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the report in an --out folder that already holds one (never a folder holding files sinkscope did not write); rebuilding a run's own report needs none.")] = False,
) -> None:
    """Rebuild a run's report.html, or compare several runs on one page (no model is loaded).

    Examples:

    \b
        sinkscope report reports/20261129-150033-SmolLM2-135M-Instruct.Q4_1

    \b
        sinkscope report runs/bos-none runs/bos-add --label "no BOS" --label "BOS" --out runs/bos-compare

    \b
        sinkscope report runs/ckpt-* --group-by variant --out runs/by-variant
    """
    from sinkscope.report import build_report

    if label and len(label) != len(run_dirs):
        raise SinkscopeError(f"give one --label per run folder ({len(run_dirs)}), not {len(label)}.")
    typer.echo(str(build_report(run_dirs, out=out, labels=label, group_by=group_by, overwrite=overwrite)))


@app.command()
@_friendly_errors
def train(
    variant: Annotated[Optional[str], typer.Option("--variant", help="baseline | offbyone | sinklogit | sinktoken | normgate | projgate | sink+norm | sink+proj | routing-norm | outgate [default: baseline].")] = None,
    task: Annotated[Optional[str], typer.Option("--task", help="text (the corpus) | trigger (SPEC.md's trigger-conditional task, generated) [default: text].")] = None,
    tier: Annotated[Optional[str], typer.Option("--tier", help="micro (~1 min on CPU) | tiny (~3 min) | 10M | 50M | 124M | 350M [default: micro for --task trigger, tiny for text].")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Initialisation and batch order (shared across variants) [default: 0].")] = None,
    out: Annotated[str, typer.Option("--out", "-o", help="Checkpoint folder.")] = "ckpt",
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps (the cosine schedule's length) [default: the tier's; 600 for tiny, 1000 for micro].")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="Sequences per step over all processes.")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Peak learning rate.")] = None,
    min_lr: Annotated[Optional[float], typer.Option("--min-lr", help="Floor of the cosine (default lr/10).")] = None,
    warmup_steps: Annotated[Optional[int], typer.Option("--warmup-steps", help="Linear warmup steps (tier default).")] = None,
    grad_accum: Annotated[Optional[int], typer.Option("--grad-accum", help="Micro-batches per step (batches unchanged).")] = None,
    eval_every: Annotated[Optional[int], typer.Option("--eval-every", help="Validation loss every N steps.")] = None,
    checkpoint_every: Annotated[Optional[int], typer.Option("--checkpoint-every", help="Checkpoint every N steps.")] = None,
    stop_at: Annotated[Optional[int], typer.Option("--stop-at", help="Stop (checkpointed) after this step; continue with --resume.")] = None,
    monitor_every: Annotated[Optional[int], typer.Option("--monitor-every", help="Sink probes (p0 mass, phantom mass, value-norm ratio) every N steps on 8 fixed validation windows, into monitor.csv; `sinkscope report CKPT` draws them against the step.")] = None,
    text_file: TextFileOpt = None,
    dataset: DatasetOpt = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="bpe4096 (default, trained on the corpus) | gpt2 | a tokenizer folder.")] = None,
    windows: Annotated[Optional[str], typer.Option("--windows", help="Text windows: doc-start (default: BOS, then a paragraph start) | random (any offset, no BOS).")] = None,
    task_set: Annotated[Optional[list[str]], typer.Option("--task-set", help="A task option key=value (repeatable); trigger: vocab=64, trigger_rate=0.12, length=0 (= block_size), task_seed=0.")] = None,
    tnlm: Annotated[bool, typer.Option("--tnlm", help="TNLM loss: no cross-entropy term at position 0 (seed 003).")] = False,
    lb_lambda: Annotated[float, typer.Option("--lb-lambda", help="Sink-aware load-balancing loss weight (seed 004; 1e-4 there).")] = 0.0,
    force_sink_k: Annotated[Optional[int], typer.Option("--force-sink-k", help="Force-sink masking with k channels (seed 003; 16 there).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a model field: key=value (repeatable), e.g. n_layer=2.")] = None,
    device: DeviceOpt = "auto",
    resume: Annotated[bool, typer.Option("--resume", help="Continue the checkpoint in --out.")] = False,
    overwrite: OverwriteOpt = False,
    progress: ProgressOpt = True,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code", help="Allow code in the --tokenizer folder to run (never a checkpoint's own tokenizer's).")] = False,
) -> None:
    """Train a small GPT-2-style model with one of the attention variants of SPEC.md.

    The checkpoint folder is a MODEL for every probe command (e.g. `sinkscope sinks ckpt/`).

    Examples:

    \b
        sinkscope train --variant sink+proj --tier tiny --seed 0 --out ckpt/sink-proj

    \b
        sinkscope train --variant baseline --tier tiny --set n_layer=2 --steps 100 --out ckpt/quick

    \b
        sinkscope train --task trigger --variant sinklogit --seed 1 --out ckpt/trigger-sinklogit

    \b
        sinkscope train --variant sinklogit --set layer_pattern=sliding,full --set window=32 --out ckpt/gptoss-like

    \b
        torchrun --nproc-per-node 8 -m sinkscope train --variant sinklogit --tier 124M --out ckpt/124m
    """
    from sinkscope.train.loop import TrainOptions, train as train_model

    options = TrainOptions(
        variant=variant, task=task, windows=windows, task_options=list(task_set or []), tier=tier, seed=seed, out=out, steps=steps, batch_size=batch_size, lr=lr,
        min_lr=min_lr, warmup_steps=warmup_steps, grad_accum=grad_accum, eval_every=eval_every,
        checkpoint_every=checkpoint_every, stop_at=stop_at, monitor_every=monitor_every, text_file=text_file, dataset=dataset, tokenizer=tokenizer, tnlm=tnlm, lb_lambda=lb_lambda,
        force_sink_k=force_sink_k, overrides=list(set_ or []), device=device, resume=resume,
        overwrite=overwrite, progress=progress, trust_remote_code=trust_remote_code,
    )
    try:
        folder = train_model(options)
    except KeyboardInterrupt:
        word, code = _interrupted()
        typer.echo(f"error: {word}; {out} keeps its last checkpoint, if one was written (continue with --resume).",
                   err=True)
        raise typer.Exit(code) from None
    if folder is not None:
        typer.echo(str(folder))


@app.command()
@_friendly_errors
def sweep(
    variants: Annotated[str, typer.Option("--variants", help="Comma-separated trainer variants.")] = "baseline,sinklogit,normgate,projgate,sink+norm,sink+proj",
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated seeds (shared across variants: paired).")] = "0,1,2",
    task: Annotated[str, typer.Option("--task", help="trigger | text.")] = "trigger",
    tier: Annotated[Optional[str], typer.Option("--tier", help="A trainer tier [default: micro for trigger, tiny for text].")] = None,
    out: Annotated[str, typer.Option("--out", "-o", help="The sweep folder (runs, tables, report); rerun to resume.")] = "sweeps/sweep",
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps per run [default: the tier's].")] = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", help="Sequences per step [default: the tier's].")] = None,
    eval_windows: Annotated[int, typer.Option("--eval-windows", help="Fixed validation windows whose loss the tables compare.")] = 64,
    task_set: Annotated[Optional[list[str]], typer.Option("--task-set", help="A task option key=value (repeatable), as for train.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="A model field key=value for every run (repeatable), as for train.")] = None,
    text_file: TextFileOpt = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="--task text: as for train [default: bpe4096].")] = None,
    windows: Annotated[Optional[str], typer.Option("--windows", help="--task text: doc-start (default) | random.")] = None,
    n_seqs: Annotated[int, typer.Option("--n-seqs", help="Validation windows the sinks/selectivity probes measure.")] = 64,
    probe: Annotated[bool, typer.Option("--probe/--no-probe", help="Run sinks (and selectivity on gated variants) on every checkpoint.")] = True,
    monitor_every: Annotated[Optional[int], typer.Option("--monitor-every", help="The trainer's sink monitor every N steps in every run; the sweep draws p0 mass, phantom mass and value-norm ratio against the step, one line per variant (formation_*.png).")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Runs at once, as local processes.")] = 1,
    launcher: Annotated[str, typer.Option("--launcher", help="local | submitit (SLURM job array; needs submitit).")] = "local",
    slurm: Annotated[Optional[list[str]], typer.Option("--slurm", help="A submitit parameter key=value (repeatable), e.g. slurm_partition=gpu.")] = None,
    device: DeviceOpt = "auto",
) -> None:
    """Train every variant for every seed, probe each checkpoint, write seed 000's Tables 1 and 2.

    Finished runs are skipped and interrupted ones resumed, so rerunning the command continues it.
    --out is a new folder or this sweep's own: a folder holding files sinkscope did not write is refused.

    Examples:

    \b
        sinkscope sweep --variants baseline,sinklogit,normgate,projgate,sink+norm,sink+proj --seeds 0,1,2 --task trigger --out sweeps/trigger

    \b
        sinkscope sweep --variants baseline,sinklogit --seeds 0,1 --steps 200 --jobs 2 --out sweeps/quick

    \b
        sinkscope sweep --task text --tier tiny --seeds 0,1,2 --launcher submitit --slurm slurm_partition=gpu --out sweeps/text
    """
    from sinkscope.sweep import SweepOptions, parse_list, sweep as run_sweep

    options = SweepOptions(
        variants=parse_list(variants, "variants"), seeds=parse_list(seeds, "seeds", int), task=task, tier=tier,
        out=out, steps=steps, batch_size=batch_size, eval_windows=eval_windows, task_options=list(task_set or []),
        overrides=list(set_ or []), text_file=text_file, tokenizer=tokenizer, windows=windows,
        n_seqs=n_seqs, probe=probe, monitor_every=monitor_every, jobs=jobs, launcher=launcher,
        slurm=list(slurm or []), device=device,
    )
    try:
        page = run_sweep(options, log=lambda message: typer.echo(message, err=True))
    except KeyboardInterrupt:
        word, code = _interrupted()
        typer.echo(f"error: {word}; rerun the same command to continue the sweep in {out}.", err=True)
        raise typer.Exit(code) from None
    typer.echo(str(page))


@app.command()
@_friendly_errors
def toy(
    loads: Annotated[str, typer.Option("--loads", help="Comma-separated loads N/64 (features per dimension).")] = "1,2,4,8",
    conditions: Annotated[str, typer.Option("--conditions", help="blind (channel-blind keys) and/or visible (routing-visible keys).")] = "blind,visible",
    variants: Annotated[str, typer.Option("--variants", help="baseline, offbyone, normgate, oracle.")] = "baseline,offbyone,normgate,oracle",
    seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated seeds.")] = "0,1,2",
    steps: Annotated[int, typer.Option("--steps", help="Adam steps per model.")] = 4000,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per step.")] = 256,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads per training process [default: 1].")] = None,
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", help="Training processes, one (condition, load) group each [default: one per CPU].")] = None,
    out: Annotated[str, typer.Option("--out", "-o", help="Output folder (toy.csv, toy_summary.csv, toy.md, toy.png).")] = "reports/toy",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the toy task's earlier output in --out (never a folder holding files sinkscope did not write).")] = False,
) -> None:
    """Seed 000's toy superposition task: error by load per variant and the share of headroom closed.

    Examples:

    \b
        sinkscope toy

    \b
        sinkscope toy --loads 1,8 --seeds 0 --steps 500 --out reports/toy-quick
    """
    from sinkscope.sweep import parse_list
    from sinkscope.toy import ToyOptions, run_toy

    options = ToyOptions(loads=parse_list(loads, "loads", int), conditions=parse_list(conditions, "conditions"),
                         variants=parse_list(variants, "variants"), seeds=parse_list(seeds, "seeds", int),
                         steps=steps, batch_size=batch_size, threads=threads, jobs=jobs, out=out, overwrite=overwrite)
    typer.echo(str(run_toy(options, log=lambda message: typer.echo(message, err=True))))


@app.command("run")
@_friendly_errors
def run_recipe_command(
    recipe: Annotated[list[str], typer.Argument(help="One or more recipe TOML files, e.g. probes/sinks-smollm2.toml, run in order.")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override an option: key=value (repeatable); applies to every recipe given.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="The MODEL of the recipes' measuring steps (the same as --set model=...).")] = None,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code", help="Let the steps' models (and a train step's --tokenizer folder) run their own Python code; a recipe's trust_remote_code = true needs this.")] = False,
    plugin: Annotated[Optional[list[str]], typer.Option("--plugin", help="A probe plugin file for the measure steps (repeatable); a recipe's plugins = [...] must be given here too.")] = None,
    allow_recipe_code: Annotated[bool, typer.Option("--allow-recipe-code", help="Run the code the recipes name (trust_remote_code, plugins) without repeating it here.")] = False,
) -> None:
    """Run probe recipes (TOML files naming a command and its options, or steps).

    A measuring step without an `out` writes to reports/<time>-<recipe>-<model>-...: the recipe's
    name is in the run folder's name. A recipe is a file someone hands you, like a model: code it
    names (trust_remote_code = true, plugins = [...]) runs only with --trust-remote-code, --plugin
    or --allow-recipe-code, and the run first says which code it runs.

    Examples:

    \b
        sinkscope run probes/sinks-smollm2.toml

    \b
        sinkscope run probes/sinks-smollm2.toml probes/sinks-smollm2-bos.toml --model EleutherAI/pythia-160m

    \b
        sinkscope run probes/sinks-smollm2.toml --set n_seqs=4 --set out=runs/quick
    """
    import json

    from sinkscope.recipes import run_recipes

    overrides = list(set_ or []) + ([f"model={json.dumps(model)}"] if model is not None else [])
    for result in run_recipes(recipe, overrides, log=lambda message: typer.echo(message, err=True),
                              allow_code=allow_recipe_code, trust_remote_code=trust_remote_code,
                              plugins=tuple(plugin or ())):
        typer.echo(str(result))


LISTINGS = ("probes", "hooks", "families", "commands")


@app.command("ls")
@_friendly_errors
def list_things(
    what: Annotated[str, typer.Argument(help="probes | hooks | families | commands")] = "probes",
    model: Annotated[Optional[str], typer.Argument(help="With hooks: a model whose hook points to list (hub id, folder, .gguf, checkpoint).", show_default=False)] = None,
    plugin: Annotated[Optional[list[str]], typer.Option("--plugin", help="A Python file that registers probes (repeatable).")] = None,
    trust_remote_code: TrustOpt = False,
) -> None:
    """List the probes (metrics, hook points, parameters), the hook points (of one model), the families or the commands.

    Examples:

    \b
        sinkscope ls probes

    \b
        sinkscope ls hooks

    \b
        sinkscope ls families
    """
    if what == "probes":
        from sinkscope.probes import discover, load_plugin

        probes = discover()
        for path in plugin or ():
            load_plugin(path)
        for name, cls in sorted(probes.items()):
            typer.echo(f"{name}: {cls.summary}")
            typer.echo(f"  hook points: {', '.join(cls.hooks)}")
            for param in cls.params:
                typer.echo(f"  parameter {param.name} ({param.type.__name__}, default {param.default!r}): {param.help}")
            for metric, info in cls.metrics.items():
                typer.echo(f"  metric {metric:28s} {info.label} [{info.unit}] ({info.source})")
    elif what == "hooks":
        from sinkscope.capture.hooks import HOOK_POINTS, INTERVENABLE

        absent = _absent_hooks(model, trust_remote_code) if model is not None else {}
        for name, point in HOOK_POINTS.items():
            mark = " (intervenable)" if name in INTERVENABLE else ""
            if name in absent:
                typer.echo(f"{name:34s} {'absent':18s} {absent[name]}")
            else:
                typer.echo(f"{name:34s} {point.shape:18s} {point.what}{mark}")
    elif what == "families":
        from sinkscope.conformance.matrix import read_verified

        typer.echo("Any transformers causal LM with softmax attention is measured: its parts are found by watching "
                   "one forward pass. Verified by the conformance matrix (docs/architectures.md):")
        for row in read_verified():
            extras = ", ".join(x for x in (row.get("sink") and f"sink {row['sink']}",
                                           row.get("gate") and f"gate {row['gate']}") if x)
            typer.echo(f"{row['model_type']:24s} {row['status']:8s} {row.get('path', '')}"
                       + (f" ({extras})" if extras else ""))
    elif what == "commands":
        for name, summary in sorted(_command_summaries().items()):
            typer.echo(f"{name:12s} {summary}")
    else:
        from sinkscope.errors import suggest

        raise SinkscopeError(f"unknown listing {what!r}{suggest(what, LISTINGS)}; use {', '.join(LISTINGS)}.")


def _command_summaries() -> dict[str, str]:
    """Every command of the CLI (measuring or not) with the first line of its help."""
    import inspect

    summaries = {}
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.lower().replace("_", "-")  # typer's own naming
        summaries[name] = (info.help or inspect.getdoc(info.callback) or "").strip().split("\n")[0]
    return summaries


def _absent_hooks(model: str, trust_remote_code: bool) -> dict[str, str]:
    """The hook points a model lacks, with the reason (its parts found by ``capture.discover``)."""
    from sinkscope.resolve import resolve_source

    source = resolve_source(model)
    from sinkscope.capture.families import ModelSpec, family_of
    from sinkscope.sources import load_model, remote_code_note

    note = remote_code_note(source) if trust_remote_code else None
    if note:
        typer.echo(f"trust_remote_code: {note}", err=True)

    loaded = load_model(source, device="cpu", dtype="float32", trust_remote_code=trust_remote_code, log=lambda m: None)
    if hasattr(loaded.model, "model_spec"):  # the bundled trainer emits every point itself
        return {}
    parts = family_of(loaded.model)
    ModelSpec.from_model(loaded.model)
    typer.echo(f"{model}: {parts.label}, layers {parts.layers}, attention {parts.attention} in layers "
               f"{', '.join(map(str, parts.attention_layers))}"
               f"{', parallel residual' if parts.parallel else ''}{f', learned sink ({parts.sink_form})' if parts.sink_form else ''}")
    return {name: reason for name, reason in parts.absent.items()}


def main() -> None:  # pragma: no cover - console entry for python -m
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app(prog_name="sinkscope")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
