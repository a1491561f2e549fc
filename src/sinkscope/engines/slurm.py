"""``--executor slurm``: the jobs as one SLURM job array through submitit (docs/scaling.md).

Each array task runs one job (:func:`~sinkscope.engines.jobs.run_job`) with ``slurm_gpus_per_run``
GPUs (default: what the plans need, ``engines.options.gpus_per_run``, on a cluster assumed to have
them) and one task per node, at most ``slurm_array_parallelism`` at once, for ``slurm_time``
minutes. submitit's own files (the sbatch script, pickles, stdout/stderr) go under
``FOLDER/slurm/``; the job's log is its own. ``slurm_cluster`` local runs the array as local
processes and debug in this process (submitit's executors): how the tests run it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from sinkscope.engines.jobs import Job, Outcome, Progress, lost, run_job
from sinkscope.engines.options import EngineOptions
from sinkscope.errors import Interrupted, option


def slurm_parameters(engine: EngineOptions, gpus: int) -> dict:
    """submitit's ``update_parameters`` for one array: one task per run, ``gpus`` GPUs each."""
    params = {"timeout_min": engine.slurm_time, "nodes": 1, "tasks_per_node": 1, "cpus_per_task": max(1, 4 * gpus),
              "gpus_per_node": gpus, "name": "sinkscope", "slurm_array_parallelism": engine.slurm_array_parallelism}
    if engine.slurm_partition:
        params["slurm_partition"] = engine.slurm_partition
    for item in engine.slurm_extra:  # key=value, a whole number as a number
        key, _, value = str(item).partition("=")
        params[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return params


def executor_for(engine: EngineOptions, folder: Path, gpus: int):
    """A submitit executor for the array (its files under ``folder``)."""
    import submitit

    cluster = None if engine.slurm_cluster == "slurm" else engine.slurm_cluster
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster or "slurm")
    params = slurm_parameters(engine, gpus)
    if cluster is not None:  # submitit's local executors take the shared parameters only
        params = {k: v for k, v in params.items() if not k.startswith("slurm_") and k != "name"}
        params["gpus_per_node"] = 0 if cluster == "local" and not gpus else gpus
    executor.update_parameters(**params)
    return executor


def run_slurm(jobs: list[Job], engine: EngineOptions, folder: Path, progress: Progress,
              log: Callable[[str], None]) -> list[Outcome]:
    """Each job's outcome, in the order of ``jobs`` (submitted as one array, waited for)."""
    gpus = int(max((job.gpus for job in jobs), default=0))
    executor = executor_for(engine, folder, gpus)
    submitted = executor.map_array(run_job, jobs)
    log(f"Submitted {len(submitted)} runs as a job array through submitit ({engine.slurm_cluster}); its files are in "
        f"{folder}.")
    try:
        return _wait(jobs, submitted, progress, log)
    except KeyboardInterrupt:
        ids = sorted({str(handle.job_id).split("_")[0] for handle in submitted})
        raise Interrupted(f"interrupted; the SLURM array {', '.join(ids)} keeps running on the cluster (scancel "
                          f"{' '.join(ids)} stops it); its runs write their own folders, and the same command with "
                          f"{option('resume', True)} later keeps the finished ones.") from None


def _wait(jobs: list[Job], submitted: list, progress: Progress, log: Callable[[str], None]) -> list[Outcome]:
    """Poll the array until every task has ended; the outcomes in the order of ``jobs``."""
    outcomes: dict[str, Outcome] = {}
    while len(outcomes) < len(jobs):
        for job, handle in zip(jobs, submitted):
            if job.name in outcomes or not handle.done():
                continue
            try:
                outcome = handle.result()
            except Exception as error:  # noqa: BLE001 - the task failed outside run_job (time limit, preemption, OOM kill)
                outcome = lost(job, f"its SLURM task {handle.job_id} ended without a result ({type(error).__name__}; "
                                    f"submitit's log: {handle.paths.stderr})")
            outcomes[job.name] = outcome
            progress.finish(outcome, log)
        progress.refresh()
        if len(outcomes) < len(jobs):
            time.sleep(1.0)
    return [outcomes[job.name] for job in jobs]
