"""What we measure: one module per probe, each a streaming reduction (see ``base.py``).

``PROBES`` is the registry, keyed by probe name; ``SINKS_PROBES`` is what ``sinkscope sinks``
runs. To add a probe: write a module with a :class:`~sinkscope.probes.base.Probe` subclass and
add it here.
"""

from __future__ import annotations

from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import HeadMeans, MetricInfo, Probe, Row
from sinkscope.probes.massive_activation import MassiveActivation
from sinkscope.probes.p0_mass import P0Mass
from sinkscope.probes.phantom import PhantomMass
from sinkscope.probes.sink_rate import SinkRate
from sinkscope.probes.value_norm import ValueNormRatio

PROBES: dict[str, type[Probe]] = {
    cls.name: cls for cls in [P0Mass, SinkRate, PhantomMass, ValueNormRatio, MassiveActivation]
}

SINKS_PROBES: tuple[str, ...] = ("p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio", "massive_activation")


def get_probe(name: str) -> type[Probe]:
    """The probe class registered as ``name``, or a one-sentence error listing the known ones."""
    if name not in PROBES:
        raise SinkscopeError(f"unknown probe {name!r}; known probes are: {', '.join(sorted(PROBES))}.")
    return PROBES[name]




def metric_info() -> dict[str, MetricInfo]:
    """Every registered metric's documentation, keyed by metric name."""
    return {metric: info for cls in PROBES.values() for metric, info in cls.metrics.items()}


__all__ = ["PROBES", "SINKS_PROBES", "HeadMeans", "MetricInfo", "Probe", "Row", "get_probe", "metric_info"]
