"""The ``--executor`` options (docs/scaling.md), torch-free: checked with the run's other options,
before anything heavy is imported.

    local   this process (``jobs`` 1, today's behaviour), or ``jobs`` spawned local processes
    ray     one Ray task per job: ``ray_address`` "auto" or an address joins a cluster, none starts
            a local one; each task asks for ``num_gpus`` (:func:`gpus_per_run`) and one CPU
    slurm   one SLURM array task per job through submitit: ``slurm_partition``, ``slurm_gpus_per_run``,
            ``slurm_time`` (minutes), ``slurm_array_parallelism``, any other submitit parameter in
            ``slurm_extra`` (key=value); ``slurm_cluster`` local | debug runs submitit's own local
            executors (local processes; in this process) instead of sbatch

Every value that reaches a batch script, a shell or a cluster's API is checked here, from the command
line, the API and recipes alike (:func:`check_text`: no control characters, so a newline cannot end an
``#SBATCH`` line and start a shell line); numbers are read with ``int()``/``float()`` and must be finite;
a Ray address must be ``auto``, ``HOST:PORT``, ``[IPv6]:PORT`` or ``ray://HOST:PORT``
(:func:`ray_address_parts`).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import math
import re
import shutil
import unicodedata
from dataclasses import dataclass

from sinkscope.errors import SinkscopeError, option

EXECUTORS = ("local", "ray", "slurm")
SLURM_CLUSTERS = ("slurm", "local", "debug")
#: the extra each engine needs: (module, pip extra)
EXTRAS = {"ray": ("ray", "ray"), "slurm": ("submitit", "slurm")}


@dataclass(frozen=True)
class ExecutorOptions:
    """Where the jobs of one command run (module docstring); none of it changes a number."""

    executor: str = "local"
    jobs: int = 1
    ray_address: str | None = None
    ray_gpus_per_run: float | None = None
    slurm_partition: str | None = None
    slurm_gpus_per_run: int | None = None
    slurm_time: int = 60
    slurm_array_parallelism: int = 64
    slurm_cluster: str = "slurm"
    slurm_extra: tuple[str, ...] = ()  # any other submitit parameter, key=value (sweep's --slurm)

    @property
    def in_process(self) -> bool:
        """The jobs run one after the other in this process (no log files, no engine)."""
        return self.executor == "local" and self.jobs == 1


#: the option names, for the callers that take them among other keyword values (CLI, API, recipes)
EXECUTOR_FIELDS = tuple(ExecutorOptions.__dataclass_fields__)


def choose_executor(values: dict) -> ExecutorOptions:
    """The :class:`ExecutorOptions` among ``values`` (other names ignored), checked."""
    given = {name: values[name] for name in EXECUTOR_FIELDS if values.get(name) is not None}
    return check_executor(ExecutorOptions(**given))


def check_executor(executor_options: ExecutorOptions) -> ExecutorOptions:
    """Refuse an unknown executor, a bad count, a text that would break a batch script or a cluster
    call (control characters), a malformed Ray address, or an engine whose package is missing (one
    sentence naming the pip command); returns ``engine``."""
    if executor_options.executor not in EXECUTORS:
        raise SinkscopeError(f"unknown {option('executor')} {executor_options.executor!r}; use {', '.join(EXECUTORS)}.")
    for name in ("jobs", "slurm_time", "slurm_array_parallelism"):
        value = getattr(executor_options, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SinkscopeError(f"{option(name)} must be a positive integer (got {value!r}).")
    for name in ("ray_gpus_per_run", "slurm_gpus_per_run"):
        value = getattr(executor_options, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            raise SinkscopeError(f"{option(name)} must be a finite number, 0 or more (got {value!r}).")
    if executor_options.slurm_cluster not in SLURM_CLUSTERS:
        raise SinkscopeError(f"unknown {option('slurm_cluster')} {executor_options.slurm_cluster!r}; use {', '.join(SLURM_CLUSTERS)}.")
    _check_texts(executor_options)
    for item in executor_options.slurm_extra:
        _check_slurm_item(item)
    if executor_options.ray_address is not None:
        ray_address_parts(executor_options.ray_address)
    if executor_options.jobs > 1 and executor_options.executor != "local":
        raise SinkscopeError(f"{option('jobs')} sets the local executor's processes; {executor_options.executor} runs as many "
                             f"jobs at once as its resources allow.")
    if executor_options.executor in EXTRAS:
        module, extra = EXTRAS[executor_options.executor]
        if importlib.util.find_spec(module) is None:
            raise SinkscopeError(f"{option('executor')} {executor_options.executor} needs the {module} package: "
                                 f"pip install 'sinkscope[{extra}]'.")
    if executor_options.executor == "slurm" and executor_options.slurm_cluster == "slurm" and shutil.which("sbatch") is None:
        raise SinkscopeError(f"{option('executor')} slurm submits with sbatch, which this machine does not have; run "
                             f"the command on the cluster's login node, or try the runs here with "
                             f"{option('slurm_cluster')} local.")
    return executor_options


def control_character(text: str) -> str | None:
    """The first character of ``text`` that would end or bend a line of a batch script or a shell
    command (a control character: newline, carriage return, tab, escape, NUL, ...; or a Unicode line or
    paragraph separator), shown as Python writes it (``'\\n'``); None when there is none."""
    for char in text:
        if unicodedata.category(char) in ("Cc", "Zl", "Zp"):
            return repr(char)
    return None


def check_text(text: str, what: str) -> None:
    """Refuse ``text`` (named ``what``: an option, a folder) when it holds a control character: it would
    reach a batch script, a shell line or a cluster's API, where a newline starts a command of its own."""
    found = control_character(text)
    if found is not None:
        raise SinkscopeError(f"{what} holds the control character {found}, which would reach a batch script or a "
                             f"cluster's API as a line break or an escape; remove it.")


def _check_texts(executor_options: ExecutorOptions) -> None:
    """Every text option is a string without control characters (:func:`check_text`)."""
    for name in ("executor", "ray_address", "slurm_partition", "slurm_cluster"):
        value = getattr(executor_options, name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise SinkscopeError(f"{option(name)} takes a text, not {value!r}.")
        check_text(value, option(name))
    if isinstance(executor_options.slurm_extra, (str, bytes)) or not isinstance(executor_options.slurm_extra, (tuple, list)):
        raise SinkscopeError(f"{option('slurm')} takes a list of key=value texts, not {executor_options.slurm_extra!r}.")
    for item in executor_options.slurm_extra:
        if not isinstance(item, str):
            raise SinkscopeError(f"{option('slurm')} takes key=value texts, not {item!r}.")
        check_text(item, f"{option('slurm')} {item.partition('=')[0].strip()!r}")


#: submitit parameters that are shell lines, lists or tables, not one sbatch value: ``--slurm`` cannot
#: give them (a text where submitit expects a list would run as shell lines or break the script).
SLURM_CODE_KEYS = ("setup", "teardown", "srun_args", "additional_parameters", "use_srun", "python", "command")


def _check_slurm_item(item: str) -> None:
    """One ``--slurm key=value``: a key, and not a parameter that carries shell lines (:data:`SLURM_CODE_KEYS`)."""
    key = item.partition("=")[0].strip()
    if "=" not in item or not key:
        raise SinkscopeError(f"{option('slurm')} takes a submitit parameter as key=value, not {item!r}.")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", key):
        raise SinkscopeError(f"{option('slurm')} takes a submitit parameter name (letters, digits, _) before '=', "
                             f"not {key!r}.")
    bare = key[len("slurm_"):] if key.startswith("slurm_") else key
    if bare in SLURM_CODE_KEYS:
        raise SinkscopeError(f"{option('slurm')} {key} would put shell commands into the batch script, which "
                             f"sinkscope does not pass on; set the environment up before running the command.")


def slurm_value(text: str):
    """A ``--slurm`` value as submitit takes it: a whole number (``int()``, ASCII digits) as an int, else
    the text (stripped)."""
    text = text.strip()
    return int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else text


#: ``--ray-address``: auto, HOST:PORT, [IPv6]:PORT or ray://HOST:PORT
_RAY_ADDRESS = re.compile(r"(?P<scheme>ray://)?(?:\[(?P<ipv6>[^\]]*)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>[0-9]{1,5})")


def ray_address_parts(address: str, what: str | None = None) -> tuple[str, int] | None:
    """``address`` checked (``auto``, ``HOST:PORT``, ``[IPv6]:PORT`` or ``ray://HOST:PORT``, the port an
    integer from 1 to 65535): (host, port), or None for ``auto``; else one sentence naming ``what``
    (default: the ``ray_address`` option)."""
    what = what or option("ray_address")
    if address == "auto":
        return None
    check_text(address, what)
    match = _RAY_ADDRESS.fullmatch(address)
    usage = "auto, HOST:PORT, [IPv6]:PORT or ray://HOST:PORT (the port a number from 1 to 65535)"
    if match is None:
        raise SinkscopeError(f"{what} {address!r} is not a Ray address; use {usage}.")
    port = int(match["port"])
    host = match["host"] if match["ipv6"] is None else match["ipv6"]
    if not 1 <= port <= 65535:
        raise SinkscopeError(f"{what} {address!r} has the port {port}; use {usage}.")
    if match["ipv6"] is not None:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise SinkscopeError(f"{what} {address!r} has no IPv6 address between its brackets; use {usage}.") from None
    elif host.startswith(("-", ".")) or ".." in host:
        raise SinkscopeError(f"{what} {address!r} has no valid host name; use {usage}.")
    return host, port


def gpus_per_run(device: str, device_map: str | None, override: float | None, cluster_gpus: float) -> float:
    """The GPUs one plan asks of its engine: ``override`` if given; else 1 for a cuda device, a device
    map (a sharded model asks for one GPU unless told more), or ``auto`` on a cluster that has GPUs;
    else 0 (the plan runs on CPU)."""
    if override is not None:
        return float(override)
    if device_map is not None or str(device).startswith("cuda"):
        return 1.0
    return 1.0 if device == "auto" and cluster_gpus > 0 else 0.0
