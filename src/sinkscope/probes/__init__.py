"""What we measure: one module per probe, each a streaming reduction registered by decorator.

Lives here: ``base.py`` (``Probe``, ``Param``, ``@register_probe``, ``@observes``, accumulators) and
one module per probe; every module is imported on first use, so adding a probe is adding a file.
Probes defined outside the package (a notebook, a research script) register the same way when
their module is imported, or from a file with :func:`load_plugin` (the CLI's ``--plugin``). The
names a probe writer needs are exported here (``from sinkscope.probes import Probe, MetricInfo, ...``).
May import: capture, kvcache, stats, data, models, store, runtime; never forward (a probe never
drives the loop) or the report.
Add here: a metric (docs/writing-a-probe.md), with a unit test against its formula.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import pkgutil
import sys
from pathlib import Path

from sinkscope.errors import suggest
from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import PROBES, Accumulator, HeadMeans, Param, Probe, intervenes, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

_discovered = False


def discover() -> dict[str, type[Probe]]:
    """Import every module of this package once; returns the registry."""
    global _discovered
    if not _discovered:
        for module in pkgutil.iter_modules(__path__):
            if module.name not in ("base", "stats"):
                importlib.import_module(f"{__name__}.{module.name}")
        _discovered = True
    return PROBES


def others_can_write(file: Path) -> str | None:
    """Why users other than the owner could change ``file`` (None if they cannot): the file or its folder
    is writable by everyone (a sticky folder such as /tmp included: a planted file is someone else's), or
    the file belongs to another user."""
    import stat

    try:
        info, folder = file.stat(), file.resolve().parent.stat()
    except OSError:
        return None
    if info.st_mode & stat.S_IWOTH:
        return "is writable by everyone"
    if folder.st_mode & stat.S_IWOTH:
        return f"sits in a folder everyone can write ({file.resolve().parent})"
    owner = getattr(os, "getuid", lambda: info.st_uid)()
    if info.st_uid not in (owner, 0):
        return "belongs to another user"
    return None


@functools.cache
def _say_once(message: str) -> None:
    print(message, file=sys.stderr)


def load_plugin(path: str) -> list[str]:
    """Import a Python file that registers probes; returns the names it registered."""
    file = Path(path).expanduser()
    if not file.is_file() or file.suffix != ".py":
        raise SinkscopeError(f"no probe plugin file at {path} (a .py file is expected).")
    writable = others_can_write(file)
    if writable:
        _say_once(f"warning: the probe plugin {file.resolve()} {writable}: anyone on this machine could have "
                  "changed the code that is about to run.")
    before = set(PROBES)
    name = f"sinkscope_plugin_{file.stem}_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SinkscopeError:
        raise
    except Exception as error:  # noqa: BLE001 - a broken plugin is the user's file: one sentence
        raise SinkscopeError(f"the probe plugin {path} failed to import ({type(error).__name__}: {error}).") from error
    added = sorted(set(PROBES) - before)
    mine = [cls for cls in PROBES.values() if getattr(cls, "__module__", "") == name]
    if not added and not mine:
        raise SinkscopeError(f"the plugin {path} registers no probe (decorate a Probe subclass with @register_probe).")
    for cls in mine:
        _guard(cls, path)
    return added


def _guard(cls: type[Probe], path: str) -> None:
    """Make every method of a plugin's probe turn an unexpected error into one sentence naming the file.

    The error of the plugin's own code is kept as the sentence's cause (``sinkscope --debug`` prints
    its traceback). Built-in probes are never wrapped: their errors are our bugs and surface as
    tracebacks. A deliberate SinkscopeError and running out of memory (the runner halves the
    batch) pass through unchanged. The wrapper costs one call per method call of a plugin probe.
    """
    for attr, method in inspect.getmembers(cls, inspect.isfunction):
        if (attr.startswith("__") and attr != "__init__") or getattr(method, "_plugin_guard", False):
            continue
        setattr(cls, attr, _guarded(method, path))


def _guarded(method, path: str):
    @functools.wraps(method)  # keeps @observes/@intervenes marks
    def guarded(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except SinkscopeError:
            raise
        except Exception as error:  # noqa: BLE001 - the plugin's code, whatever it raised
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(error, torch.OutOfMemoryError):
                raise
            probe = getattr(self, "name", None) or type(self).__name__
            detail = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
            raise SinkscopeError(
                f"the probe {probe!r} of the plugin {path} failed in {method.__name__}() "
                f"({type(error).__name__}{': ' + detail if detail else ''}); fix the plugin "
                "(`sinkscope --debug ...` or SINKSCOPE_DEBUG=1 prints its traceback).") from error

    guarded._plugin_guard = True
    return guarded


def get_probe(name: str) -> type[Probe]:
    """The probe class registered as ``name``, or a one-sentence error with a suggestion."""
    probes = discover()
    if name not in probes:
        raise SinkscopeError(f"unknown probe {name!r}{suggest(name, probes)}; known probes: {', '.join(sorted(probes))}.")
    return probes[name]


def metric_info() -> dict[str, MetricInfo]:
    """Every registered metric's documentation, keyed by metric name."""
    return {metric: info for cls in discover().values() for metric, info in cls.metrics.items()}


__all__ = [
    "PROBES",
    "Accumulator",
    "HeadMeans",
    "MetricInfo",
    "Param",
    "Probe",
    "Row",
    "discover",
    "get_probe",
    "intervenes",
    "load_plugin",
    "metric_info",
    "observes",
    "register_probe",
]
