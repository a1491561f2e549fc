"""What we measure: one module per probe, each a streaming reduction registered by decorator.

Every module of this package is imported on first use, and each registers its probes with
``@register_probe`` (``base.py``), so adding a probe is adding a file: no list to keep in
sync. Probes defined outside the package (a notebook, a research script) register the same way
when their module is imported, or from a file with :func:`load_plugin` (the CLI's ``--plugin``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

from sinkscope.errors import suggest
from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import (PROBES, Accumulator, HeadMeans, MetricInfo, Param, Probe, Row, intervenes, observes,
                                   register_probe)

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


def load_plugin(path: str) -> list[str]:
    """Import a Python file that registers probes; returns the names it registered."""
    file = Path(path).expanduser()
    if not file.is_file() or file.suffix != ".py":
        raise SinkscopeError(f"no probe plugin file at {path} (a .py file is expected).")
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
    if not added and not any(getattr(cls, "__module__", "") == name for cls in PROBES.values()):
        raise SinkscopeError(f"the plugin {path} registers no probe (decorate a Probe subclass with @register_probe).")
    return added


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
