"""Where plans run (DESIGN.md "One plan, many executors"; docs/scaling.md).

``execute(plans, engine=...)`` runs what ``plan.plan`` made. With the in-process executor (the
default: ``--executor local``, one job at a time) one plan alone goes through the pipeline
(``run.stages.run_plan``: load, run, write) and several sharing a comparison one after the other into
its folder, then its page (``comparison.run_comparison``), as before engines existed; torchrun's
processes all take part in each run.

Any other engine (``--jobs N``, ``--executor ray``, ``--executor slurm``) makes each plan one
:class:`~sinkscope.executors.jobs.Job`: :func:`run_in_worker` runs it in a worker, which writes its own run
folder atomically on the shared filesystem and returns only the folder's path. Each job's output
goes to its log, ``<comparison>/engine/logs/<run>.log`` (a run alone: under
``paths.cache_root()/engine/``). A run that fails says so in one sentence with its log's path and
the others go on; ``--resume`` skips the finished runs and reruns the failed or missing ones; the
comparison page is drawn once all have ended (``comparison.finish_comparison``), from the runs that
finished, and ``sinkscope report OUT`` redraws it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from sinkscope.executors.settings import ExecutorOptions, gpus_per_run
from sinkscope.errors import Interrupted, SinkscopeError, option
from sinkscope.run.plan import Plan


def execute(plans: list[Plan], inputs=None, *, write: bool = True, log: Callable[[str], None] | None = None,
            executor_options: ExecutorOptions | None = None):
    """Run ``plans`` on ``engine`` (default: in this process): the
    :class:`~sinkscope.run.result.Result` of a plan alone run in process, else the run folder or the
    comparison's page (its folder with figures off); None on data-parallel processes other than 0."""
    executor_options = executor_options or ExecutorOptions()
    if not executor_options.in_process:
        return execute_jobs(plans, executor_options, log=log)
    if len(plans) == 1 and plans[0].comparison is None:
        from sinkscope.run.stages import run_plan

        return run_plan(plans[0], inputs, write=write, log=log)
    from sinkscope.run.comparison import run_comparison

    return run_comparison(plans, log=log)


def measure_command(command, options, inputs=None, *, write: bool = True, log: Callable[[str], None] | None = None):
    """One run of ``command`` with ``options`` in this process: ``execute(plan(...))``, the two steps every
    entry takes. ``inputs`` (``run.prepare.Inputs``) may hand over a loaded model, texts or token windows
    (the Python API); returns the ``run.result.Result`` (None on data-parallel processes other than 0)."""
    from sinkscope.run.plan import plan
    from sinkscope.run.prepare import first_inputs

    options, inputs = first_inputs(command.options(**options) if isinstance(options, dict) else options, inputs)
    if options.revision is not None and "," in str(options.revision):
        raise SinkscopeError(f"revision {options.revision!r} names several; one run measures one revision (the command "
                             f"line's {option('revision')} A,B,... measures each into one folder, as sinkscope.measure's "
                             "revisions= does).")
    plans = plan(command, options, model_object=inputs.model, write=write)
    return execute(plans, inputs, write=write, log=log)


def run_in_worker(planned: Plan) -> str:
    """A worker's job: run one plan and write its folder (``run.stages.run_plan``); returns the folder."""
    from sinkscope.run.stages import run_plan

    result = run_plan(planned, write=True, log=lambda message: print(message, file=sys.stderr, flush=True))
    return str(result.path)


def execute_jobs(plans: list[Plan], executor_options: ExecutorOptions, *, log: Callable[[str], None] | None = None) -> Path:
    """Run each plan as one job on ``engine`` (module docstring); the run folder of a plan alone, or
    the comparison's page."""
    return execute_groups([plans], executor_options, log=log)[0]


def execute_groups(groups: list[list[Plan]], executor_options: ExecutorOptions, *,
                   log: Callable[[str], None] | None = None) -> list[Path]:
    """Several commands' plans (``groups``: each a run alone or one comparison's plans, as
    ``plan.plan`` made them) as one batch of jobs on ``engine``: one Ray submission, one SLURM array
    (a recipe's consecutive measuring steps, ``recipes.run_recipes``). Then each group is finished:
    its run folder, or its comparison's page from the runs that finished. Every failure of every
    group is named in one error at the end; the groups without one are complete by then."""
    from sinkscope.forward import distributed
    from sinkscope.run.comparison import JOBS_FOLDER, _record_comparison, finish_comparison, still_to_run
    from sinkscope.executors.jobs import Job
    from sinkscope.executors.run import cluster_gpus, run_jobs
    from sinkscope.runtime.paths import cache_root

    log = log or (lambda message: print(message, file=sys.stderr))
    if distributed.world()[1] > 1:
        raise SinkscopeError(f"{option('executor')} {executor_options.executor} and {option('jobs')} run each plan in a process of "
                             "its own; start the command without torchrun (one plan on several GPUs: "
                             f"{option('device_map')} auto).")
    stamp = time.strftime('%Y%m%d-%H%M%S')
    folders = []  # each group's engine folder: its comparison's own, or one in the cache for a run alone
    for plans in groups:
        comparison = plans[0].comparison
        if comparison is not None:
            folders.append(Path(comparison.folder) / JOBS_FOLDER)
            _record_comparison(Path(comparison.folder), plans)  # the folder is the comparison's from now on
        else:
            folders.append(cache_root() / JOBS_FOLDER / f"{stamp}-{Path(plans[0].options.out).name}")
    gpus_here = cluster_gpus(executor_options)
    override = {"ray": executor_options.ray_gpus_per_run, "slurm": executor_options.slurm_gpus_per_run}.get(executor_options.executor)
    jobs, owner = [], []
    for k, (plans, folder) in enumerate(zip(groups, folders)):
        for planned in plans:
            planned = still_to_run(planned, log)
            if planned is None:
                continue
            run = Path(planned.options.out).name
            name = run if len(groups) == 1 else f"{Path(planned.options.out).parent.name}/{run}"
            gpus = gpus_per_run(planned.options.device, planned.options.device_map, override, gpus_here)
            jobs.append(Job(name, str(folder / "logs" / f"{run}.log"), run_in_worker, (planned,), gpus=gpus))
            owner.append((k, run))
    # one engine folder for the batch (submitit's files): the group's own, or the cache's for several
    batch_folder = folders[0] if len(groups) == 1 else cache_root() / JOBS_FOLDER / f"{stamp}-batch"
    try:
        outcomes = run_jobs(jobs, executor_options, batch_folder, log=log, show_progress=groups[0][0].options.progress) if jobs else []
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, on every engine alike (SLURM's says what keeps running)
        raise Interrupted(f"interrupted; the runs that finished are kept in their folders: rerun the same command "
                          f"with {option('resume', True)} to run the others.") from None
    failed: list[dict[str, str]] = [{} for _ in groups]
    for (k, run), outcome in zip(owner, outcomes):
        if not outcome.ok:
            failed[k][run] = f"{outcome.sentence.rstrip('.')} (log: {outcome.log})"
    written, errors = [], []
    for plans, fails in zip(groups, failed):
        try:
            if plans[0].comparison is None:
                if fails:
                    raise SinkscopeError(f"{Path(plans[0].options.out).name} failed: {next(iter(fails.values()))}.")
                written.append(Path(plans[0].options.out))
            else:
                written.append(finish_comparison(plans, fails, log))
        except SinkscopeError as error:
            if len(groups) == 1:
                raise
            errors.append(error.raw.rstrip("."))
    if errors:
        raise SinkscopeError("; ".join(errors) + ".")
    return written


def written_path(outcome) -> Path | None:
    """What the command line prints: a run's folder, or a comparison's page."""
    return getattr(outcome, "path", outcome)
