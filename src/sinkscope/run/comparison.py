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
:func:`~sinkscope.models.resolve.revision_step`, else empty) and ``revision``. ``<out>/steps.csv`` and
``steps.parquet`` are the runs' tables as one, and the page draws every metric against the step. A
run that fails keeps the runs finished before it; ``resume`` continues from there.

Every comparison of two runs or more also writes ``<out>/compare.csv``: each later run's rows minus
the first run's, with the standard error of each difference, paired where the runs share their
windows (``report/compare.py``; SPEC.md "Comparisons of runs").

The folder follows every writer's rules (``plan.check_comparison_dir``); its own files (the page,
``figures/``, ``compare.csv``, a series' ``steps.*``) are recorded in its inventory (writer ``comparison``), at the
start and at the end.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

from sinkscope.forward import distributed
from sinkscope.errors import Interrupted, SinkscopeError, option
from sinkscope.commands.spec import Command, RunOptions
from sinkscope.run.prepare import Prepared, prepare, progress_path
from sinkscope.run.stages import carry_out
from sinkscope.run.plan import COMPARISON_WRITER, Plan
from sinkscope.run.plan import plan as plan_runs

#: the comparison's subfolder of the engines' files: each run's log (``logs/NAME.log``), submitit's
#: files (``slurm/``); ``--executor local --jobs 1`` writes none.
JOBS_FOLDER = "engine"
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


def still_to_run(planned: Plan, log: Callable[[str], None]) -> Plan | None:
    """``--resume``: None for a run already finished (kept), else the plan continuing its progress
    file if it left one; without ``--resume``, the plan as it is."""
    from sinkscope.store.results import is_run_folder

    if not planned.options.resume:
        return planned
    child = Path(planned.options.out)
    progress = progress_path(child)
    if is_run_folder(child) and not progress.is_file():
        log(f"Keeping the finished run {child}.")
        return None
    return replace(planned, options=replace(planned.options, resume=progress.is_file()))


def run_comparison(plans: list[Plan], *, log: Callable[[str], None] | None = None) -> Path | None:
    """Run the plans of one comparison, then draw its page (module docstring)."""
    log = log or (lambda message: print(message, file=sys.stderr))
    comparison = plans[0].comparison
    parent = Path(comparison.folder)
    children = [Path(p.options.out) for p in plans]
    if comparison.series and any(p.source.revision is not None for p in plans):
        from sinkscope.run.loaders import check_revisions

        check_revisions([p.source for p in plans])  # a missing revision: one sentence before anything loads
    rank, world_size = distributed.world()
    with contextlib.ExitStack() as cleanup:
        prepared: list[Prepared | None] = []
        for planned in plans:
            planned = still_to_run(planned, log)
            prepared.append(None if planned is None else prepare(planned, write=True, cleanup=cleanup))
        if world_size > 1:
            distributed.init()  # every process has checked its folders: the parent is recorded after
        if rank == 0:
            _record_comparison(parent, plans)
        expected = _kept_tokens(children, prepared) if comparison.series else None
        failed: dict[str, str] = {}
        for k, run in enumerate(prepared):
            if run is None:
                continue
            run.expect_tokens = expected
            done = [child.name for child in children[:k] if child.name not in failed]  # each measured now or kept
            try:
                result = carry_out(run, True, log, finish=False)
            except Interrupted:
                raise
            except KeyboardInterrupt:
                if not done:
                    raise
                raise Interrupted(f"interrupted; the runs finished before it ({', '.join(done)}) are kept in {parent}: "
                                  f"rerun the same command with {option('resume', True)} to continue.") from None
            except SinkscopeError as error:  # this run fails alone: the others go on
                if world_size > 1:
                    raise  # every process must leave the group together
                failed[children[k].name] = str(error)
                log(f"{children[k].name} failed: {str(error).rstrip('.')}")
                continue
            if comparison.series and expected is None and result is not None:
                expected = result.manifest["windows"]["tokens_sha256"]
    if world_size > 1:
        distributed.finish()
    if rank != 0:
        return None
    return finish_comparison(plans, failed, log)


def finish_comparison(plans: list[Plan], failed: dict[str, str], log: Callable[[str], None]) -> Path:
    """After every plan of a comparison ended: a series' table and the page, from the runs that
    finished; then, if any run failed, one error naming each (``failed``: run folder name -> its
    failure, with its log) and how ``--resume`` runs only them.

    Runs that ran apart (``--executor``) are checked here to have measured the same windows when
    they are a series (the in-process executor checks each before its model loads).
    """
    from sinkscope.store.files import describe_entries

    comparison = plans[0].comparison
    parent = Path(comparison.folder)
    children = [Path(p.options.out) for p in plans]
    finished = [child for child in children if child.name not in failed]
    if comparison.series and len(finished) > 1:
        _check_same_windows(finished)
        _say_duplicates(finished, strict=any(getattr(p.options, "strict_revisions", False) for p in plans), log=log)
    if finished and comparison.series:
        write_series_table(parent, finished)
    labels = ([label for label, child in zip(comparison.labels, children) if child.name not in failed]
              if comparison.labels is not None else None)
    write_comparison_differences(parent, finished, labels, comparison.group_by)
    _record_comparison(parent)  # the tables are the comparison's own (checked free of others' files before)
    page = parent
    if finished and comparison.figures:
        from sinkscope.report import build_report

        # the parent was checked before: its own page is replaced (the report records the parent's files)
        page = build_report(finished, out=parent, labels=labels, group_by=comparison.group_by, overwrite=True)
        log(f"Wrote the comparison {page}" + (f" of the {len(finished)} runs that finished" if failed else ""))
    if not failed:
        return page
    why = "; ".join(f"{name}: {reason.rstrip('.')}" for name, reason in failed.items())
    if not finished and _forget_comparison(parent):
        raise SinkscopeError(f"every run failed, so nothing was kept ({parent} is removed again): {why}; fix the cause "
                             "and rerun the same command.")
    which = "every run" if not finished else f"{len(failed)} of {len(children)} runs"
    kept = (f", and the runs that finished ({describe_entries([c.name for c in finished])}) are kept in {parent}"
            if finished else "")
    raise SinkscopeError(f"{which} failed ({why}){kept}: fix the cause and rerun the same command with "
                         f"{option('resume', True)} to run only the failed ones.")
    return page


def write_comparison_differences(parent: Path, finished: list[Path], labels: list[str] | None,
                                 group_by: str | None) -> None:
    """``<parent>/compare.csv``: every later run's rows minus the first's, with their standard errors
    (``report.compare``, SPEC.md "Comparisons of runs"); with fewer than two runs finished, none (an
    earlier one removed)."""
    from sinkscope.report.compare import COMPARE_FILE, compare_folders, write_differences

    if len(finished) < 2:
        (parent / COMPARE_FILE).unlink(missing_ok=True)
        return
    write_differences(parent, compare_folders(finished, labels, group_by))


def duplicated_weights(children: list[Path]) -> dict[str, str]:
    """{run folder name: the earlier run folder name it duplicates} for the runs of a series whose manifests record
    the same weights (``model.weights_sample_sha256``, ``models/fingerprint.py``); runs without one are never
    duplicates."""
    from sinkscope.store.files import read_json
    from sinkscope.store.results import earlier_duplicates

    digests: list[str | None] = []
    for child in children:
        try:
            digests.append(read_json(child / "manifest.json", "the run's manifest")["model"]["weights_sample_sha256"])
        except (SinkscopeError, KeyError, TypeError):
            digests.append(None)
    return {children[k].name: children[j].name for k, j in earlier_duplicates(digests).items()}


def _say_duplicates(children: list[Path], *, strict: bool, log: Callable[[str], None]) -> None:
    """One warning per run of a series that loaded an earlier run's weights; with ``--strict-revisions``, an error."""
    duplicates = duplicated_weights(children)
    if not duplicates:
        return
    said = "; ".join(f"{name} has the same weights as {earlier}" for name, earlier in duplicates.items())
    if strict:
        raise SinkscopeError(f"{said} (a sample hash of every tensor agrees), so the series does not show the "
                             f"model changing there; its runs are kept; rerun without {option('strict_revisions', True)} "
                             "to compare the others, or drop the duplicates from --revision.")
    log(f"warning: {said} (a sample hash of every tensor agrees: a hub branch serving another checkpoint's weights?); "
        "the comparison marks them and leaves them out of the emergence estimate.")


def _check_same_windows(children: list[Path]) -> None:
    """A series' runs measured one set of windows (their manifests' token sha256), or one sentence."""
    from sinkscope.store.files import read_json

    hashes = {}
    for child in children:
        try:
            hashes[child.name] = read_json(child / "manifest.json", "the run's manifest")["windows"]["tokens_sha256"]
        except (KeyError, TypeError):
            hashes[child.name] = None
    first = children[0].name
    other = [name for name, digest in hashes.items() if digest != hashes[first]]
    if other:
        raise SinkscopeError(f"the checkpoints of a series must be measured on the same token windows, but "
                             f"{', '.join(other)} measured other windows than {first} (another tokenizer?); "
                             "measure them apart, or give them one tokenizer.")


def _kept_tokens(children: list[Path], prepared: list[Prepared | None]) -> str | None:
    """The token windows' sha256 of the first run a resumed series kept (its manifest), or None."""
    for child, run in zip(children, prepared):
        if run is None:
            from sinkscope.store.files import read_json

            try:  # a damaged manifest (not JSON, [[[[...]]]]): no kept windows to compare with
                return read_json(child / "manifest.json", "the run's manifest")["windows"]["tokens_sha256"]
            except (SinkscopeError, KeyError, TypeError):
                return None
    return None


def write_series_table(parent: Path, children: list[Path]):
    """``<parent>/steps.csv`` and ``steps.parquet``: the series' run tables as one (atomically)."""
    import pandas as pd

    from sinkscope.store.files import atomic_write_bytes, atomic_write_text
    from sinkscope.store.results import read_results

    frame = pd.concat([read_results(child) for child in children], ignore_index=True)
    if "step" in frame.columns:
        frame["step"] = pd.array(frame["step"], dtype="Int64")
    atomic_write_text(parent / f"{SERIES_TABLE}.csv", frame.to_csv(index=False, float_format="%.9g"))
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    atomic_write_bytes(parent / f"{SERIES_TABLE}.parquet", buffer.getvalue())
    return frame


def _forget_comparison(parent: Path) -> bool:
    """Every run failed and none was kept: remove what the comparison wrote into ``parent`` (its record and
    inventory, and ``parent`` itself once empty), so the same command can be run again as it was. Only
    when ``parent`` holds nothing else (a run folder, a job log, anyone's file): then it is kept whole
    and False returned."""
    from sinkscope.store.comparison_record import RECORD
    from sinkscope.store.files import INVENTORY

    ours = {RECORD, INVENTORY}
    entries = list(parent.iterdir()) if parent.is_dir() else []
    if any(entry.name not in ours or not entry.is_file() or entry.is_symlink() for entry in entries):
        return False
    for entry in entries:
        entry.unlink()
    with contextlib.suppress(OSError):
        parent.rmdir()
    return True


def _record_comparison(parent: Path, plans: list[Plan] | None = None) -> None:
    """The parent's inventory: its own files (run folders keep their own inventories); with ``plans``,
    first its ``comparison.json`` (``comparison_record``: the runs in order, for ``sinkscope report``)."""
    from sinkscope.store.comparison_record import write_comparison_record
    from sinkscope.store.files import write_inventory

    parent.mkdir(parents=True, exist_ok=True)
    if plans is not None:
        comparison = plans[0].comparison
        write_comparison_record(parent, [Path(p.options.out).name for p in plans],
                                None if comparison.labels is None else list(comparison.labels),
                                comparison.group_by, comparison.series)
    write_inventory(parent, COMPARISON_WRITER, trees=(JOBS_FOLDER,))
