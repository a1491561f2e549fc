"""``sinkscope heads``: implicit gates, head importance, load imbalance and dormant heads (Fu et al. 2026).

Probes: ``head_importance`` (SPEC.md "Implicit gate and head importance"; formulas shared with
the trainer in ``sinkscope.stats.gates``) and, with ``--ablate-dormant``, ``head_ablation``.

How the dormant heads are chosen before they are ablated: the run has two stages over the same
windows (the pipeline's ``followup``). Stage one measures the importance of every head on *all*
the windows (merged over processes under torchrun) and, in the same clean pass, the clean loss;
the dormant set is then fixed (Imp^{l,h} < ``--dormant-below``) and recorded in the manifest as
the ``head_ablation`` probe's ``heads``, with stage one's clean loss (``clean_sum``, ``clean_n``);
stage two runs every window once more with those heads' outputs zeroed at ``hook_z`` and reports
the loss change. So the ablated set never depends on batch order or batch size, and the clean
loss is measured on the same windows, in the same batches, as the ablated one. The cost is two
forward passes per window instead of one (the first with every position's logits), only when
``--ablate-dormant`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError, option
from sinkscope.commands.spec import Command, RunOptions

if TYPE_CHECKING:
    from sinkscope.capture.families import ModelSpec
    from sinkscope.models.resolve import Source

#: ``--sink-set`` values; ``auto`` is the model's own (its phantom if it has one, else key 0).
SINK_SET_CHOICES = ("auto", "first", "phantom", "first+phantom", "data")  # = ("auto",) + gates.SINK_SETS
#: Fu et al. 2026 leaves the dormancy threshold open (probes/head_importance.py DORMANT_BELOW).
DEFAULT_DORMANT_BELOW = 0.1


@dataclass
class HeadsOptions(RunOptions):
    """``RunOptions`` plus the sink set, the dormancy threshold and the ablation switch.

    Attributes:
        sink_set: ``auto`` | ``first`` | ``phantom`` | ``first+phantom`` | ``data``: what A_sink
            sums (``auto``: the phantom where the model has one, else key 0; ``data``: Fu et al. 2026
            §6.2's keys of high attention and low value norm, plus any phantom).
        sink_attention: ``data``: a key's mean attention alpha_j must exceed this (0.3).
        sink_value_ratio: ``data``: its value norm must be below this times the median (0.5).
        sink_min_queries: ``data``: at least this many queries must have scored it (16; capped at half
            the window's queries).
        dormant_below: a head with importance below this is dormant (0.1).
        ablate_dormant: a second stage zeroes the dormant heads and reports the loss change.
    """

    sink_set: str = "auto"
    sink_attention: float = 0.3
    sink_value_ratio: float = 0.5
    sink_min_queries: int = 16
    dormant_below: float = DEFAULT_DORMANT_BELOW
    ablate_dormant: bool = False


def _check(options: HeadsOptions) -> None:
    if options.sink_set not in SINK_SET_CHOICES:
        raise SinkscopeError(f"unknown {option('sink_set')} {options.sink_set!r}; use one of {', '.join(SINK_SET_CHOICES)}.")
    if not 0.0 <= options.dormant_below <= 1.0:
        raise SinkscopeError(f"{option('dormant_below')} must lie in [0, 1] (got {options.dormant_below}).")
    if not 0.0 <= options.sink_attention <= 1.0:
        raise SinkscopeError(f"{option('sink_attention')} must lie in [0, 1] (got {options.sink_attention}).")
    if not options.sink_value_ratio > 0:
        raise SinkscopeError(f"{option('sink_value_ratio')} must be positive (got {options.sink_value_ratio}).")
    if not isinstance(options.sink_min_queries, int) or options.sink_min_queries < 1:
        raise SinkscopeError(f"{option('sink_min_queries')} must be at least 1 (got {options.sink_min_queries}).")


def _check_source(options: HeadsOptions, source: Source) -> None:
    """A phantom sink set on a model whose config shows no phantom fails before the weights load."""
    from sinkscope.probes.head_importance import check_sink_set
    from sinkscope.models.model_config import has_phantom_key

    has_phantom = has_phantom_key(source)
    if has_phantom is not None:
        check_sink_set(options.sink_set, has_phantom)


def _check_model(options: HeadsOptions, spec: ModelSpec) -> None:
    from sinkscope.probes.head_importance import check_sink_set

    check_sink_set(options.sink_set, spec.has_phantom)


def _probes(options: HeadsOptions, spec: ModelSpec) -> list[tuple[str, dict]]:
    data = {"sink_attention": options.sink_attention, "sink_value_ratio": options.sink_value_ratio,
            "sink_min_queries": options.sink_min_queries} \
        if options.sink_set == "data" else {}
    loss = {"clean_loss": True} if options.ablate_dormant else {}  # the second stage's clean loss
    return [("head_importance", {"sink_set": options.sink_set, "dormant_below": options.dormant_below, **data,
                                 **loss})]


def _followup(options: HeadsOptions, spec: ModelSpec, probes: list) -> list[tuple[str, dict]]:
    """With ``--ablate-dormant``: zero the heads stage one found dormant (on every window)."""
    if not options.ablate_dormant:
        return []
    (importance,) = [p for p in probes if p.name == "head_importance"]
    heads = tuple(f"{layer}.{head}" for layer, head in importance.dormant_heads())
    return [("head_ablation", {"heads": heads, **importance.clean_loss_params()})]


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
