"""``run_jobs``: the jobs on the chosen engine, with one progress bar over them."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from sinkscope.executors.jobs import Job, Outcome, Progress
from sinkscope.executors.settings import ExecutorOptions


def run_jobs(jobs: list[Job], executor_options: ExecutorOptions, folder: Path, *, log: Callable[[str], None],
             show_progress: bool = True, on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run ``jobs`` on ``engine`` (its files, such as submitit's, under ``folder``); their outcomes in
    order. A failed job is logged as it ends (``NAME failed: SENTENCE (log: PATH)``) and the others go on;
    ``on_outcome`` is told each outcome as its job ends."""
    if len({job.name for job in jobs}) != len(jobs):
        raise ValueError("every job needs a name of its own")  # the engines match outcomes to jobs by name
    progress = Progress(jobs, executor_options.executor, show_progress, on_outcome)
    try:
        if executor_options.executor == "ray":
            from sinkscope.executors.ray_tasks import run_ray

            return run_ray(jobs, executor_options, progress, log)
        if executor_options.executor == "slurm":
            from sinkscope.executors.slurm import run_slurm

            return run_slurm(jobs, executor_options, Path(folder) / "slurm", progress, log)
        from sinkscope.executors.local import run_local

        return run_local(jobs, executor_options, progress, log)
    finally:
        progress.close()


def cluster_gpus(executor_options: ExecutorOptions) -> float:
    """The GPUs a plan on ``device="auto"`` may count on: Ray's cluster's; none locally or on SLURM
    (a SLURM run asks for GPUs with ``--slurm-gpus-per-run``, or a cuda ``--device``)."""
    if executor_options.executor == "ray":
        from sinkscope.executors.ray_tasks import cluster_gpus as ray_gpus

        return ray_gpus(executor_options)
    return 0.0
