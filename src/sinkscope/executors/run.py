"""``run_jobs``: the jobs on the chosen engine, with one progress bar over them."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from sinkscope.executors.jobs import Job, Outcome, Progress
from sinkscope.executors.options import EngineOptions


def run_jobs(jobs: list[Job], engine: EngineOptions, folder: Path, *, log: Callable[[str], None],
             show_progress: bool = True, on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run ``jobs`` on ``engine`` (its files, such as submitit's, under ``folder``); their outcomes in
    order. A failed job is logged as it ends (``NAME failed: SENTENCE (log: PATH)``) and the others go on;
    ``on_outcome`` is told each outcome as its job ends."""
    if len({job.name for job in jobs}) != len(jobs):
        raise ValueError("every job needs a name of its own")  # the engines match outcomes to jobs by name
    progress = Progress(jobs, engine.executor, show_progress, on_outcome)
    try:
        if engine.executor == "ray":
            from sinkscope.executors.ray_tasks import run_ray

            return run_ray(jobs, engine, progress, log)
        if engine.executor == "slurm":
            from sinkscope.executors.slurm import run_slurm

            return run_slurm(jobs, engine, Path(folder) / "slurm", progress, log)
        from sinkscope.executors.local import run_local

        return run_local(jobs, engine, progress, log)
    finally:
        progress.close()


def cluster_gpus(engine: EngineOptions) -> float:
    """The GPUs a plan on ``device="auto"`` may count on: Ray's cluster's; none locally or on SLURM
    (a SLURM run asks for GPUs with ``--slurm-gpus-per-run``, or a cuda ``--device``)."""
    if engine.executor == "ray":
        from sinkscope.executors.ray_tasks import cluster_gpus as ray_gpus

        return ray_gpus(engine)
    return 0.0
