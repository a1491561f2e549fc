"""``--executor ray``: one Ray task per job (docs/scaling.md).

``ray_address`` "auto" or ``HOST:PORT`` joins a running cluster; none starts a local one for this
command (shut down after it). A Ray session this process already holds (``ray.init`` in a notebook
or a test) is used as it is and left running. Each task asks for one CPU and the job's GPUs
(``--ray-gpus-per-run``, else what its plan's device needs: ``executors.settings.gpus_per_run``). Tasks
are never retried: a failed run is rerun with ``--resume``. Only the small :class:`Outcome` travels
through Ray's object store; the runs are written to the shared filesystem.

Joining is said in one sentence whatever goes wrong (Ray itself would retry an address that does not
answer for ever, and word a missing cluster as a ``ConnectionError``, an ``OSError``): before
``ray.init``, the address (``--ray-address``, else ``RAY_ADDRESS``, else the cluster ``ray start``
recorded, for ``auto``) is asked over TCP whether a gRPC server answers there
(:func:`check_answers`, within :data:`ANSWER_SECONDS`), and joining it may take :data:`JOIN_SECONDS`
(a gRPC server that is not Ray's would keep ``ray.init`` waiting). ``ray.init`` replaces the
process's SIGTERM handler with its own (an exit that dumps Ray's C++ stack); :func:`connect` puts the
command's back, so SIGTERM ends a command on Ray as it ends one anywhere else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import Callable

from sinkscope.executors.jobs import Job, Outcome, Progress, lost, run_job
from sinkscope.executors.settings import ExecutorOptions, control_character, ray_address_parts
from sinkscope.errors import SinkscopeError, option

#: seconds the address has to accept a connection and answer as a gRPC server does
ANSWER_SECONDS = 8.0
#: seconds ``ray.init`` may take to join a cluster at an address that answered (Ray would retry for ever)
JOIN_SECONDS = 20.0
#: HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, Ray Client's server)
#: answers with a SETTINGS frame of its own (type 4)
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
#: whether the session this process holds was started by :func:`connect` (run_ray then shuts it down)
_STARTED = {"here": False}


def cluster_gpus(executor_options: ExecutorOptions) -> float:
    """The GPUs of the cluster the jobs will run on (starts or joins it)."""
    import ray

    connect(executor_options)
    return float(ray.cluster_resources().get("GPU", 0))


def _address(executor_options: ExecutorOptions) -> tuple[str | None, str]:
    """The address Ray will join (None: it starts a local cluster) and how to name it in a sentence:
    ``--ray-address``, or ``RAY_ADDRESS`` (which Ray reads when the option is unset or ``auto``)."""
    given = executor_options.ray_address
    from_env = os.environ.get("RAY_ADDRESS") or None
    if from_env is not None and given in (None, "auto"):
        what = "the RAY_ADDRESS environment variable"
        ray_address_parts(from_env, what)
        return from_env, what
    return given, option("ray_address")


def _resolved(address: str | None) -> str | None:
    """``HOST:PORT`` of the cluster Ray will join for ``address`` (``auto``: the one ``ray start``
    recorded on this machine); None to start a local one, or where Ray's lookup is not to be had.
    ``auto`` with no cluster running is one sentence."""
    if address != "auto":
        return address
    try:  # through the ray module in use (a stand-in in tests has none: ray.init's own words below)
        import ray

        canonicalize_bootstrap_address = ray._private.services.canonicalize_bootstrap_address
    except (ImportError, AttributeError):  # another Ray than the one this was written against
        return None
    try:
        return canonicalize_bootstrap_address(address)
    except ConnectionError:
        raise SinkscopeError(_no_cluster_sentence()) from None
    except Exception:  # noqa: BLE001 - Ray's lookup failed otherwise: ray.init says what it finds
        return None


def _no_cluster_sentence() -> str:
    return (f"no Ray cluster is running on this machine ({option('ray_address')} auto joins one that "
            f"`ray start --head` started); start one, give its address, or leave {option('ray_address')} "
            f"out to start a Ray cluster for this command.")


def check_answers(address: str, what: str, seconds: float = ANSWER_SECONDS) -> None:
    """Refuse, in one sentence within about ``seconds``, an address (``HOST:PORT``, ``[IPv6]:PORT`` or
    ``ray://HOST:PORT``) where nothing accepts a connection, or where what does is not a gRPC server
    (Ray's GCS and Ray Client's server are). Ray over TLS (``RAY_USE_TLS``) is only asked to connect."""
    parts = ray_address_parts(address, what)
    if parts is None:
        return
    host, port = parts
    try:
        with socket.create_connection((host, port), timeout=seconds) as connection:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            connection.settimeout(seconds)
            connection.sendall(_HTTP2_HELLO)
            header = _first_bytes(connection, 4)
    except OSError as error:
        why = (f"no answer within {seconds:.0f} s" if isinstance(error, TimeoutError)
               else (error.strerror or type(error).__name__).lower())
        raise SinkscopeError(f"no Ray cluster answers at {address} ({why}); start one there "
                             f"(`ray start --head`) or give the address of a running one with "
                             f"{option('ray_address')}.") from None
    if len(header) < 4 or header[3] != 4:
        raise SinkscopeError(f"what answers at {address} is not a Ray cluster (it does not speak gRPC); give the "
                             f"address of the cluster's head (`ray start --head` prints it) with "
                             f"{option('ray_address')}.")


def _first_bytes(connection: socket.socket, count: int) -> bytes:
    """Up to ``count`` bytes of what the other end sends first (fewer if it closes the connection)."""
    data = b""
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def connect(executor_options: ExecutorOptions) -> bool:
    """Join or start the cluster unless this process holds one; whether this call started the session.

    The address is checked before Ray starts (:func:`check_answers`); Ray's failures are one sentence;
    the SIGTERM handler this process had is put back after ``ray.init`` (module docstring)."""
    import ray

    if ray.is_initialized():
        return False
    address, what = _address(executor_options)
    target = _resolved(address)
    if target is not None:
        check_answers(target, what)
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        with _within(JOIN_SECONDS if target is not None else None):
            ray.init(address=executor_options.ray_address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except _TookTooLong:
        _shutdown_quietly(ray)
        raise SinkscopeError(f"the Ray cluster at {target} did not let this process join within {JOIN_SECONDS:.0f} s "
                             f"(what answers there may not be Ray's head); check {option('ray_address')}.") from None
    except ConnectionError as error:  # an OSError: the CLI would word it as a disk failure
        if address == "auto":
            raise SinkscopeError(_no_cluster_sentence()) from None
        raise SinkscopeError(f"could not join the Ray cluster at {address or 'this machine'} ({_first_line(error)}); "
                             f"check {option('ray_address')}.") from None
    except (ValueError, RuntimeError) as error:
        raise SinkscopeError(f"Ray could not start or join its cluster ({_first_line(error)}); check "
                             f"{option('ray_address')}.") from None
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)
    _STARTED["here"] = True
    return True


class _TookTooLong(Exception):
    """``ray.init`` ran past :data:`JOIN_SECONDS`."""


@contextlib.contextmanager
def _within(seconds: float | None):
    """Raise :class:`_TookTooLong` in the block after ``seconds`` (a SIGALRM timer; None, off the main
    thread or without timers: no limit). The timer and the SIGALRM handler are put back after."""
    if seconds is None or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expired(_signum, _frame):
        raise _TookTooLong

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _shutdown_quietly(ray) -> None:
    """Undo what a ``ray.init`` cut short had set up (its failure is not the user's news)."""
    try:
        ray.shutdown()
    except Exception:  # noqa: BLE001 - the sentence already says what went wrong
        pass


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0].rstrip(".") if text else type(error).__name__)


def _task_name(job: Job) -> str:
    """The task's name in Ray's dashboard: the job's, control characters written as escapes."""
    name = job.name
    if control_character(name) is not None:
        name = name.encode("unicode_escape").decode("ascii")
    return f"sinkscope:{name}"


def run_ray(jobs: list[Job], executor_options: ExecutorOptions, progress: Progress, log: Callable[[str], None]) -> list[Outcome]:
    """Each job's outcome, in the order of ``jobs``."""
    import ray

    connect(executor_options)
    try:
        task = ray.remote(max_retries=0)(run_job)
        refs = {task.options(num_cpus=1, num_gpus=job.gpus, name=_task_name(job)).remote(job): job
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
        if _STARTED["here"]:
            _STARTED["here"] = False
            ray.shutdown()
