"""``--executor ray``: one Ray task per job (docs/scaling.md).

``ray_address`` "auto" or ``HOST:PORT`` joins a running cluster; none starts a local one for this
command (shut down after it). A Ray session this process already holds (``ray.init`` in a notebook
or a test) is used as it is and left running. Each task asks for one CPU and the job's GPUs
(``--ray-gpus-per-run``, else what its plan's device needs: ``engines.options.gpus_per_run``). Tasks
are never retried: a failed run is rerun with ``--resume``. Only the small :class:`Outcome` travels
through Ray's object store; the runs are written to the shared filesystem.
"""

from __future__ import annotations

from typing import Callable

from sinkscope.engines.jobs import Job, Outcome, Progress, lost, run_job
from sinkscope.engines.options import EngineOptions


def cluster_gpus(engine: EngineOptions) -> float:
    """The GPUs of the cluster the jobs will run on (starts or joins it)."""
    import ray

    _connect(engine)
    return float(ray.cluster_resources().get("GPU", 0))


def _connect(engine: EngineOptions) -> bool:
    """Join or start the cluster unless this process holds one; whether this call started the session."""
    import ray

    if ray.is_initialized():
        return False
    ray.init(address=engine.ray_address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    return True


def run_ray(jobs: list[Job], engine: EngineOptions, progress: Progress, log: Callable[[str], None]) -> list[Outcome]:
    """Each job's outcome, in the order of ``jobs``."""
    import ray

    started = _connect(engine)
    try:
        task = ray.remote(max_retries=0)(run_job)
        refs = {task.options(num_cpus=1, num_gpus=job.gpus, name=f"sinkscope:{job.name}").remote(job): job
                for job in jobs}
        outcomes: dict[str, Outcome] = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=2.0)
            for ref in done:
                job = refs[ref]
                try:
                    outcome = ray.get(ref)
                except Exception as error:  # noqa: BLE001 - the worker died (killed, out of memory, node lost)
                    outcome = lost(job, f"its Ray task ended without a result ({type(error).__name__})")
                outcomes[job.name] = outcome
                progress.finish(outcome, log)
            progress.refresh()
        return [outcomes[job.name] for job in jobs]
    finally:
        if started:
            ray.shutdown()
