"""``sinkscope heads``: implicit gates, head importance, load imbalance and dormant heads (seed 004).

Probes: ``head_importance`` (SPEC.md "Implicit gate and head importance"; formulas shared with
the trainer in ``sinkscope.gates``) and, with ``--ablate-dormant``, ``head_ablation``.

How the dormant heads are chosen before they are ablated: the run has two stages over the same
windows (the pipeline's ``followup``). Stage one measures the importance of every head on *all*
the windows (merged over processes under torchrun); the dormant set is then fixed (Imp^{l,h} <
``--dormant-below``) and recorded in the manifest as the ``head_ablation`` probe's ``heads``;
stage two runs every window twice, clean and with those heads' outputs zeroed at ``hook_z``, and
reports the loss change. So the ablated set never depends on batch order or batch size, and the
clean loss is measured on the same windows as the ablated one. The cost is three forward passes
per window instead of one, only when ``--ablate-dormant`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError
from sinkscope.options import Command, RunOptions

if TYPE_CHECKING:
    from sinkscope.capture.families import ModelSpec
    from sinkscope.sources import Source

#: ``--sink-set`` values; ``auto`` is the model's own (its phantom if it has one, else key 0).
SINK_SET_CHOICES = ("auto", "first", "phantom", "first+phantom")  # = ("auto",) + gates.SINK_SETS
#: seed 004 leaves the dormancy threshold open (probes/head_importance.py DORMANT_BELOW).
DEFAULT_DORMANT_BELOW = 0.1


@dataclass
class HeadsOptions(RunOptions):
    """``RunOptions`` plus the sink set, the dormancy threshold and the ablation switch.

    Attributes:
        sink_set: ``auto`` | ``first`` | ``phantom`` | ``first+phantom``: what A_sink sums
            (``auto``: the phantom where the model has one, else key 0).
        dormant_below: a head with importance below this is dormant (0.1).
        ablate_dormant: a second stage zeroes the dormant heads and reports the loss change.
    """

    sink_set: str = "auto"
    dormant_below: float = DEFAULT_DORMANT_BELOW
    ablate_dormant: bool = False


def _check(options: HeadsOptions) -> None:
    if options.sink_set not in SINK_SET_CHOICES:
        raise SinkscopeError(f"unknown --sink-set {options.sink_set!r}; use one of {', '.join(SINK_SET_CHOICES)}.")
    if not 0.0 <= options.dormant_below <= 1.0:
        raise SinkscopeError(f"--dormant-below must lie in [0, 1] (got {options.dormant_below}).")


def _check_source(options: HeadsOptions, source: Source) -> None:
    """A phantom sink set on a model whose config shows no phantom fails before the weights load."""
    from sinkscope.probes.head_importance import check_sink_set
    from sinkscope.sources import has_phantom_key

    has_phantom = has_phantom_key(source)
    if has_phantom is not None:
        check_sink_set(options.sink_set, has_phantom)


def _check_model(options: HeadsOptions, spec: ModelSpec) -> None:
    from sinkscope.probes.head_importance import check_sink_set

    check_sink_set(options.sink_set, spec.has_phantom)


def _probes(options: HeadsOptions, spec: ModelSpec) -> list[tuple[str, dict]]:
    return [("head_importance", {"sink_set": options.sink_set, "dormant_below": options.dormant_below})]


def _followup(options: HeadsOptions, spec: ModelSpec, probes: list) -> list[tuple[str, dict]]:
    """With ``--ablate-dormant``: zero the heads stage one found dormant (on every window)."""
    if not options.ablate_dormant:
        return []
    (importance,) = [p for p in probes if p.name == "head_importance"]
    heads = tuple(f"{layer}.{head}" for layer, head in importance.dormant_heads())
    return [("head_ablation", {"heads": heads})]


HEADS = register_command(Command(
    name="heads",
    summary="implicit gates, head importance, load imbalance (CV), dormant heads and their ablation",
    options=HeadsOptions,
    probes=_probes,
    check=_check,
    check_source=_check_source,
    check_model=_check_model,
    followup=_followup,
))
