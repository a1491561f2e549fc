"""``--executor local``: the jobs one after the other in this process, or in ``--jobs N`` spawned
processes (a fresh interpreter each, so nothing from this process's state leaks into a run).

Each job gets a process of its own (``multiprocessing``'s spawn context), at most ``jobs`` at once,
and hands its :class:`~sinkscope.executors.jobs.Outcome` back through a pipe of its own. A process
that ends without one (killed: SIGKILL, the kernel's out-of-memory killer) costs only its own job,
which is :func:`~sinkscope.executors.jobs.lost` with one sentence naming how the process ended; the
others go on. (A process pool would not do: one dead worker breaks the whole pool, and every
job still in it fails.)
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from sinkscope.executors.jobs import Job, Outcome, Progress, lost, run_job
from sinkscope.executors.settings import ExecutorOptions

#: seconds the processes still running get to end after the command is interrupted, before SIGKILL
STOP_SECONDS = 10.0


def run_local(jobs: list[Job], executor_options: ExecutorOptions, progress: Progress, log: Callable[[str], None]) -> list[Outcome]:
    """Each job's outcome, in the order of ``jobs``; ``engine.jobs`` processes at once, each with
    ``cpu_count // jobs`` torch threads unless a job sets its own."""
    if executor_options.jobs == 1:
        outcomes = []
        for job in jobs:
            outcomes.append(run_job(job))
            progress.finish(outcomes[-1], log)
        return outcomes
    threads = max(1, (os.cpu_count() or 1) // executor_options.jobs)
    jobs_here = [replace(job, threads=job.threads or threads) for job in jobs]
    outcomes = run_processes(jobs_here, executor_options.jobs, lambda outcome: progress.finish(outcome, log), progress.refresh)
    return [outcomes[job.name] for job in jobs]


def _child(job: Job, connection) -> None:
    """A job's process: SIGTERM ends it as Ctrl-C does (a run keeps its progress), then the outcome
    goes back through ``connection``."""
    signal.signal(signal.SIGTERM, _stop)
    try:
        outcome = run_job(job)
    except KeyboardInterrupt:
        outcome = lost(job, "its process was stopped")
    connection.send(outcome)
    connection.close()


def _stop(_signum, _frame):
    raise KeyboardInterrupt


@dataclass
class _Running:
    """One job's process and the reading end of its pipe."""

    job: Job
    process: Any
    connection: Any


def run_processes(jobs: list[Job], at_once: int, finished: Callable[[Outcome], None],
                  refresh: Callable[[], None] = lambda: None) -> dict[str, Outcome]:
    """Run every job in a spawned process of its own, ``at_once`` at a time (in the order of ``jobs``);
    ``finished`` is told each outcome as it arrives; the outcomes by job name. Interrupted (Ctrl-C,
    SIGTERM), the processes still running are stopped (SIGTERM, then SIGKILL after
    :data:`STOP_SECONDS`) before the interruption goes on."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = multiprocessing.get_context("spawn")
    waiting, running, outcomes = list(jobs), [], {}
    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                running.append(_start(context, waiting.pop(0)))
            ready = set(wait([r.connection for r in running] + [r.process.sentinel for r in running], timeout=2.0))
            for item in [r for r in running if r.connection in ready or r.process.sentinel in ready]:
                outcome = _collect(item)
                if outcome is None:
                    continue  # the process is still running (its pipe was ready before its end)
                running.remove(item)
                outcomes[item.job.name] = outcome
                finished(outcome)
            refresh()
    except BaseException:
        _stop_all(running)
        raise
    return outcomes


def _start(context, job: Job) -> _Running:
    """Spawn ``job``'s process with a pipe of its own."""
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(job, send), name=f"sinkscope job {job.name}")
    process.start()
    send.close()  # the child holds its end: the pipe reports the end of the child
    return _Running(job, process, receive)


def _collect(item: _Running) -> Outcome | None:
    """The outcome of a process whose pipe or end is ready: what it sent, else :func:`lost` once it has
    ended; None while it is still running without having sent anything."""
    outcome, closed = None, False
    try:
        if item.connection.poll():
            outcome = item.connection.recv()
    except (EOFError, OSError):
        closed = True  # its end of the pipe closed without an outcome: the process is ending
    except Exception as error:  # noqa: BLE001 - half an outcome: the process died while sending it
        outcome = lost(item.job, f"its process sent back an outcome that could not be read ({type(error).__name__})")
    if outcome is None and not closed and item.process.is_alive():
        return None
    item.process.join(timeout=30.0)
    if item.process.is_alive():  # it sent its outcome (or closed its pipe) but does not end
        item.process.kill()
        item.process.join(timeout=5.0)
    item.connection.close()
    if outcome is not None:
        return outcome
    return lost(item.job, f"its process ended without a result ({_how_it_ended(item.process.exitcode)})")


def _how_it_ended(code: int | None) -> str:
    """``killed by SIGKILL (the system's out-of-memory killer sends it too)``, ``exit code 3``, ..."""
    if code is None:
        return "it did not end"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        note = "; the system's out-of-memory killer sends it too" if name == "SIGKILL" else ""
        return f"killed by {name}{note}"
    return f"exit code {code}"


def _stop_all(running: list[_Running]) -> None:
    """Stop the processes still running: SIGTERM (each run keeps its progress, as after Ctrl-C), then
    SIGKILL for any still there after :data:`STOP_SECONDS`."""
    for item in running:
        if item.process.is_alive():
            item.process.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for item in running:
        item.process.join(timeout=max(0.0, deadline - time.monotonic()))
        if item.process.is_alive():
            item.process.kill()
            item.process.join(timeout=5.0)
        item.connection.close()
