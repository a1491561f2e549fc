"""``sinkscope measure``: any registered probes, by name, through the same pipeline.

For probes that have no command of their own yet (a probe written in a plugin file, an
experiment): ``sinkscope measure MODEL --probe p0_mass --probe my_probe --param my_probe.k=3
--plugin my_probes.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError, option
from sinkscope.commands.spec import Command, RunOptions


@dataclass
class MeasureOptions(RunOptions):
    """``RunOptions`` plus the probes to run and their parameters.

    Attributes:
        probes: registered probe names, in table order.
        params: ``PROBE.NAME=VALUE`` settings of probe parameters.
        plugins: Python files that register probes, imported first.
    """

    probes: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()


def parse_params(items, probes) -> dict[str, dict]:
    """``["sink_rate.epsilon=0.5"]`` -> ``{"sink_rate": {"epsilon": "0.5"}}`` (values typed by the probe)."""
    out: dict[str, dict] = {name: {} for name in probes}
    for item in items:
        key, sep, value = item.partition("=")
        probe, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise SinkscopeError(f"{option('params')} takes PROBE.NAME=VALUE, not {item!r}.")
        if probe not in out:
            raise SinkscopeError(f"{option('params')} {item!r} names the probe {probe!r}, which is not among {option('probes')} "
                                 f"{', '.join(probes)}.")
        out[probe][name] = value.strip()
    return out


def _load_plugins(options: MeasureOptions) -> None:
    from sinkscope.probes import discover, load_plugin

    discover()
    for path in options.plugins:
        load_plugin(path)


def _check(options: MeasureOptions) -> None:
    from sinkscope.probes import get_probe

    if not options.probes:
        raise SinkscopeError(f"name at least one {option('probes')} (see `sinkscope ls probes`).")
    if len(set(options.probes)) != len(options.probes):
        raise SinkscopeError(f"each {option('probes')} may be named once.")
    _load_plugins(options)
    for name, params in parse_params(options.params, options.probes).items():
        get_probe(name).resolve_params(params)


def _probes(options: MeasureOptions, spec) -> list[tuple[str, dict]]:
    _load_plugins(options)
    params = parse_params(options.params, options.probes)
    return [(name, params[name]) for name in options.probes]


MEASURE = register_command(Command(
    name="measure",
    summary="any registered probes, by name (plugins included)",
    options=MeasureOptions,
    probes=_probes,
    check=_check,
))
