"""The options the commands share, declared once: ``typer`` annotations the command modules use."""

from __future__ import annotations

from typing import Annotated, Optional

import click
import typer
from typer.core import TyperCommand

ModelArg = Annotated[
    Optional[list[str]],
    typer.Argument(metavar="MODEL", show_default=False,
                   help="One or more models: hub id, save_pretrained folder, .gguf file or trainer checkpoint; several "
                        "give one run each and one comparison page; default: the bundled SmolLM2-135M-Instruct (Q4_1 GGUF, float32)."),
]
#: the sections of a command's --help after its own options, in this order (``rich_help_panel`` names;
#: :class:`PanelledCommand` prints them in plain text); a command's own panels ("Quantised cache") come first.
DATA_PANEL = "Data"
MODEL_PANEL = "Model and device"
OUTPUT_PANEL = "Output"
EXECUTOR_PANEL = "Executor"
PANELS = (DATA_PANEL, MODEL_PANEL, OUTPUT_PANEL, EXECUTOR_PANEL)

OutOpt = Annotated[Optional[str], typer.Option("--out", "-o", help="Run folder; with several models the folder holding one "
                                                                   "run per model and the comparison (default reports/<run-id>).",
                                               rich_help_panel=OUTPUT_PANEL)]
TextFileOpt = Annotated[Optional[str], typer.Option("--text-file", help="UTF-8 text to use instead of the bundled corpus.", rich_help_panel=DATA_PANEL)]
DatasetOpt = Annotated[Optional[str], typer.Option("--dataset", help="A datasets corpus NAME[:CONFIG][:SPLIT].", rich_help_panel=DATA_PANEL)]
SeqLenOpt = Annotated[Optional[str], typer.Option("--seq-len", help="Tokens per window, BOS included [default: 512, or the model's context if shorter]; several comma-separated lengths (128,512,2048) measure each in one run, on prefixes of the same windows.", rich_help_panel=DATA_PANEL)]
NSeqsOpt = Annotated[int, typer.Option("--n-seqs", help="Number of windows; each command's default is sized to its cost (the table: docs/commands/sinks.md).", rich_help_panel=DATA_PANEL)]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Windows per forward pass: memory and speed only, the numbers do not change (not the trainer's sequences per step).", rich_help_panel=MODEL_PANEL)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the window draw.", rich_help_panel=DATA_PANEL)]
BosOpt = Annotated[str, typer.Option("--bos", help="auto | add | none: prepend the BOS token to each window.", rich_help_panel=DATA_PANEL)]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N.", rich_help_panel=MODEL_PANEL)]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="auto (float32 on CPU, bfloat16 on GPU) | float32 (fp32) | bfloat16 (bf16) | float16 (fp16, half).", rich_help_panel=MODEL_PANEL)]
RevisionOpt = Annotated[Optional[str], typer.Option("--revision", help="Hub revision (branch, tag or commit); several, comma-separated (step0,step1000,...), measure each on the same windows into one folder with a step column.", rich_help_panel=MODEL_PANEL)]
StrictRevisionsOpt = Annotated[bool, typer.Option("--strict-revisions", help="A series (--revision A,B,... or checkpoints) in which two revisions load the same weights is an error, not a warning.", rich_help_panel=MODEL_PANEL)]
TrustOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Allow code from the model repository to run.", rich_help_panel=MODEL_PANEL)]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Replace an existing non-empty run folder.", rich_help_panel=OUTPUT_PANEL)]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.", rich_help_panel=OUTPUT_PANEL)]
FiguresOpt = Annotated[bool, typer.Option("--figures/--no-figures", help="Draw heatmaps and per-layer plots and write report.html; --no-figures writes neither (add them later with `sinkscope report RUN`).", rich_help_panel=OUTPUT_PANEL)]
AttentionOpt = Annotated[str, typer.Option("--attention", help="fused (linear memory) | explicit (eager weights, the reference).", rich_help_panel=MODEL_PANEL)]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run into the same --out.", rich_help_panel=OUTPUT_PANEL)]
LoaderOpt = Annotated[str, typer.Option("--loader", help="transformers (the model as it is) | transformer-lens (a TransformerLens 3 HookedTransformer built from it, measured through its hooks).", rich_help_panel=MODEL_PANEL)]
LoaderOptionOpt = Annotated[Optional[list[str]], typer.Option("--loader-option", help="--loader transformer-lens: TransformerLens's weight processing, KEY=true|false (fold_ln, center_writing_weights, center_unembed, fold_value_biases, refactor_factored_attn_matrices; repeatable) [default: its from_pretrained's].", rich_help_panel=MODEL_PANEL)]
DeviceMapOpt = Annotated[Optional[str], typer.Option("--device-map", help="Shard the model with accelerate: auto | balanced | sequential.", rich_help_panel=MODEL_PANEL)]
ExploreHeadsOpt = Annotated[str, typer.Option("--explore-heads", help="The heads whose attention patterns the report's explorer keeps: auto (4 drawn with --seed, then the 8 others of highest position-0 mass, the run's p0_mass where it has one) | all | none | LAYER.HEAD,... (3.1,5.0).", rich_help_panel=OUTPUT_PANEL)]
ExploreWindowsOpt = Annotated[int, typer.Option("--explore-windows", help="The explorer keeps the first N windows of tokens.npy (0: no explorer).", rich_help_panel=OUTPUT_PANEL)]
ExploreMaxMbOpt = Annotated[Optional[float], typer.Option("--explore-max-mb", help="The explorer's data in report.html stays within this many MB (later patterns are left out; window 0's top heads are kept first).", rich_help_panel=OUTPUT_PANEL)]
CheckpointSecondsOpt = Annotated[float, typer.Option("--checkpoint-seconds", help="Save the accumulators for --resume this often (0: every batch).", rich_help_panel=OUTPUT_PANEL)]
GroupByOpt = Annotated[Optional[str], typer.Option("--group-by", help="Several models: average the runs sharing a condition (variant, seed, step, tier) on the comparison page and in its differences.", rich_help_panel=OUTPUT_PANEL)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the summary (headline metrics with their se, top heads; for several models one entry per run and the differences) as JSON on stdout instead of the table and the folder.", rich_help_panel=OUTPUT_PANEL)]

ExecutorOpt = Annotated[str, typer.Option("--executor", help="Where the runs of several models, revisions or lengths go: local (this machine; --jobs processes) | ray | slurm (docs/scaling.md).", rich_help_panel=EXECUTOR_PANEL)]
JobsOpt = Annotated[int, typer.Option("--jobs", help="--executor local: runs at once, each in a process of its own.", rich_help_panel=EXECUTOR_PANEL)]
RayAddressOpt = Annotated[Optional[str], typer.Option("--ray-address", help="--executor ray: auto, HOST:PORT, [IPv6]:PORT or ray://HOST:PORT joins a cluster; none starts a local one.", rich_help_panel=EXECUTOR_PANEL)]
RayGpusOpt = Annotated[Optional[float], typer.Option("--ray-gpus-per-run", help="--executor ray: GPUs per run [default: 1 for cuda, a device map, or auto on a cluster with GPUs; else 0].", rich_help_panel=EXECUTOR_PANEL)]
SlurmPartitionOpt = Annotated[Optional[str], typer.Option("--slurm-partition", help="--executor slurm: the partition.", rich_help_panel=EXECUTOR_PANEL)]
SlurmGpusOpt = Annotated[Optional[int], typer.Option("--slurm-gpus-per-run", help="--executor slurm: GPUs per run [default: 1 for cuda or a device map, else 0].", rich_help_panel=EXECUTOR_PANEL)]
SlurmTimeOpt = Annotated[int, typer.Option("--slurm-time", help="--executor slurm: minutes each run may take.", rich_help_panel=EXECUTOR_PANEL)]
SlurmParallelOpt = Annotated[int, typer.Option("--slurm-array-parallelism", help="--executor slurm: runs at once.", rich_help_panel=EXECUTOR_PANEL)]
SlurmClusterOpt = Annotated[str, typer.Option("--slurm-cluster", help="--executor slurm: slurm (sbatch) | local (submitit's local processes) | debug (in this process).", rich_help_panel=EXECUTOR_PANEL)]

#: the engine's options (``executors.settings.ExecutorOptions``), the last section of every command that runs several plans
EXECUTOR_OPTIONS = (("executor", ExecutorOpt, "local"), ("jobs", JobsOpt, 1), ("ray_address", RayAddressOpt, None),
          ("ray_gpus_per_run", RayGpusOpt, None), ("slurm_partition", SlurmPartitionOpt, None),
          ("slurm_gpus_per_run", SlurmGpusOpt, None), ("slurm_time", SlurmTimeOpt, 60),
          ("slurm_array_parallelism", SlurmParallelOpt, 64), ("slurm_cluster", SlurmClusterOpt, "slurm"))


#: the options every measuring command takes, by section of its --help, in the order --help lists them
#: (after the command's own options); (name, annotation, default).
DATA_OPTIONS = (("text_file", TextFileOpt, None), ("dataset", DatasetOpt, None), ("seq_len", SeqLenOpt, None),
                ("n_seqs", NSeqsOpt, 16), ("seed", SeedOpt, 0), ("bos", BosOpt, "auto"))
MODEL_OPTIONS = (("device", DeviceOpt, "auto"), ("dtype", DtypeOpt, "auto"), ("device_map", DeviceMapOpt, None),
                 ("attention", AttentionOpt, "fused"), ("batch_size", BatchOpt, 4), ("revision", RevisionOpt, None),
                 ("strict_revisions", StrictRevisionsOpt, False),
                 ("trust_remote_code", TrustOpt, False), ("loader", LoaderOpt, "transformers"),
                 ("loader_option", LoaderOptionOpt, None))
OUTPUT_OPTIONS = (("overwrite", OverwriteOpt, False), ("resume", ResumeOpt, False), ("figures", FiguresOpt, True),
                  ("progress", ProgressOpt, True), ("json", JsonOpt, False), ("group_by", GroupByOpt, None),
                  ("checkpoint_seconds", CheckpointSecondsOpt, 30.0), ("explore_heads", ExploreHeadsOpt, "auto"),
                  ("explore_windows", ExploreWindowsOpt, 2), ("explore_max_mb", ExploreMaxMbOpt, 3.5))
#: shared CLI parameters that are no option field: ``--group-by`` is an argument of ``run.plan.plan``, ``--json``
#: what the command prints (``measuring_commands._run``).
NOT_FIELDS = ("group_by", "json")


#: per measuring command: (its CLI parameters renamed to option fields, CLI parameters that are no option)
ROUTES: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {}


def run_options(command: str, *, skip: tuple[str, ...] = (), rename: dict[str, str] | None = None,
                cli_only: tuple[str, ...] = (), **defaults):
    """Declare the shared options on the measuring command ``command`` once: the decorated function takes
    ``MODEL...``, ``--out`` and its own options, and ``**shared``; its signature (what typer reads) gains
    :data:`DATA_OPTIONS`, :data:`MODEL_OPTIONS`, :data:`OUTPUT_OPTIONS` and :data:`EXECUTOR_OPTIONS` after
    its own options (the sections of its --help, :class:`PanelledCommand`), with ``defaults`` replacing a
    shared default (``n_seqs=256``) and the names in ``skip`` left out (``stream`` declares its own
    ``--seq-len``, a single length that may exceed the model's context).

    The typed route: every parameter of the final signature must be a field of the command's options
    dataclass (``rename`` maps a CLI name to its field, ``--cutoff`` to ``cutoffs``; ``cli_only`` names
    what only the command line reads, ``--open``) or an executor option; anything else is a TypeError
    when the module is imported, never a value dropped at run time (:func:`options_of`)."""
    import inspect

    def shared(entries) -> list[inspect.Parameter]:
        return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                  default=defaults.get(name, default))
                for name, annotation, default in entries if name not in skip]

    def decorate(func):
        own = [p for p in inspect.signature(func, eval_str=True).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        # the order of typer's own panels too (each where its first option stands): --out opens Output
        first = [p for p in own if p.name == "model"]
        out = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p.name == "out"]
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p.name not in ("model", "out")]
        func.__signature__ = inspect.Signature(first + rest + shared(DATA_OPTIONS) + shared(MODEL_OPTIONS)
                                               + out + shared(OUTPUT_OPTIONS) + shared(EXECUTOR_OPTIONS))
        _check_route(command, [p.name for p in func.__signature__.parameters.values()], rename or {}, cli_only)
        ROUTES[command] = (dict(rename or {}), tuple(cli_only))
        return func

    return decorate


def _check_route(command: str, parameters: list[str], rename: dict[str, str], cli_only: tuple[str, ...]) -> None:
    """Every CLI parameter reaches a field of ``command``'s options (or the executor's), at import time."""
    from dataclasses import fields

    from sinkscope.commands import get_command
    from sinkscope.executors.settings import EXECUTOR_FIELDS

    known = {f.name for f in fields(get_command(command).options)} | set(EXECUTOR_FIELDS) | set(cli_only) | set(NOT_FIELDS)
    lost = [name for name in parameters if rename.get(name, name) not in known]
    if lost:
        raise TypeError(f"sinkscope {command}: the CLI parameters {lost} are no field of "
                        f"{get_command(command).options.__name__} (rename them, or declare them cli_only)")


def options_of(command: str, values: dict) -> tuple[dict, list[str] | None, str | None, dict]:
    """Split a measuring command's CLI values: (the option fields, by their field names; the models given;
    ``--group-by``; the executor's options). Renames and CLI-only names as :func:`run_options` declared them
    (``--json`` is the caller's to read)."""
    from sinkscope.executors.settings import EXECUTOR_FIELDS

    rename, cli_only = ROUTES[command]
    values = {rename.get(k, k): v for k, v in values.items() if k not in cli_only and k not in ("shared", "json")}
    executor = {k: values.pop(k) for k in list(values) if k in EXECUTOR_FIELDS}
    models, group_by = values.pop("model", None), values.pop("group_by", None)
    return values, (list(models) if isinstance(models, (list, tuple)) else models), group_by, executor


def executor_params(*, skip: tuple[str, ...] = ()):
    """Declare :data:`EXECUTOR_OPTIONS` (less ``skip``: ``sweep`` and ``toy`` keep their own ``--jobs``) at the end of
    a lab command's signature; the function takes them as ``**engine``."""
    import inspect

    def decorate(func):
        own = [p for p in inspect.signature(func, eval_str=True).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
                 for name, annotation, default in EXECUTOR_OPTIONS if name not in skip]
        func.__signature__ = inspect.Signature(own + added)
        return func

    return decorate


class PanelledCommand(TyperCommand):
    """A command whose --help lists its options in sections, in click's plain text (the app sets no rich
    markup, so typer's own panels are not drawn): "Options", the command's own (and -h), then the
    command's own ``rich_help_panel`` sections in the order they first appear, then :data:`PANELS`
    (Data, Model and device, Output, Executor) in that order; empty sections are left out."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        arguments: list[tuple[str, str]] = []
        sections: dict[str, list[tuple[str, str]]] = {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:  # hidden
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                sections.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        for title in sorted(sections, key=lambda title: PANELS.index(title) + 1 if title in PANELS else 0):
            if sections[title]:
                with formatter.section(title):
                    formatter.write_dl(sections[title])
