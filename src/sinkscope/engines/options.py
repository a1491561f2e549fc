"""The ``--executor`` options (docs/scaling.md), torch-free: checked with the run's other options,
before anything heavy is imported.

    local   this process (``jobs`` 1, today's behaviour), or ``jobs`` spawned local processes
    ray     one Ray task per job: ``ray_address`` "auto" or an address joins a cluster, none starts
            a local one; each task asks for ``num_gpus`` (:func:`gpus_per_run`) and one CPU
    slurm   one SLURM array task per job through submitit: ``slurm_partition``, ``slurm_gpus_per_run``,
            ``slurm_time`` (minutes), ``slurm_array_parallelism``, any other submitit parameter in
            ``slurm_extra`` (key=value); ``slurm_cluster`` local | debug runs submitit's own local
            executors (local processes; in this process) instead of sbatch
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass

from sinkscope.errors import SinkscopeError, option

EXECUTORS = ("local", "ray", "slurm")
SLURM_CLUSTERS = ("slurm", "local", "debug")
#: the extra each engine needs: (module, pip extra)
EXTRAS = {"ray": ("ray", "ray"), "slurm": ("submitit", "slurm")}


@dataclass(frozen=True)
class EngineOptions:
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
ENGINE_FIELDS = tuple(EngineOptions.__dataclass_fields__)


def engine_options(values: dict) -> EngineOptions:
    """The :class:`EngineOptions` among ``values`` (other names ignored), checked."""
    given = {name: values[name] for name in ENGINE_FIELDS if values.get(name) is not None}
    return check_engine(EngineOptions(**given))


def check_engine(engine: EngineOptions) -> EngineOptions:
    """Refuse an unknown executor, a bad count, or an engine whose package is missing (one sentence
    naming the pip command); returns ``engine``."""
    if engine.executor not in EXECUTORS:
        raise SinkscopeError(f"unknown {option('executor')} {engine.executor!r}; use {', '.join(EXECUTORS)}.")
    for name in ("jobs", "slurm_time", "slurm_array_parallelism"):
        value = getattr(engine, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SinkscopeError(f"{option(name)} must be a positive integer (got {value!r}).")
    for name in ("ray_gpus_per_run", "slurm_gpus_per_run"):
        value = getattr(engine, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise SinkscopeError(f"{option(name)} must be 0 or more (got {value!r}).")
    if engine.slurm_cluster not in SLURM_CLUSTERS:
        raise SinkscopeError(f"unknown {option('slurm_cluster')} {engine.slurm_cluster!r}; use {', '.join(SLURM_CLUSTERS)}.")
    for item in engine.slurm_extra:
        if "=" not in str(item) or not str(item).partition("=")[0].strip():
            raise SinkscopeError(f"{option('slurm')} takes a submitit parameter as key=value, not {item!r}.")
    if engine.jobs > 1 and engine.executor != "local":
        raise SinkscopeError(f"{option('jobs')} sets the local executor's processes; {engine.executor} runs as many "
                             f"jobs at once as its resources allow.")
    if engine.executor in EXTRAS:
        module, extra = EXTRAS[engine.executor]
        if importlib.util.find_spec(module) is None:
            raise SinkscopeError(f"{option('executor')} {engine.executor} needs the {module} package: "
                                 f"pip install 'sinkscope[{extra}]'.")
    if engine.executor == "slurm" and engine.slurm_cluster == "slurm" and shutil.which("sbatch") is None:
        raise SinkscopeError(f"{option('executor')} slurm submits with sbatch, which this machine does not have; run "
                             f"the command on the cluster's login node, or try the runs here with "
                             f"{option('slurm_cluster')} local.")
    return engine


def gpus_per_run(device: str, device_map: str | None, override: float | None, cluster_gpus: float) -> float:
    """The GPUs one plan asks of its engine: ``override`` if given; else 1 for a cuda device, a device
    map (a sharded model asks for one GPU unless told more), or ``auto`` on a cluster that has GPUs;
    else 0 (the plan runs on CPU)."""
    if override is not None:
        return float(override)
    if device_map is not None or str(device).startswith("cuda"):
        return 1.0
    return 1.0 if device == "auto" and cluster_gpus > 0 else 0.0
