"""``sinkscope sinks``: the sink measurements of SPEC.md, per layer and head.

Probes: position-0 mass, sink rate (Gu et al.; ``[s:]`` row), phantom mass and sink logits,
value-norm ratio, massive activations. Everything else (windows, loading, resume, torchrun,
the run folder, the report) is the pipeline's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError
from sinkscope.options import Command, RunOptions, check_layer_start

if TYPE_CHECKING:
    from sinkscope.capture.families import ModelSpec
    from sinkscope.sources import Source

#: the probes `sinks` runs, in table order.
SINKS_PROBES: tuple[str, ...] = ("p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio", "massive_activation")


@dataclass
class SinksOptions(RunOptions):
    """``RunOptions`` plus the sink-rate settings.

    Attributes:
        sink_epsilon: Gu et al.'s threshold eps on alpha_0 (0.3).
        sink_layer_start: the first layer of the ``sink_rate[s:]`` row; None = seed 003's 2 on
            models with more than 2 layers, and no such row on smaller ones.
    """

    sink_epsilon: float = 0.3
    sink_layer_start: int | None = None


#: seed 003 Table 1 reports Sink_0^eps over layers >= 2.
DEFAULT_SINK_LAYER_START = 2


def sink_layer_start(options: SinksOptions, spec: ModelSpec) -> int | None:
    """The ``[s:]`` row's first layer for this model (None: no such row)."""
    if options.sink_layer_start is not None:
        return options.sink_layer_start
    return DEFAULT_SINK_LAYER_START if spec.n_layers > DEFAULT_SINK_LAYER_START else None


def _probes(options: SinksOptions, spec: ModelSpec) -> list[tuple[str, dict]]:
    rate = {"epsilon": options.sink_epsilon, "layer_start": sink_layer_start(options, spec)}
    return [(name, rate if name == "sink_rate" else {}) for name in SINKS_PROBES]


def _check(options: SinksOptions) -> None:
    if not 0.0 < options.sink_epsilon < 1.0:
        raise SinkscopeError(f"--sink-epsilon must lie in (0, 1) (got {options.sink_epsilon}).")
    check_layer_start(options.sink_layer_start, None)


def _check_source(options: SinksOptions, source: Source) -> None:
    from sinkscope.sources import layer_count

    check_layer_start(options.sink_layer_start, layer_count(source))


def _check_model(options: SinksOptions, spec: ModelSpec) -> None:
    check_layer_start(options.sink_layer_start, spec.n_layers, spec.attention_layers)


SINKS = register_command(Command(
    name="sinks",
    summary="position-0 mass, sink rate, phantom mass, value-norm ratio and massive activations",
    options=SinksOptions,
    probes=_probes,
    check=_check,
    check_source=_check_source,
    check_model=_check_model,
))


def sinks_probes(spec: ModelSpec, **options) -> list:
    """The probes of a ``sinks`` run on a model of ``spec`` (``options``: ``SinksOptions`` fields)."""
    from sinkscope.pipeline import make_probes

    return make_probes(SINKS, SinksOptions(**options), spec)
