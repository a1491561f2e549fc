"""Commands that read what exists: ``report`` (a run's page, or several compared) and ``ls``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sinkscope.cli.application import _friendly_errors, app
from sinkscope.cli.options import TrustOpt
from sinkscope.errors import SinkscopeError


@app.command()
@_friendly_errors
def report(
    run_dirs: Annotated[list[str], typer.Argument(help="One or more run folders, or the folder of a comparison (its page is redrawn).")],
    out: Annotated[Optional[str], typer.Option("--out", "-o", help="Output folder (default: the run folder for one run, reports/compare-<time> for several).")] = None,
    label: Annotated[Optional[list[str]], typer.Option("--label", help="A name per run, in order (default: folder names).")] = None,
    group_by: Annotated[Optional[str], typer.Option("--group-by", help="Average runs sharing a condition (variant, seed, step, tier) and compare the groups.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the report in an --out folder that already holds one (never a folder holding files sinkscope did not write); rebuilding a run's own report needs none.")] = False,
) -> None:
    """Rebuild a run's report.html, or compare several runs on one page (no model is loaded).

    Examples:

    \b
        sinkscope report reports/20261129-150033-sinks-SmolLM2-135M-Instruct.Q4_1-s0-3fa2c1

    \b
        sinkscope report runs/bos-none runs/bos-add --label "no BOS" --label "BOS" --out runs/bos-compare

    \b
        sinkscope report runs/ckpt-* --group-by variant --out runs/by-variant

    \b
        sinkscope report runs/zoo                        # a comparison's folder: its page again
    """
    from sinkscope.store.comparison_record import read_comparison_record
    from sinkscope.runtime.paths import user_path
    from sinkscope.report import build_report

    record = read_comparison_record(user_path(run_dirs[0], "RUN_DIRS")) if len(run_dirs) == 1 else None
    if record is not None:  # a comparison's folder: its runs, in order, their labels; its page, or one in --out
        folder = Path(user_path(run_dirs[0], "RUN_DIRS"))
        runs = [folder / name for name in record["runs"] if (folder / name / "manifest.json").is_file()]
        if not runs:
            raise SinkscopeError(f"no run of the comparison {folder} has finished; rerun its command with --resume.")
        labels = label or ([lab for lab, name in zip(record["labels"], record["runs"])
                            if (folder / name / "manifest.json").is_file()] if record["labels"] else None)
        own = out is None or Path(user_path(out, "--out")).resolve() == folder.resolve()
        typer.echo(str(build_report(runs, out=folder if own else out, labels=labels,
                                    group_by=group_by or record["group_by"], overwrite=True if own else overwrite)))
        return
    if label and len(label) != len(run_dirs):
        raise SinkscopeError(f"give one --label per run folder ({len(run_dirs)}), not {len(label)}.")
    typer.echo(str(build_report(run_dirs, out=out, labels=label, group_by=group_by, overwrite=overwrite)))



LISTINGS = ("probes", "hooks", "families", "commands", "runs")
#: where ``ls runs`` looks without a FOLDER: where a run without --out is written.
RUNS_FOLDER = "reports"


@app.command("ls")
@_friendly_errors
def list_things(
    what: Annotated[str, typer.Argument(help="probes | hooks | families | commands | runs")] = "probes",
    model: Annotated[Optional[str], typer.Argument(metavar="[MODEL|FOLDER]", help="With hooks: a model whose hook points to list (hub id, folder, .gguf, checkpoint). With runs: the folder whose runs to list [default: reports].", show_default=False)] = None,
    plugin: Annotated[Optional[list[str]], typer.Option("--plugin", help="A Python file that registers probes (repeatable).")] = None,
    trust_remote_code: TrustOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="With runs: the list as JSON (each run's folder, command, model, date and headline metrics).")] = False,
) -> None:
    """List the probes (metrics, hook points, parameters), the hook points (of one model), the families, the commands or the runs of a folder.

    Examples:

    \b
        sinkscope ls probes

    \b
        sinkscope ls hooks

    \b
        sinkscope ls families

    \b
        sinkscope ls runs                                # every run under reports/: command, model, date, headline
    """
    if as_json and what != "runs":
        raise SinkscopeError(f"--json lists runs (sinkscope ls runs --json), not {what}.")
    if what == "runs":
        _list_runs(model or RUNS_FOLDER, as_json)
    elif what == "probes":
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
        from sinkscope.capture.hooks import TRACE_DERIVED

        typer.echo("and by TransformerLens's names, what sinkscope.trace(MODEL, text) also gives (read off the "
                   "attention record and the residual stream):")
        for name, (shape, what_it_is) in TRACE_DERIVED.items():
            typer.echo(f"{name:34s} {shape:18s} {what_it_is}")
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


def _list_runs(folder: str, as_json: bool) -> None:
    """``ls runs``: one line per run under ``folder`` (its runs, and the runs of its comparisons), oldest first."""
    import json

    from sinkscope.report.summary import format_listing, list_runs
    from sinkscope.runtime.paths import user_path

    path = Path(user_path(folder, "FOLDER"))
    if not path.is_dir() and folder == RUNS_FOLDER:  # nothing run here yet: an empty list, not an error
        typer.echo("[]" if as_json else f"no runs here: no folder {RUNS_FOLDER} (a command given no --out writes its "
                                         "run there); name the folder that holds your runs: sinkscope ls runs FOLDER.")
        return
    if not path.is_dir():
        raise SinkscopeError(f"no folder {folder} to list runs in.")
    listed = list_runs(path)
    if as_json:
        typer.echo(json.dumps(listed, indent=1, allow_nan=False))
    elif not listed:
        typer.echo(f"no runs in {folder} (a run folder holds a manifest.json).")
    else:
        typer.echo(format_listing(listed))


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
    from sinkscope.models.resolve import resolve_source

    source = resolve_source(model)
    from sinkscope.capture.families import ModelSpec, family_of
    from sinkscope.run.loaders import load_model, remote_code_note

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
