"""The options the commands share, declared once: ``typer`` annotations the command modules use."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

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



#: the options every measuring command takes, in the order --help lists them: before the command's
#: own options (HEAD) and after them (TAIL); (name, annotation, default).
HEAD = (("text_file", TextFileOpt, None), ("dataset", DatasetOpt, None), ("seq_len", SeqLenOpt, None),
        ("n_seqs", NSeqsOpt, 16), ("batch_size", BatchOpt, 4), ("seed", SeedOpt, 0), ("bos", BosOpt, "auto"),
        ("device", DeviceOpt, "auto"), ("dtype", DtypeOpt, "auto"), ("revision", RevisionOpt, None),
        ("trust_remote_code", TrustOpt, False))
TAIL = (("overwrite", OverwriteOpt, False), ("figures", FiguresOpt, True), ("progress", ProgressOpt, True),
        ("attention", AttentionOpt, "fused"), ("resume", ResumeOpt, False), ("device_map", DeviceMapOpt, None),
        ("checkpoint_seconds", CheckpointSecondsOpt, 30.0))


def run_options(*, skip: tuple[str, ...] = (), **defaults):
    """Declare the shared options on a measuring command once: the decorated function takes ``MODEL``,
    ``--out`` and its own options, and ``**shared``; its signature (what typer reads) gains :data:`HEAD`
    after ``--out`` and :data:`TAIL` at the end, with ``defaults`` replacing a shared default
    (``n_seqs=256``) and the names in ``skip`` left out (``stream`` reads ``--length``, not ``--seq-len``)."""
    import inspect

    def shared(entries) -> list[inspect.Parameter]:
        return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                  default=defaults.get(name, default))
                for name, annotation, default in entries if name not in skip]

    def decorate(func):
        own = [p for p in inspect.signature(func, eval_str=True).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        first = [p for p in own if p.name in ("model", "out")]
        rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p.name not in ("model", "out")]
        func.__signature__ = inspect.Signature(first + shared(HEAD) + rest + shared(TAIL))
        return func

    return decorate
