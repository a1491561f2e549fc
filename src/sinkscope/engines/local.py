"""``--executor local``: the jobs one after the other in this process, or in ``--jobs N`` spawned
processes (a fresh interpreter each, so nothing from this process's state leaks into a run)."""

from __future__ import annotations

import os
from typing import Callable

from sinkscope.engines.jobs import Job, Outcome, Progress, lost, run_job
from sinkscope.engines.options import EngineOptions


def run_local(jobs: list[Job], engine: EngineOptions, progress: Progress, log: Callable[[str], None]) -> list[Outcome]:
    """Each job's outcome, in the order of ``jobs``; ``engine.jobs`` processes at once, each with
    ``cpu_count // jobs`` torch threads unless a job sets its own."""
    if engine.jobs == 1:
        outcomes = []
        for job in jobs:
            outcomes.append(run_job(job))
            progress.finish(outcomes[-1], log)
        return outcomes
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, wait, FIRST_COMPLETED
    from dataclasses import replace

    threads = max(1, (os.cpu_count() or 1) // engine.jobs)
    outcomes: dict[str, Outcome] = {}
    with ProcessPoolExecutor(max_workers=engine.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run_job, replace(job, threads=job.threads or threads)): job for job in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=2.0, return_when=FIRST_COMPLETED)
            for future in done:
                job = futures[future]
                try:
                    outcome = future.result()
                except Exception as error:  # noqa: BLE001 - the process died (killed, out of memory)
                    outcome = lost(job, f"its process ended without a result ({type(error).__name__}: {error})")
                outcomes[job.name] = outcome
                progress.finish(outcome, log)
            progress.refresh()
    return [outcomes[job.name] for job in jobs]
