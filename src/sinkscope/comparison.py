"""Several runs, one comparison: the plans of several models (or of one model's checkpoints) run one
after the other into one folder, and one page compares them.

``plan.plan`` resolved and checked every model and the folder; here each plan is prepared (its
lock taken, its corpus read) before the first loads, then run. ``<out>`` holds one run folder per
model, named after it (``<out>/<checkpoint folder name>/``: tables, manifest and tokens;
``sinkscope report <out>/<model>`` draws its own page), and the comparison ``<out>/report.html``
with its ``figures/``, built from them (``report.build_report``; ``group_by`` a condition column
such as ``variant`` or ``tier`` averages the runs sharing its value). ``resume`` keeps the runs
already written, continues an interrupted one and runs the rest. Under torchrun every process
takes part in each run; process 0 writes.

A **series** (the checkpoints of one model through training) has three more rules
(``docs/monitor.md``): each run folder is named after its revision, and every revision is checked to
exist before the first loads; every run measures the first run's token windows (a tokenizer that
makes other windows stops the series in one sentence before its model loads); and every row gets
the columns ``step`` (the checkpoint's own step, or the one the revision's name gives,
:func:`~sinkscope.resolve.revision_step`, else empty) and ``revision``. ``<out>/steps.csv`` and
``steps.parquet`` are the runs' tables as one, and the page draws every metric against the step. A
run that fails keeps the runs finished before it; ``resume`` continues from there.

The folder follows every writer's rules (``plan.check_comparison_dir``); its own files (the page,
``figures/``, a series' ``steps.*``) are recorded in its inventory (writer ``comparison``), at the
start and at the end.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

from sinkscope import distributed
from sinkscope.errors import Interrupted, SinkscopeError, option
from sinkscope.options import Command, RunOptions
from sinkscope.pipeline import Prepared, carry_out, prepare, progress_path
from sinkscope.plan import COMPARISON_WRITER, Plan
from sinkscope.plan import plan as plan_runs

#: the one table of a series: every run's rows, with their ``step`` and ``revision`` columns.
SERIES_TABLE = "steps"


def execute_several(command: Command, options: RunOptions, models: list[str], *, group_by: str | None = None,
                    labels: list[str] | None = None, log: Callable[[str], None] | None = None,
                    revisions: list[str | None] | None = None) -> Path | None:
    """Run ``command`` on each of ``models`` (or on one model at each of ``revisions``) and compare them.

    Returns:
        The comparison page (the folder with ``figures`` off), or None on processes other than 0.
    """
    return run_comparison(plan_runs(command, options, models=models, revisions=revisions, group_by=group_by,
                                    labels=labels), log=log)


def run_comparison(plans: list[Plan], *, log: Callable[[str], None] | None = None) -> Path | None:
    """Run the plans of one comparison, then draw its page (module docstring)."""
    from sinkscope.results import is_run_folder

    log = log or (lambda message: print(message, file=sys.stderr))
    comparison = plans[0].comparison
    parent = Path(comparison.folder)
    children = [Path(p.options.out) for p in plans]
    if comparison.series and any(p.source.revision is not None for p in plans):
        from sinkscope.sources import check_revisions

        check_revisions([p.source for p in plans])  # a missing revision: one sentence before anything loads
    rank, world_size = distributed.world()
    with contextlib.ExitStack() as cleanup:
        prepared: list[Prepared | None] = []
        for planned, child in zip(plans, children):
            if planned.options.resume:
                progress = progress_path(child)
                if is_run_folder(child) and not progress.is_file():
                    log(f"Keeping the finished run {child}.")
                    prepared.append(None)
                    continue
                planned = replace(planned, options=replace(planned.options, resume=progress.is_file()))
            prepared.append(prepare(planned, write=True, cleanup=cleanup))
        if world_size > 1:
            distributed.init()  # every process has checked its folders: the parent is recorded after
        if rank == 0:
            _record_comparison(parent)
        expected = _kept_tokens(children, prepared) if comparison.series else None
        for k, run in enumerate(prepared):
            if run is None:
                continue
            run.expect_tokens = expected
            done = [child.name for child in children[:k]]  # each measured now or kept
            kept = f"the runs finished before it ({', '.join(done)}) are kept in {parent}"
            try:
                result = carry_out(run, True, log, finish=False)
            except Interrupted:
                raise
            except KeyboardInterrupt:
                if not done:
                    raise
                raise Interrupted(f"interrupted; {kept}: rerun the same command with {option('resume', True)} to continue.") from None
            except SinkscopeError as error:
                if not done:
                    raise
                raise SinkscopeError(f"{error.raw.rstrip('.')}; {kept}: rerun the same command with {option('resume', True)} to "
                                     "continue.") from error
            if comparison.series and expected is None and result is not None:
                expected = result.manifest["windows"]["tokens_sha256"]
    if world_size > 1:
        distributed.finish()
    if rank != 0:
        return None
    if comparison.series:
        write_series_table(parent, children)
        _record_comparison(parent)  # the table is the comparison's own (checked free of others' files before)
    if not comparison.figures:
        _record_comparison(parent)
        return parent
    from sinkscope.report import build_report

    # the parent was checked before: its own page is replaced (the report records the parent's files)
    labels = list(comparison.labels) if comparison.labels is not None else None
    page = build_report(children, out=parent, labels=labels, group_by=comparison.group_by, overwrite=True)
    log(f"Wrote the comparison {page}")
    return page


def _kept_tokens(children: list[Path], prepared: list[Prepared | None]) -> str | None:
    """The token windows' sha256 of the first run a resumed series kept (its manifest), or None."""
    for child, run in zip(children, prepared):
        if run is None:
            from sinkscope.fileio import read_json

            try:  # a damaged manifest (not JSON, [[[[...]]]]): no kept windows to compare with
                return read_json(child / "manifest.json", "the run's manifest")["windows"]["tokens_sha256"]
            except (SinkscopeError, KeyError, TypeError):
                return None
    return None


def write_series_table(parent: Path, children: list[Path]):
    """``<parent>/steps.csv`` and ``steps.parquet``: the series' run tables as one (atomically)."""
    import pandas as pd

    from sinkscope.fileio import atomic_write_bytes, atomic_write_text
    from sinkscope.results import read_results

    frame = pd.concat([read_results(child) for child in children], ignore_index=True)
    if "step" in frame.columns:
        frame["step"] = pd.array(frame["step"], dtype="Int64")
    atomic_write_text(parent / f"{SERIES_TABLE}.csv", frame.to_csv(index=False, float_format="%.9g"))
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write_bytes(parent / f"{SERIES_TABLE}.parquet", buffer.getvalue())
    return frame


def _record_comparison(parent: Path) -> None:
    """The parent's inventory: its own files (run folders keep their own inventories)."""
    from sinkscope.fileio import write_inventory

    parent.mkdir(parents=True, exist_ok=True)
    write_inventory(parent, COMPARISON_WRITER)
