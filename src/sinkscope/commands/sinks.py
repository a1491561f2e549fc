"""``sinkscope sinks``: the sink measurements of SPEC.md, per layer and head.

Probes: position-0 mass, sink rate (Gu et al.; ``[s:]`` row), phantom mass and sink logits,
value-norm ratio, massive activations. Everything else (windows, loading, resume, torchrun,
the run folder, the report) is the pipeline's.

Massive activations as Sun et al. measure them (``probes/massive_topk.py``): ``--massive-top-k K``
adds the K largest entries of every layer's output hidden state, each with channel, position,
token and whether it meets the criterion ``|h| > --massive-min-abs`` (100) and ``>=
--massive-min-ratio`` (1,000) x the window's median |h|. ``--massive-intervention zero|mean``
then runs a second stage over the same windows (the pipeline's ``followup``, as ``heads
--ablate-dormant``): every top-k entry meeting the criterion, at the first layer where it does,
is set to 0 or to its mean over the run at that layer's output (``hook_resid_post``), and the
loss change is reported (``massive_intervention``); the clean loss is the first stage's (its
clean pass sums it, ``massive_topk``'s ``clean_loss``), so the second stage runs only the
intervened pass, under the same attention function (SPEC.md "The loss change of a second
stage"). Off by default (top-k 0): a plain ``sinks`` run gives the rows it always gave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError, option
from sinkscope.commands.spec import Command, RunOptions, check_layer_start

if TYPE_CHECKING:
    from sinkscope.capture.families import ModelSpec
    from sinkscope.models.resolve import Source

#: the probes `sinks` runs, in table order.
SINKS_PROBES: tuple[str, ...] = ("p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio", "massive_activation")


@dataclass
class SinksOptions(RunOptions):
    """``RunOptions`` plus the sink-rate settings.

    Attributes:
        sink_epsilon: Gu et al.'s threshold eps on alpha_0 (0.3).
        sink_layer_start: the first layer of the ``sink_rate_from_layer`` row; None = the P0-sink study's 2 on
            models with more than 2 layers, and no such row on smaller ones.
        massive_top_k: the top-k residual entries per layer (0: none; 10 with an intervention).
        massive_min_abs, massive_min_ratio: Sun et al.'s criterion, |h| > 100 and >= 1,000 x median.
        massive_intervention: ``zero`` | ``mean``: set the massive entries so and report the loss change.
        sink_first_query: sink_rate's alpha_k averages the queries t >= this (None: t >= k, Gu et al.'s).
        inputs: ``text`` (the corpus's windows) | ``random`` | ``repeated``: Gu et al.'s three inputs
            (SPEC.md "Gu et al.'s inputs"; ``corpus.synthetic_windows``).
    """

    sink_epsilon: float = 0.3
    sink_layer_start: int | None = None
    sink_first_query: int | None = None
    inputs: str = "text"
    massive_top_k: int = 0
    massive_min_abs: float = 100.0
    massive_min_ratio: float = 1000.0
    massive_intervention: str | None = None


#: the P0-sink study, Table 1 reports Sink_0^eps over layers >= 2.
DEFAULT_SINK_LAYER_START = 2


def sink_layer_start(options: SinksOptions, spec: ModelSpec) -> int | None:
    """The ``[s:]`` row's first layer for this model (None: no such row)."""
    if options.sink_layer_start is not None:
        return options.sink_layer_start
    return DEFAULT_SINK_LAYER_START if spec.n_layers > DEFAULT_SINK_LAYER_START else None


#: ``--massive-intervention`` values.
MASSIVE_INTERVENTIONS = ("zero", "mean")


def massive_top_k(options: SinksOptions) -> int:
    """The top-k asked for; an intervention without --massive-top-k takes the probe's default (10)."""
    from sinkscope.probes.massive_topk import DEFAULT_TOP_K

    if options.massive_top_k == 0 and options.massive_intervention is not None:
        return DEFAULT_TOP_K
    return options.massive_top_k


def _probes(options: SinksOptions, spec: ModelSpec) -> list[tuple[str, dict]]:
    rate = {"epsilon": options.sink_epsilon, "layer_start": sink_layer_start(options, spec),
            **({"first_query": options.sink_first_query} if options.sink_first_query is not None else {})}
    probes = [(name, rate if name == "sink_rate" else {}) for name in SINKS_PROBES]
    if massive_top_k(options):
        probes.append(("massive_topk", {"top_k": massive_top_k(options), "min_abs": options.massive_min_abs,
                                        "min_ratio": options.massive_min_ratio,
                                        "means": options.massive_intervention == "mean",
                                        # the second stage's clean loss, from this clean pass
                                        "clean_loss": options.massive_intervention is not None}))
    return probes


def _followup(options: SinksOptions, spec: ModelSpec, probes: list) -> list[tuple[str, dict]]:
    """With ``--massive-intervention``: set the massive top-k entries (found on all windows)."""
    from sinkscope.probes.massive_topk import format_entry

    if options.massive_intervention is None:
        return []
    (top,) = [p for p in probes if p.name == "massive_topk"]
    mean = options.massive_intervention == "mean"
    entries = tuple(format_entry(l, t, c, top.mean_at(l, t, c) if mean else 0.0)
                    for l, t, c in top.intervention_entries())
    return [("massive_intervention", {"entries": entries, "mode": options.massive_intervention,
                                      **top.clean_loss_params()})]


def _check(options: SinksOptions) -> None:
    if options.massive_top_k < 0:
        raise SinkscopeError(f"{option('massive_top_k')} must be 0 or more (got {options.massive_top_k}).")
    if options.massive_min_abs < 0 or options.massive_min_ratio < 0:
        raise SinkscopeError(f"{option('massive_min_abs')} and {option('massive_min_ratio')} must be 0 or more.")
    if options.massive_intervention is not None and options.massive_intervention not in MASSIVE_INTERVENTIONS:
        raise SinkscopeError(f"unknown {option('massive_intervention')} {options.massive_intervention!r}; use zero or mean.")
    from sinkscope.data.corpus import INPUTS

    if options.inputs not in INPUTS:
        raise SinkscopeError(f"unknown {option('inputs')} {options.inputs!r}; use {', '.join(INPUTS)}.")
    if options.inputs != "text" and (options.text_file or options.dataset):
        raise SinkscopeError(f"{option('inputs')} {options.inputs} draws its own token ids; it reads no "
                             f"{option('text_file')} or {option('dataset')}.")
    if options.sink_first_query is not None and options.sink_first_query < 0:
        raise SinkscopeError(f"{option('sink_first_query')} must be 0 or more (got {options.sink_first_query}).")
    if not 0.0 < options.sink_epsilon < 1.0:
        raise SinkscopeError(f"{option('sink_epsilon')} must lie in (0, 1) (got {options.sink_epsilon}).")
    check_layer_start(options.sink_layer_start, None)


def _check_source(options: SinksOptions, source: Source) -> None:
    from sinkscope.models.model_config import layer_count

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
    followup=_followup,
))


def sinks_probes(spec: ModelSpec, **options) -> list:
    """The probes of a ``sinks`` run on a model of ``spec`` (``options``: ``SinksOptions`` fields)."""
    from sinkscope.commands import make_probes

    return make_probes(SINKS, SinksOptions(**options), spec)
