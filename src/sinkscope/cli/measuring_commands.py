"""The measuring commands (``sinks``, ``selectivity``, ``heads``, ``inject``, ``circuit``, ``stream``,
``measure``): each is its options and ``execute(plan(...))`` (:func:`_run`)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from sinkscope.cli.application import _friendly_errors, app
from sinkscope.cli.options import DATA_PANEL, ModelArg, OutOpt, PanelledCommand, run_options



@app.command(cls=PanelledCommand)
@_friendly_errors
@run_options("sinks")
def sinks(
    model: ModelArg = None,
    out: OutOpt = None,
    sink_epsilon: Annotated[float, typer.Option("--sink-epsilon", help="Gu et al. threshold eps for sink_rate.")] = 0.3,
    sink_layer_start: Annotated[Optional[int], typer.Option("--sink-layer-start", help="First layer of the sink_rate_from_layer row (its layer_start column), a layer of the model [default: 2; no such row for a 2-layer model].")] = None,
    massive_top_k: Annotated[int, typer.Option("--massive-top-k", help="The K largest residual entries per layer (distinct position and channel) with channel, position, token and Sun et al.'s criterion [default: 0 = none; 10 with --massive-intervention].")] = 0,
    massive_min_abs: Annotated[float, typer.Option("--massive-min-abs", help="Massive: |h| above this (Sun et al.: 100).")] = 100.0,
    massive_min_ratio: Annotated[float, typer.Option("--massive-min-ratio", help="Massive: |h| at least this times the window's median |h| (Sun et al.: 1000).")] = 1000.0,
    sink_first_query: Annotated[Optional[int], typer.Option("--sink-first-query", help="sink_rate's alpha averages the queries t >= this [default: t >= k, Gu et al.'s]; 1 = the queries after the first (a first_query column).")] = None,
    inputs: Annotated[str, typer.Option("--inputs", help="text (the corpus's windows) | random (ids uniform over the vocabulary) | repeated (one id per window, repeated): Gu et al.'s three inputs, drawn with --seed.")] = "text",
    massive_intervention: Annotated[Optional[str], typer.Option("--massive-intervention", help="zero | mean: then set the massive top-k entries (at their first layer) to 0 or their mean and report the loss change: a second pass, clean and intervened.")] = None,
    **shared,
) -> None:
    """Measure position-0 mass, sink rate, phantom mass, value-norm ratio and massive activations.

    Writes results.csv/.parquet, manifest.json, tokens.npy and figures into a run folder.

    Examples:

    \b
        sinkscope sinks                                  # SmolLM2-135M-Instruct (Q4_1) on the bundled Austen corpus

    \b
        sinkscope sinks EleutherAI/pythia-1b --seq-len 1024 --n-seqs 64     # needs: weights (a hub model)

    \b
        sinkscope sinks model.gguf --text-file book.txt --bos add --out runs/book

    \b
        sinkscope sinks openai/gpt-oss-20b --device-map auto --dtype bfloat16    # needs: weights

    \b
        sinkscope sinks --massive-top-k 10 --massive-intervention zero   # Sun et al.: set them to 0, loss change

    \b
        sinkscope sinks --inputs random --seq-len 64 --n-seqs 64         # Gu et al.'s Table 1, random tokens

    \b
        torchrun --nproc-per-node 4 -m sinkscope sinks EleutherAI/pythia-1b --n-seqs 256   # needs: weights
    """
    _run("sinks", {**locals(), **shared})


def _run(name: str, values: dict):
    """``execute(plan(...))``: the command's options built from its parameters (``options_of``: each one a
    field of the options dataclass, checked when this module was imported), its plans (every check before
    torch is imported, the models resolved once: ``run.plan.plan``), then the runs
    (``run.dispatch.execute``); prints the summary of its headline metrics (``report.summary``: one row per
    run for several models or revisions, ``MODEL...``, ``--revision A,B``) and then the run folder or the
    comparison page (``explore`` prints its page itself); with ``--json`` the summary as JSON and nothing
    else on stdout. Returns what execute returned."""
    from sinkscope.cli.options import options_of
    from sinkscope.executors.settings import choose_executor
    from sinkscope.run.plan import plan

    as_json = bool(values.get("json"))
    fields, models, group_by, executor = options_of(name, values)
    executor_options = choose_executor(executor)
    plans = plan(name, fields, models=models, revisions=fields.get("revision"), group_by=group_by)
    from sinkscope.run.dispatch import execute, written_path

    outcome = execute(plans, executor_options=executor_options)
    if outcome is None:  # data-parallel processes other than 0
        return outcome
    path = written_path(outcome)
    _print_summary(path, as_json)
    if not as_json and name != "explore":
        typer.echo(str(path))
    return outcome


def _print_summary(path, as_json: bool) -> None:
    """The headline table (or its JSON) of what was written at ``path``; a summary that cannot be read
    (a folder changed under the run) is one line on stderr, never a failed command."""
    import json

    from sinkscope.errors import SinkscopeError
    from sinkscope.report.summary import format_summary, summarise

    try:
        summary = summarise(path)
    except SinkscopeError as error:
        typer.echo(f"note: no summary ({error})", err=True)
        if as_json:
            typer.echo(json.dumps({"path": str(path), "error": str(error)}))
        return
    if as_json:
        typer.echo(json.dumps(summary, indent=1, allow_nan=False))
    else:
        typer.echo(format_summary(summary))


@app.command(cls=PanelledCommand)
@_friendly_errors
@run_options("selectivity", n_seqs=256)
def selectivity(
    model: Annotated[Optional[list[str]], typer.Argument(metavar="MODEL", show_default=False, help="One or more gated models: trainer checkpoints with a value or output gate, or Hugging Face models with an output gate (Qwen3-Next). Several give one comparison page.")] = None,
    out: OutOpt = None,
    min_count: Annotated[int, typer.Option("--min-count", help="token_share_frequent (its min_count column) and the token tables count tokens seen at least K times.")] = 50,
    **shared,
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
    _run("selectivity", {**locals(), **shared})


@app.command(cls=PanelledCommand)
@_friendly_errors
@run_options("heads")
def heads(
    model: ModelArg = None,
    out: OutOpt = None,
    sink_set: Annotated[str, typer.Option("--sink-set", help="What A_sink sums: auto (the model's: its phantom if it has one, else key 0) | first | phantom | first+phantom | data (Fu et al. 2026 §6.2: keys of high attention and low value norm, plus any phantom).")] = "auto",
    sink_attention: Annotated[float, typer.Option("--sink-attention", help="--sink-set data: a key's mean attention (Gu et al.'s alpha_j) must exceed this.")] = 0.3,
    sink_value_ratio: Annotated[float, typer.Option("--sink-value-ratio", help="--sink-set data: a key's value norm must be below this times the window's median.")] = 0.5,
    sink_min_queries: Annotated[int, typer.Option("--sink-min-queries", help="--sink-set data: a key needs at least this many scoring queries (capped at half the window's).")] = 16,
    dormant_below: Annotated[float, typer.Option("--dormant-below", help="A head whose importance is below this is dormant.")] = 0.1,
    ablate_dormant: Annotated[bool, typer.Option("--ablate-dormant", help="Then zero the dormant heads (found on all windows) and report the loss change: a second pass, clean and ablated.")] = False,
    **shared,
) -> None:
    """Measure implicit gates, head importance, load imbalance (CV) and dormant heads (Fu et al. 2026).

    Several models or checkpoints give one run each and one comparison page; --out is then the
    folder holding one run folder per model (named after it) and the page.

    Examples:

    \b
        sinkscope heads                                          # SmolLM2-135M-Instruct (Q4_1) on the bundled corpus

    \b
        sinkscope heads --ablate-dormant --dormant-below 0.2     # zero the dormant heads: loss change

    \b
        sinkscope heads openai/gpt-oss-20b --sink-set first+phantom --device-map auto   # needs: weights

    \b
        sinkscope heads ckpt/base ckpt/lb --ablate-dormant --out runs/lb-vs-base
    """
    _run("heads", {**locals(), **shared})


@app.command(cls=PanelledCommand)
@_friendly_errors
@run_options("inject", skip=("batch_size", "seed"), rename={"cutoff": "cutoffs"})
def inject(
    model: ModelArg = None,
    out: OutOpt = None,
    eval_batch: Annotated[int, typer.Option("--eval-batch", help="Windows per evaluation batch: structured junk is drawn across it, so it is part of the measurement (recorded in the manifest, never halved); with structured junk --n-seqs must be a multiple of it (at least 2).")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the window draw and of the junk (per batch and layer).", rich_help_panel=DATA_PANEL)] = 0,
    junk: Annotated[list[str], typer.Option("--junk", help="Junk types, repeatable or comma-separated: structured, same-context, gaussian, random-direction, own-direction (projection-gate checkpoints).")] = ["structured", "same-context", "gaussian"],  # noqa: B006
    cutoff: Annotated[list[str], typer.Option("--cutoff", help="Quiet-read cutoffs, repeatable or comma-separated: median, q25.")] = ["median", "q25"],  # noqa: B006
    doses: Annotated[str, typer.Option("--doses", help="Doses eps, comma-separated: the junk's norm is eps x the head's median read norm.")] = "0.2,0.4,0.8,1.6",
    draws: Annotated[int, typer.Option("--draws", help="Seeded draws of the junk per condition (draw d seeded by seed, batch, layer and d): the table gives the mean over draws and windows and its standard error over windows; K corrupted passes per condition, one shared clean pass.")] = 1,
    junk_source: Annotated[str, typer.Option("--junk-source", help="Where each layer's quiet set, median read norm m_h and transplanted junk come from: clean (the clean forward pass of the same batch, SPEC.md) or corrupted (the reads the layer receives after the layers below were corrupted; the protocol before 2026-12).")] = "clean",
    exposure: Annotated[bool, typer.Option("--exposure/--no-exposure", help="Also measure quiet and phantom mass on the clean pass.")] = True,
    **shared,
) -> None:
    """Corrupt every value head's quiet reads with junk and measure the loss increase (Wang 2026 §5).

    For each junk type, cutoff, dose and draw: one more forward pass per evaluation batch; the clean
    loss, the exposure (quiet and phantom mass) and, by default (--junk-source clean), each layer's
    quiet set, m_h and transplanted junk come from the clean pass of the same batches.
    Several models give one run each and one comparison page.

    Examples:

    \b
        sinkscope inject                                         # SmolLM2-135M-Instruct: 3 junk types x 2 cutoffs x 4 doses

    \b
        sinkscope inject --junk gaussian --cutoff q25 --doses 0.4,0.8 --n-seqs 8 --seq-len 256

    \b
        sinkscope inject --junk structured,gaussian --doses 0.2,0.8 --draws 3   # mean ± se over 3 junk draws

    \b
        sinkscope inject ckpt/projgate --junk own-direction,structured

    \b
        sinkscope inject ckpt/baseline ckpt/sink+proj --out runs/inject-cmp
    """
    _run("inject", {**locals(), **shared})


@app.command(cls=PanelledCommand)
@_friendly_errors
@run_options("circuit")
def circuit(
    model: ModelArg = None,
    out: OutOpt = None,
    later_position: Annotated[int, typer.Option("--later-position", help="The later position whose cross-window cosine is shown beside position 0's (capped to seq-len - 1).")] = 64,
    norm_ratio: Annotated[float, typer.Option("--norm-ratio", help="Position 0 'separates' at the first layer where its norm exceeds this times the median of the others.")] = 2.0,
    subtract_head: Annotated[Optional[list[str]], typer.Option("--subtract-head", help="A layer-0 head 0.H whose output is subtracted before the MLP PCA (repeatable; subtracted together, exact through hook_result).")] = None,
    scatter_positions: Annotated[int, typer.Option("--scatter-positions", help="Positions >= 1 per window in the PCA scatter (evenly spaced).")] = 32,
    scatter_windows: Annotated[int, typer.Option("--scatter-windows", help="Windows whose other positions enter the scatter (position 0 of every window always does).")] = 64,
    outlier_top: Annotated[int, typer.Option("--outlier-top", help="Outlier channels reported per layer.")] = 5,
    bos_experiments: Annotated[bool, typer.Option("--bos-experiments/--no-bos-experiments", help="Run the BOS experiments (Sink_0^eps with/without BOS, repeated first token): 2 x len(repeats) extra passes.")] = True,
    repeats: Annotated[Optional[list[int]], typer.Option("--repeats", help="How many times the first token is repeated (repeatable; 1 is the reference) [default: 1 2 4 8].")] = None,
    sink_epsilon: Annotated[float, typer.Option("--sink-epsilon", help="Gu et al.'s threshold eps of Sink_0^eps.")] = 0.3,
    **shared,
) -> None:
    """How the model makes position 0 special (the P0-sink study): norms, direction, attention output, MLP PCA, BOS.

    Per layer: the position-0 residual norm against the other positions and the first layer
    where it separates; the cross-window cosine of position 0 beside a later position; layer
    0's attention-output norm per position; the PCA of layer 0's MLP pre-activation with a
    separation score (optionally without chosen heads); outlier channels before and after the
    pre-norm; Sink_0^eps with and without BOS and the loss when the first token is repeated.

    Examples:

    \b
        sinkscope circuit                                  # SmolLM2-135M-Instruct, bundled corpus

    \b
        sinkscope circuit --bos none --subtract-head 0.3   # one head removed

    \b
        sinkscope circuit ckpt/base ckpt/forcesink -o runs/p0   # variants
    """
    values = {**locals(), **shared}
    values["subtract_head"] = tuple(subtract_head or ())
    values["repeats"] = tuple(repeats) if repeats else (1, 2, 4, 8)
    _run("circuit", values)


@app.command(cls=PanelledCommand)
@_friendly_errors
@run_options("stream", skip=("seq_len", "n_seqs", "batch_size"))  # its own --seq-len (alias --length) and --n-seqs
def stream(
    model: ModelArg = None,
    out: OutOpt = None,
    length: Annotated[int, typer.Option("--seq-len", "--length", help="Tokens per document (window), BOS included; one length, which may exceed the model's context (--length is the same option).", rich_help_panel=DATA_PANEL)] = 2048,
    n_seqs: Annotated[Optional[int], typer.Option("--n-seqs", help="Documents (windows of --seq-len tokens); 4 by default when --kv-bits quantises, so each quantised row has a standard error over documents.", rich_help_panel=DATA_PANEL, show_default="1, or 4 with --kv-bits")] = None,
    cache: Annotated[str, typer.Option("--cache", help="Cache sizes, comma-separated: the keys a cache holds when a token arrives (its query sees them and itself; exact at any --chunk).")] = "256",
    sink_tokens: Annotated[str, typer.Option("--sink-tokens", help="The sinks policy's first tokens, comma-separated (0 = window).")] = "4",
    policy: Annotated[str, typer.Option("--policy", help="Policies, comma-separated: full (dense reference), window, sinks (StreamingLLM), h2o (heavy hitters + recent).")] = "full,window,sinks,h2o",
    positions: Annotated[str, typer.Option("--positions", help="cache (positions within the cache, keys re-rotated; RoPE models), original (kvpress's), or both.")] = "cache",
    chunk: Annotated[int, typer.Option("--chunk", help="Tokens read per forward pass; the cache is cut back after each.")] = 64,
    mode: Annotated[str, typer.Option("--mode", help="stream (through the cache: memory bounded by it) | mask (one dense pass with the cache's mask: the exact reference, short texts).")] = "stream",
    h2o_recent: Annotated[float, typer.Option("--h2o-recent", help="h2o: the share of the cache kept for the most recent keys.")] = 0.5,
    bucket: Annotated[int, typer.Option("--bucket", help="Tokens per position bucket of the table and figures.")] = 256,
    kv_bits: Annotated[str, typer.Option("--kv-bits", help="Bits of the cached keys and values, comma-separated among 16 (not quantised, the reference), 8, 4, 3, 2.", rich_help_panel="Quantised cache")] = "16",
    kv_group: Annotated[str, typer.Option("--kv-group", help="Elements per quantisation group (32, 64, 128), comma-separated.", rich_help_panel="Quantised cache")] = "64",
    kv_scheme: Annotated[str, typer.Option("--kv-scheme", help="kivi (KIVI: keys per channel, values per token, the --kv-residual newest values exact) | kivi-grouped (sinkscope's variant: a value quantised with its key's group) | per-token (both per token), comma-separated.", rich_help_panel="Quantised cache")] = "kivi",
    kv_residual: Annotated[int, typer.Option("--kv-residual", help="kivi's residual length R, a multiple of --kv-group: keys wait in full precision until R have gathered; the R newest values stay exact (0 = the group size).", rich_help_panel="Quantised cache")] = 0,
    protect_sinks: Annotated[str, typer.Option("--protect-sinks", help="The document's first N tokens kept in full precision, comma-separated.", rich_help_panel="Quantised cache")] = "0",
    protect: Annotated[str, typer.Option("--protect", help="Keys kept in full precision by a rule, comma-separated: top-p0:N (the N of highest accumulated attention per layer and head, as KVSink) or random:N (its control).", rich_help_panel="Quantised cache")] = "",
    kv_backend: Annotated[str, typer.Option("--kv-backend", help="sinkscope (its quantiser, every setting) | transformers (its QuantizedCache with optimum-quanto, where it can: full cache, per-token, 2 or 4 bits, nothing protected; sinkscope's for the rest).", rich_help_panel="Quantised cache")] = "sinkscope",
    **shared,
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
        sinkscope stream openai/gpt-oss-20b --sink-tokens 0 --policy full,window --device-map auto   # needs: weights

    \b
        sinkscope stream --kv-bits 16,8,4,2 --protect-sinks 0,4 --policy full,window   # a quantised cache
    """
    _run("stream", {**locals(), **shared})


@app.command(cls=PanelledCommand)
@_friendly_errors
@run_options("measure", rename={"probe": "probes", "param": "params", "plugin": "plugins"})
def measure(
    model: ModelArg = None,
    probe: Annotated[list[str], typer.Option("--probe", "-p", help="A registered probe (repeatable; see `sinkscope ls probes`).")] = [],  # noqa: B006
    param: Annotated[Optional[list[str]], typer.Option("--param", "--set", help="A probe parameter PROBE.NAME=VALUE (repeatable); --set, the name other commands give their key=value overrides, is the same option.")] = None,
    plugin: Annotated[Optional[list[str]], typer.Option("--plugin", help="A Python file that registers probes (repeatable).")] = None,
    out: OutOpt = None,
    **shared,
) -> None:
    """Run any registered probes by name (a plugin file's included) and write a run folder.

    Examples:

    \b
        sinkscope measure --probe p0_mass --probe value_norm_ratio

    \b
        sinkscope measure ckpt/sinklogit --probe sink_rate --param sink_rate.epsilon=0.5

    \b
        sinkscope measure model.gguf --plugin my_probes.py --probe resid_norm   # README.md's probe, saved as my_probes.py
    """
    _run("measure", {**locals(), **shared, "param": param or [], "plugin": plugin or []})




@app.command(cls=PanelledCommand)
@_friendly_errors
@run_options("explore", cli_only=("open_page",), n_seqs=1, explore_windows=1)
def explore(
    model: ModelArg = None,
    out: OutOpt = None,
    text: Annotated[Optional[str], typer.Option("--text", help="The text to explore (or --text-file FILE); its first --seq-len tokens [default: 4,096, or the model's context if shorter].")] = None,
    open_page: Annotated[bool, typer.Option("--open", help="Open the page in the default browser when it is written.")] = False,
    **shared,
) -> None:
    """One text's attention explorer: the heads grid, each kept head's pattern and the text view.

    Writes a run folder whose report.html is the explorer (docs/explorer.md) and prints the page's path.

    Examples:

    \b
        sinkscope explore --text "The quick brown fox jumps over the lazy dog."

    \b
        sinkscope explore EleutherAI/pythia-1b --text-file essay.txt --explore-heads all --out runs/essay   # needs: weights
    """
    outcome = _run("explore", {**locals(), **shared})
    if outcome is None or shared.get("json"):
        return
    from sinkscope.run.dispatch import written_path

    page = written_path(outcome) / "report.html"
    typer.echo(str(page) if page.is_file() else str(written_path(outcome)))
    if open_page and page.is_file():
        import webbrowser

        webbrowser.open(page.resolve().as_uri())
