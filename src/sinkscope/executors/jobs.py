"""Jobs, their outcomes, the worker's side of every engine, and the progress line over jobs.

:func:`run_job` is what a worker runs, whatever the engine: it appends the job's output (stdout and
stderr, C libraries' included) to the job's log, calls the job, and returns an :class:`Outcome`.
A failure is the outcome's sentence (a :class:`~sinkscope.errors.SinkscopeError`'s own; another
exception's type and message, its traceback in the log), never an exception through the engine,
so one job that fails never stops the others.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from sinkscope.errors import SinkscopeError


@dataclass(frozen=True)
class Job:
    """One call an engine runs: ``function(*args)`` (both picklable: a module-level function).

    Attributes:
        name: the job's name in progress and messages (a run folder's name, ``baseline seed 0``).
        log: the log file its output is appended to (on the shared filesystem for SLURM).
        function, args: the call.
        gpus: GPUs it asks of Ray or SLURM (0: CPU).
        threads: torch threads in a local pool's process (None: torch's default).
    """

    name: str
    log: str
    function: Callable
    args: tuple = ()
    gpus: float = 0.0
    threads: int | None = None


@dataclass(frozen=True)
class Outcome:
    """How a job ended: ``ok`` with the function's ``value``, or not, with one ``sentence``."""

    name: str
    log: str
    ok: bool
    sentence: str | None = None
    value: Any = None
    seconds: float = 0.0

    def failure(self) -> str:
        """``NAME failed: SENTENCE (log: PATH)``."""
        return f"{self.name} failed: {str(self.sentence).rstrip('.')} (log: {self.log})"


@contextlib.contextmanager
def _output_to(path: Path) -> Iterator[None]:
    """Send this process's output to ``path``, appended: ``sys.stdout`` and ``sys.stderr`` (Python's,
    tqdm's) and file descriptors 1 and 2 (C libraries'); restored after (a Ray worker runs the next
    task in the same process)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", encoding="utf-8", buffering=1) as stream:
        os.dup2(stream.fileno(), 1)
        os.dup2(stream.fileno(), 2)
        try:
            with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
                yield
        finally:
            stream.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_job(job: Job) -> Outcome:
    """Run ``job`` in this process with its output in its log (module docstring)."""
    started = time.monotonic()
    with _output_to(Path(job.log)):
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        print(f"sinkscope job {job.name}: started {stamp} on {socket.gethostname()} (pid {os.getpid()})", flush=True)
        try:
            if job.threads is not None:
                import torch

                torch.set_num_threads(job.threads)
            value = job.function(*job.args)
        except SinkscopeError as error:
            traceback.print_exc()
            return Outcome(job.name, job.log, False, str(error), seconds=time.monotonic() - started)
        except Exception as error:  # noqa: BLE001 - a bug or an engine's error: its traceback is in the log
            traceback.print_exc()
            return Outcome(job.name, job.log, False, f"{type(error).__name__}: {error}",
                           seconds=time.monotonic() - started)
        seconds = time.monotonic() - started
        print(f"sinkscope job {job.name}: finished in {seconds:.1f} s", flush=True)
        return Outcome(job.name, job.log, True, None, value, seconds)


def lost(job: Job, why: str) -> Outcome:
    """The outcome of a job whose worker never returned one (killed, timed out, out of memory)."""
    return Outcome(job.name, job.log, False, why)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


class Progress:
    """One bar over the jobs: done, running and failed (a job runs once its log grows: the first line
    :func:`run_job` writes; a log kept from an earlier attempt counts from its size now). ``on_outcome``
    is told each outcome as its job ends (the toy task prints a group's numbers as it finishes)."""

    def __init__(self, jobs: list[Job], executor: str, show: bool = True,
                 on_outcome: Callable[[Outcome], None] | None = None):
        from sinkscope.runtime.progress import progress_bar

        self.jobs, self.finished, self.failed, self.on_outcome = jobs, set(), 0, on_outcome
        self.sizes = {job.name: _size(job.log) for job in jobs}
        self.bar = progress_bar(total=len(jobs), desc=f"runs ({executor})", unit="run", disable=not show,
                                file=sys.stderr, dynamic_ncols=True)
        self.refresh()

    def running(self) -> int:
        return sum(1 for job in self.jobs if job.name not in self.finished and _size(job.log) > self.sizes[job.name])

    def refresh(self) -> None:
        self.bar.set_postfix_str(f"done {len(self.finished) - self.failed} · running {self.running()} · "
                                 f"failed {self.failed}", refresh=True)

    def finish(self, outcome: Outcome, log: Callable[[str], None]) -> None:
        self.finished.add(outcome.name)
        if not outcome.ok:
            self.failed += 1
            log(outcome.failure())
        self.bar.update(1)
        self.refresh()
        if self.on_outcome is not None:
            self.on_outcome(outcome)

    def close(self) -> None:
        self.bar.close()
