"""One plan, built once (DESIGN.md "One plan, many executors"): what every entry hands the pipeline.

    plan(command, options, models=..., revisions=...) -> [Plan, ...]

Every check that needs no torch runs here, once, before anything heavy is imported: the options
(``options.check_options`` and the command's own ``check``), the models (a list, a folder of trainer
checkpoints, the revisions of one model), each model resolved to a :class:`~sinkscope.models.resolve.Source`
once, the text file, and the output folders (a run folder, or the folder of a comparison of several
runs). The command line, ``sinkscope.measure``, recipes and sweeps call it exactly once; the pipeline
(``run.dispatch.execute``, then ``run.stages.run_plan``) loads, measures and writes each plan without resolving or re-checking
what is here.

A :class:`Plan` is a plain record: picklable, and ``to_dict`` gives the JSON the run's manifest
stores under ``plan``. Several plans share one :class:`Comparison`: the folder holding their runs
and how its page draws them (a ``series`` is one model's checkpoints, drawn against the step).

The checks that read a model's config.json or its weights' sizes (``Command.check_source``, the
memory estimate) need ``run/loaders.py`` and run in the pipeline's first stage, before the weights load.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Sequence

from sinkscope.errors import SinkscopeError, option
from sinkscope.commands.spec import Command, RunOptions, check_options, parse_seq_len
from sinkscope.models.resolve import Source, checkpoint_series, one_training, parse_revisions, resolve_source, revision_step

#: the inventory writer of a comparison's folder (``fileio.write_inventory``).
COMPARISON_WRITER = "comparison"


@dataclass(frozen=True)
class Comparison:
    """Several runs compared on one page.

    Attributes:
        folder: the folder holding one run folder per plan and the page.
        series: the runs are one model's checkpoints (revisions, or a folder of trainer checkpoints):
            the page draws every metric against the step, and every run measures the first's windows.
        group_by: a condition column (``variant``, ``seed``, ``step``, ``tier``) whose runs are averaged.
        labels: one name per run for the page (None: the run folders' names, or the revisions).
        figures: draw the page (``--no-figures``: the runs' tables only; the runs never draw their own).
    """

    folder: str
    series: bool = False
    group_by: str | None = None
    labels: tuple[str, ...] | None = None
    figures: bool = True


@dataclass(frozen=True)
class Plan:
    """One run of one command on one model: resolved and checked, nothing loaded.

    Attributes:
        command: the command's name (``commands.get_command``).
        options: the run's options (``model``, ``revision`` and ``out`` this run's own).
        source: the model, resolved once.
        conditions: columns every row of the run gets (a series: ``step`` and ``revision``).
        comparison: the comparison this run is one of, or None for a run alone.
    """

    command: str
    options: RunOptions
    source: Source
    conditions: tuple[tuple[str, Any], ...] = ()
    comparison: Comparison | None = None

    def to_dict(self) -> dict:
        """The plan as JSON-able data (the manifest's ``plan``)."""
        return {"command": self.command, "options": asdict(self.options), "source": self.source.to_dict(),
                "conditions": dict(self.conditions),
                "comparison": None if self.comparison is None else asdict(self.comparison)}


def make_options(command: Command, values: dict | RunOptions) -> RunOptions:
    """The command's options from keyword values (lists become tuples; ``seq_len`` "128,512" is parsed); a
    name the command does not take is one sentence, never left out (the CLI's parameters are checked
    against the fields when it is imported: ``cli.options.run_options``)."""
    if isinstance(values, RunOptions):
        return values
    names = {f.name for f in fields(command.options)}
    unknown = sorted(set(values) - names)
    if unknown:
        from sinkscope.errors import suggest

        raise SinkscopeError(f"{command.name} has no option {unknown[0]!r}{suggest(unknown[0], names)}.")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    if "seq_len" in values:
        values["seq_len"] = parse_seq_len(values["seq_len"])
    return command.options(**values)


def _models(options: RunOptions, models, revisions) -> tuple[list[str | None], list[str | None], bool]:
    """(models, revisions, series): one entry per run (the CLI's ``MODEL [MODEL ...]`` and ``--revision``)."""
    if models is None:
        given = [options.model] if options.model else []
    elif isinstance(models, (str, os.PathLike)):
        given = [os.fspath(models)]
    elif isinstance(models, (list, tuple)) and all(isinstance(m, (str, os.PathLike)) or m is None for m in models):
        given = [os.fspath(m) if m is not None else None for m in models]
    else:
        raise SinkscopeError(f"models are hub ids or paths, not a {type(models).__name__}.")
    if revisions is None:
        revisions = parse_revisions(options.revision)
    elif isinstance(revisions, str):
        revisions = parse_revisions(revisions)
    else:
        revisions = parse_revisions(",".join(str(r) for r in revisions)) if revisions else [None]
    if len(revisions) > 1:
        if len(given) > 1:
            raise SinkscopeError("several revisions are the checkpoints of one model; give one MODEL with "
                                 f"{option('revision')} A,B,... (or several MODELs without it).")
        return [given[0] if given else None] * len(revisions), revisions, True
    if len(given) == 1:
        found = checkpoint_series(given[0])  # a folder of trainer checkpoints: one training's, or several
        if found:
            return (found, [revisions[0]] * len(found), True) if one_training(found) else \
                (found, [revisions[0]] * len(found), False)
    return (given or [None]), [revisions[0]] * max(1, len(given)), False


def run_folder_names(sources: list[Source]) -> list[str]:
    """One folder name per model: its label (a checkpoint's folder name), made safe and distinct."""
    names: list[str] = []
    for source in sources:
        base = re.sub(r"[^A-Za-z0-9._+-]+", "-", source.label or source.location).strip("-.") or "model"
        name, k = base, 2
        while name in names:
            name, k = f"{base}-{k}", k + 1
        names.append(name)
    return names


def check_comparison_dir(parent: Path, overwrite: bool, resume: bool) -> None:
    """Refuse a several-model ``--out`` that this comparison may not write (before any model loads).

    Absent or empty: fine. Holding only what sinkscope wrote for an earlier comparison (its
    inventory, or before inventories its page, figures and run folders): needs ``overwrite`` or
    ``resume``. Holding anything else (a user's file, a model), or another writer's folder (a
    report's, a checkpoint's, a sweep's): refused, with or without them.
    """
    from sinkscope.store.files import check_replaceable, read_inventory
    from sinkscope.report.folder import report_folder_legacy

    parent = Path(parent)
    inventory = read_inventory(parent) if parent.is_dir() and not parent.is_symlink() else None
    if inventory is not None and inventory["writer"] != COMPARISON_WRITER:
        raise SinkscopeError(f"{option('out')} {parent} was written by sinkscope's {inventory['writer'] or 'unknown'} writer, not "
                             f"by a comparison of several models; choose another {option('out')}.")
    check_replaceable(parent, overwrite or resume, kind="comparison", legacy=report_folder_legacy(parent),
                      hint="pass --overwrite to replace its runs, or --resume to keep the finished ones")


def _check_text_file(options: RunOptions) -> None:
    if options.text_file and not options.dataset and not os.path.isfile(os.path.expanduser(options.text_file)):
        raise SinkscopeError(f"no text file at {options.text_file}.")  # corpus.text_file_corpus's sentence


def in_memory_source(model) -> Source:
    """The :class:`Source` of a model handed over as an object (``sinkscope.measure(what, model)``): nothing to
    resolve or reload; named after its config's ``name_or_path`` where it has one."""
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None) or type(model).__name__
    return Source("object", f"<{type(model).__name__}>", None, label=Path(str(name)).name or type(model).__name__)


def plan(command: Command | str, options: RunOptions | dict, *, models: str | Sequence[str | None] | None = None,
         revisions: str | Sequence[str | None] | None = None, group_by: str | None = None,
         labels: Sequence[str] | None = None, write: bool = True, name_prefix: str | None = None,
         model_object=None) -> list[Plan]:
    """Check and resolve everything a run can fail on without torch; one :class:`Plan` per run.

    Args:
        command: a measuring command or its name.
        options: its options (or keyword values for them, as the CLI and the API hand them).
        models: one model or several (default: ``options.model``); a folder of trainer checkpoints
            is their series (one training's) or several models (several trainings').
        revisions: hub revisions of one model (``"step0,step1000"`` or a list): its series.
        group_by: several models: average the runs sharing this condition on the comparison page.
        labels: several models: their names on the page, one per model.
        write: the runs will be written (their folders are checked here); False for the API's
            in-memory result of one run.
        name_prefix: a run alone written without ``--out`` goes to ``reports/<time>-<command>-<prefix>-<model>-...``
            (a recipe's name); the default folder is named here, once, whatever the prefix.
        model_object: a model handed over as an object (the Python API): the one model, its
            :func:`in_memory_source` (``models`` and ``revisions`` must not be given).

    Returns:
        One plan for a run alone; for several models or revisions, one per run, sharing a
        :class:`Comparison` (its folder checked here).
    """
    from sinkscope.commands import get_command

    command = get_command(command) if isinstance(command, str) else command
    options = make_options(command, options)
    if model_object is not None:
        check_options(options)
        command.check(options)
        return [Plan(command.name, options, in_memory_source(model_object))]
    given, revisions, series = _models(options, models, revisions)
    several = series or len(given) > 1
    if group_by and not several:
        raise SinkscopeError(f"{option('group_by')} averages runs of several models; give more than one MODEL.")
    if group_by and series:
        raise SinkscopeError(f"{option('group_by')} averages runs of several models; a model's checkpoints are drawn against the "
                             "step, not grouped.")
    if labels is not None and len(labels) != len(given):
        raise SinkscopeError(f"give one label per model ({len(given)}), not {len(labels)}.")
    options = replace(options, model=None if several else given[0], revision=None if several else revisions[0])
    check_options(options)
    command.check(options)
    sources = [resolve_source(model, revision) for model, revision in zip(given, revisions)]
    _check_text_file(options)
    if not several:
        if write and options.out:
            from sinkscope.store.results import _check_not_cwd, check_run_dir

            if options.resume:  # the pipeline then looks for the interrupted run's progress file
                _check_not_cwd(Path(options.out))
            else:
                check_run_dir(Path(options.out), options.overwrite)
        elif write:  # reports/<time>-<command>-[<prefix>-]<model>-s<seed>-<hex>: a fresh name
            from sinkscope.store.results import default_run_dir

            label = sources[0].label or sources[0].location
            options = replace(options, out=str(default_run_dir(f"{name_prefix}-{label}" if name_prefix else label,
                                                               options.seed, command.name)))
        return [Plan(command.name, options, sources[0])]
    return _comparison_plans(command, options, sources, series, group_by, labels)


def _comparison_label(sources: list[Source]) -> str:
    """The model part of a comparison's default folder: the model of a series (one model's revisions), else
    ``compare``."""
    names = {source.label or source.location for source in sources}
    return names.pop() if len(names) == 1 else "compare"


def _comparison_plans(command: Command, options: RunOptions, sources: list[Source], series: bool,
                      group_by: str | None, labels: Sequence[str] | None) -> list[Plan]:
    """One plan per model of a comparison: ``<out>/<model>/`` each, the page in ``<out>``."""
    from sinkscope.store.files import check_inputs_outside
    from sinkscope.store.results import default_run_dir, is_run_folder

    command.check_sources(options, sources)
    parent = Path(options.out) if options.out else default_run_dir(_comparison_label(sources), options.seed,
                                                                    command.name)
    if is_run_folder(parent):
        raise SinkscopeError(f"{option('out')} {parent} is a run folder; several models need a folder of their own "
                             "(each model's run goes into a subfolder).")
    for source in sources:  # a run folder replaced in the parent could be the model, or hold it
        check_inputs_outside(parent, {"the model": source.path})
    check_comparison_dir(parent, options.overwrite, options.resume)
    by_revision = series and any(source.revision is not None for source in sources)
    names = run_folder_names([replace(source, label=source.revision) if by_revision else source
                              for source in sources])
    if series and labels is None:
        labels = [source.revision if by_revision else name for source, name in zip(sources, names)]
    comparison = Comparison(str(parent), series, group_by, tuple(labels) if labels is not None else None,
                            options.figures)
    plans = []
    for source, name in zip(sources, names):
        # the figures are drawn once, on the comparison page (`sinkscope report <out>/<model>` draws a run's own)
        each = replace(options, model=source.location, revision=source.revision, out=str(parent / name), figures=False)
        conditions = ()
        if series:
            conditions = ((("step", revision_step(source.revision)), ("revision", source.revision)) if by_revision
                          else (("revision", name),))
        plans.append(Plan(command.name, each, source, conditions, comparison))
    return plans
