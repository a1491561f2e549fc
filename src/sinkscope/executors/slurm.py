"""``--executor slurm``: the jobs as one SLURM job array through submitit (docs/scaling.md).

Each array task runs one job (:func:`~sinkscope.executors.jobs.run_job`) with ``slurm_gpus_per_run``
GPUs (default: what the plans need, ``executors.settings.gpus_per_run``, on a cluster assumed to have
them) and one task per node, at most ``slurm_array_parallelism`` at once, for ``slurm_time``
minutes. ``slurm_cluster`` local runs the array as local processes and debug in this process
(submitit's executors): how the tests run it.

Nothing found on disk is unpickled. Each submission gets a folder of its own, created exclusively
under ``FOLDER/slurm/`` (``<time>-<random hex>/``: submitit's sbatch script, its pickles, SLURM's
stdout and stderr), so no file from an earlier submission or planted beforehand shares its names.
The task hands its :class:`~sinkscope.executors.jobs.Outcome` back as JSON (:func:`slurm_task`), in a
file whose name and content carry a random nonce this process drew for the submission; this
process waits for submitit's ``done()`` and reads that JSON, and never calls ``result()`` (which
unpickles ``<id>_0_result.pkl`` from the folder). A task that ends without a valid outcome is lost
in one sentence naming submitit's stderr log.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Callable

from sinkscope.executors.jobs import Job, Outcome, Progress, lost, run_job
from sinkscope.executors.settings import ExecutorOptions, check_text, slurm_value
from sinkscope.errors import Interrupted, SinkscopeError, option

#: the largest outcome file read back (a sweep's line, a toy group's rows: a few kB)
MAX_OUTCOME_BYTES = 16 << 20
#: how long a task submitit calls done may still lack its outcome file on a real cluster (a shared
#: filesystem can show a new file to another node late); submitit's local executors: none
OUTCOME_GRACE_SECONDS = {"slurm": 30.0}


def slurm_parameters(executor_options: ExecutorOptions, gpus: int) -> dict:
    """submitit's ``update_parameters`` for one array: one task per run, ``gpus`` GPUs each."""
    params = {"timeout_min": executor_options.slurm_time, "nodes": 1, "tasks_per_node": 1, "cpus_per_task": max(1, 4 * gpus),
              "gpus_per_node": gpus, "name": "sinkscope", "slurm_array_parallelism": executor_options.slurm_array_parallelism}
    if executor_options.slurm_partition:
        params["slurm_partition"] = executor_options.slurm_partition
    for item in executor_options.slurm_extra:  # key=value, a whole number as a number
        key, _, value = str(item).partition("=")
        params[key.strip()] = slurm_value(value)
    return params


def executor_for(executor_options: ExecutorOptions, folder: Path, gpus: int):
    """A submitit executor for the array (its files under ``folder``); a parameter submitit refuses is
    one sentence."""
    import submitit

    cluster = None if executor_options.slurm_cluster == "slurm" else executor_options.slurm_cluster
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster or "slurm")
    params = slurm_parameters(executor_options, gpus)
    if cluster is not None:  # submitit's local executors take the shared parameters only
        params = {k: v for k, v in params.items() if not k.startswith("slurm_") and k != "name"}
        params["gpus_per_node"] = 0 if cluster == "local" and not gpus else gpus
    try:
        executor.update_parameters(**params)
    except (NameError, ValueError, TypeError, AssertionError) as error:  # submitit's words for an unknown or mistyped one
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SinkscopeError(f"submitit refused the SLURM parameters ({first.rstrip('.')}); check {option('slurm')} "
                             f"and the other slurm options.") from None
    return executor


def submission_folder(folder: Path) -> Path:
    """A new folder for one submission's submitit files, ``folder/<time>-<random hex>``, created
    exclusively (never one that exists); its path is checked for control characters first (submitit
    writes it into the batch script)."""
    folder = Path(os.path.abspath(folder))
    check_text(str(folder), f"the folder {str(folder)!r} of submitit's files")
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        fresh = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(6)}"
        try:
            fresh.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return fresh


def outcome_path(folder: Path, index: int, nonce: str) -> Path:
    """Where array task ``index`` writes its outcome (its name carries the submission's nonce)."""
    return Path(folder) / f"outcome-{index}-{nonce}.json"


def slurm_task(job: Job, path: str, nonce: str) -> None:
    """What an array task runs: :func:`~sinkscope.executors.jobs.run_job`, then its outcome as JSON at
    ``path``, written atomically (a temporary file, then ``os.replace``). A value that JSON cannot
    hold is a failed outcome. Returns nothing: the driver never reads submitit's result pickle."""
    outcome = run_job(job)
    record = {"nonce": nonce, "name": outcome.name, "ok": outcome.ok, "sentence": outcome.sentence,
              "value": outcome.value, "seconds": outcome.seconds}
    try:
        text = json.dumps(record)
    except (TypeError, ValueError) as error:
        record.update(ok=False, value=None, sentence=f"its result cannot be sent back as JSON ({error})")
        text = json.dumps(record)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def read_outcome(job: Job, path: Path, nonce: str) -> Outcome | None:
    """The outcome the task wrote at ``path``, checked (its nonce, the job's name, the fields' types);
    None when there is none or it is not one."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_OUTCOME_BYTES + 1)
        record = json.loads(data.decode("utf-8")) if len(data) <= MAX_OUTCOME_BYTES else None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not (isinstance(record, dict) and record.get("nonce") == nonce and record.get("name") == job.name
            and isinstance(record.get("ok"), bool) and isinstance(record.get("seconds"), (int, float))
            and (record.get("sentence") is None or isinstance(record.get("sentence"), str))):
        return None
    if not record["ok"] and not record.get("sentence"):
        return None
    return Outcome(job.name, job.log, record["ok"], record.get("sentence"), record.get("value"),
                   float(record["seconds"]))


def run_slurm(jobs: list[Job], executor_options: ExecutorOptions, folder: Path, progress: Progress,
              log: Callable[[str], None]) -> list[Outcome]:
    """Each job's outcome, in the order of ``jobs`` (submitted as one array from a folder of its own
    under ``folder``, waited for)."""
    gpus = int(max((job.gpus for job in jobs), default=0))
    here = submission_folder(folder)
    executor = executor_for(executor_options, here, gpus)
    nonce = secrets.token_hex(16)
    paths = [str(outcome_path(here, k, nonce)) for k in range(len(jobs))]
    submitted = executor.map_array(slurm_task, jobs, paths, [nonce] * len(jobs))
    log(f"Submitted {len(submitted)} runs as a job array through submitit ({executor_options.slurm_cluster}); its files are in "
        f"{here}.")
    try:
        return _wait(jobs, submitted, [Path(p) for p in paths], nonce, progress, log,
                     grace=OUTCOME_GRACE_SECONDS.get(executor_options.slurm_cluster, 0.0))
    except KeyboardInterrupt:
        ids = sorted({str(handle.job_id).split("_")[0] for handle in submitted})
        raise Interrupted(f"interrupted; the SLURM array {', '.join(ids)} keeps running on the cluster (scancel "
                          f"{' '.join(ids)} stops it); its runs write their own folders, and the same command with "
                          f"{option('resume', True)} later keeps the finished ones.") from None


def _wait(jobs: list[Job], submitted: list, paths: list[Path], nonce: str, progress: Progress,
          log: Callable[[str], None], grace: float = 0.0) -> list[Outcome]:
    """Poll the array until every task has ended (submitit's ``done()``, never its ``result()``); each
    outcome is read from its JSON file; the outcomes in the order of ``jobs``."""
    outcomes: dict[str, Outcome] = {}
    ended: dict[str, float] = {}  # when a task was first seen done without its outcome file
    while len(outcomes) < len(jobs):
        for job, handle, path in zip(jobs, submitted, paths):
            if job.name in outcomes or not _done(handle):
                continue
            outcome = read_outcome(job, path, nonce)
            if outcome is None:
                first = ended.setdefault(job.name, time.monotonic())
                if time.monotonic() - first < grace:
                    continue
                outcome = lost(job, f"its SLURM task {handle.job_id} ended without an outcome (killed, out of memory, "
                                    f"out of time or its node lost; submitit's log: {handle.paths.stderr})")
            outcomes[job.name] = outcome
            progress.finish(outcome, log)
        progress.refresh()
        if len(outcomes) < len(jobs):
            time.sleep(1.0)
    return [outcomes[job.name] for job in jobs]


def _done(handle) -> bool:
    """submitit's ``done()``; a task whose state cannot be had any more (the debug executor re-raises
    what its task raised) has ended."""
    try:
        return bool(handle.done())
    except Exception:  # noqa: BLE001 - its outcome file, or its absence, says the rest
        return True
