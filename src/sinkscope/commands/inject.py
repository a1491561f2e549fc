"""``sinkscope inject``: value-read injection and exposure (SPEC.md "Value-read injection", "Quiet mass").

Probes: ``injection`` (one clean pass and one pass per junk type x cutoff x dose x draw over every
evaluation batch: the loss increase when every value head's quiet reads receive junk, before any
gate; the quiet set, m_h and transplanted junk from the batch's clean pass, ``--junk-source
clean``, or from the reads each layer receives under corruption, ``--junk-source corrupted``)
and ``exposure`` (from the clean pass of the same batches: the share of each attention row on the
quiet reads, per cutoff, and on the phantom, averaged over every query as Wang 2026's tables are). Wang 2026 §5.1, its appendix C and Tables 3, 9-11 and 13.

The evaluation batch is part of the measurement (structured junk is drawn across it), so it is an
option of its own, ``--eval-batch`` (recorded in the manifest), and replaces ``--batch-size``:
every batch holds ``eval_batch`` windows and is never halved. With structured junk ``--n-seqs``
must be a multiple of ``--eval-batch`` (>= 2), refused in one sentence before anything loads: a
short last batch would draw its "other context" junk from fewer windows (from its own window
alone, for one). Without structured junk the last batch may be short (no junk looks across
windows). Under torchrun each process's share of the windows must be whole batches, so that the
batches are those of a one-process run.

``--draws K`` repeats every condition with K seeded draws of the junk (draw d's generator is
seeded by (seed, batch, layer, d); ``probes/injection.draw_seed``): K corrupted passes per
condition and batch, one shared clean pass. The table gives the mean over draws and windows and
its standard error over windows (the ``se`` column, n = windows), and each draw's increase
(``inject_loss_delta_draw``) when K > 1.

``own-direction`` junk needs a projection-gate trainer checkpoint (``projgate``, ``sink+proj``);
anything else is refused in one sentence before the weights load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError, option
from sinkscope.data.junk import batch_problem
from sinkscope.commands.spec import Command, RunOptions, split_values

if TYPE_CHECKING:
    from sinkscope.capture.families import ModelSpec
    from sinkscope.models.resolve import Source

# the probe module imports torch: these are repeated here for the no-torch checks (tests keep them equal)
JUNK_TYPES = ("structured", "same-context", "gaussian", "random-direction", "own-direction")
DEFAULT_JUNK = ("structured", "same-context", "gaussian")
CUTOFFS = ("median", "q25")
DEFAULT_DOSES = (0.2, 0.4, 0.8, 1.6)
PROJECTION_GATE_VARIANTS = ("projgate", "sink+proj")
DEFAULT_EVAL_BATCH = 8  # Wang 2026: eight batches of eight windows
JUNK_SOURCES = ("clean", "corrupted")


#: the largest dose accepted (x the median read norm): far past any dose a seed uses, and short of
#: float32 overflow in the norms after the corrupted layer (1e30 gave NaN losses).
MAX_DOSE = 1e4


@dataclass
class InjectOptions(RunOptions):
    """``RunOptions`` plus the injection battery and the evaluation batch.

    Attributes:
        junk: junk types (structured, same-context, gaussian, random-direction, own-direction).
        cutoffs: quiet-read cutoffs (median, q25).
        doses: doses eps; the junk's norm is eps x the head's median read norm.
        eval_batch: windows per evaluation batch (structured junk draws across it); it is the
            run's batch size, never halved.
        exposure: also measure the quiet and phantom mass (the clean pass of the same batches).
        draws: seeded draws of the junk per condition (mean and standard error over windows).
        junk_source: ``clean`` (the quiet set, m_h and transplanted junk from the batch's clean
            pass, SPEC.md) or ``corrupted`` (from the reads each layer receives under corruption).
    """

    junk: tuple = DEFAULT_JUNK
    cutoffs: tuple = CUTOFFS
    doses: tuple = DEFAULT_DOSES
    eval_batch: int = DEFAULT_EVAL_BATCH
    exposure: bool = True
    draws: int = 1
    junk_source: str = "clean"

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.eval_batch, int) and self.eval_batch < 1:  # before the shared --batch-size check
            raise SinkscopeError(f"{option('eval_batch')} must be at least 1 (got {self.eval_batch}).")
        self.batch_size = self.eval_batch  # the batch is part of the measurement


def _check(options: InjectOptions) -> None:
    options.junk, options.cutoffs = split_values(options.junk), split_values(options.cutoffs)
    bad = [j for j in options.junk if j not in JUNK_TYPES]
    if bad or not options.junk:
        raise SinkscopeError(f"unknown {option('junk')} {bad[0] if bad else ''!r}; use one or more of {', '.join(JUNK_TYPES)}.")
    bad = [c for c in options.cutoffs if c not in CUTOFFS]
    if bad or not options.cutoffs:
        raise SinkscopeError(f"unknown {option('cutoffs')} {bad[0] if bad else ''!r}; use median, q25 or both.")
    raw = options.doses
    try:
        doses = tuple(float(d) for d in (split_values(raw) if isinstance(raw, str) or any(isinstance(d, str) for d in raw)
                                         else raw))
    except ValueError:
        raise SinkscopeError(f"{option('doses')} takes numbers such as 0.2,0.4,0.8,1.6 (got {raw!r}).") from None
    if not doses or any(not d >= 0 or d == float("inf") for d in doses):
        raise SinkscopeError(f"{option('doses')} takes finite numbers >= 0 (got {raw!r}).")
    if max(doses) > MAX_DOSE:
        raise SinkscopeError(f"{option('doses')} {max(doses):g} is out of range: a dose is the junk's norm in units of the "
                             f"head's median read norm (Wang 2026 uses 0.2 to 1.6), and above {MAX_DOSE:g} the "
                             "model's arithmetic overflows to NaN.")
    for name, values in (("--junk", options.junk), ("--cutoff", options.cutoffs), ("--doses", doses)):
        if len(set(values)) != len(values):
            raise SinkscopeError(f"{name} lists a value twice ({', '.join(map(str, values))}).")
    options.doses = doses
    if options.eval_batch < 1:
        raise SinkscopeError(f"{option('eval_batch')} must be at least 1 (got {options.eval_batch}).")
    options.batch_size = options.eval_batch
    if not isinstance(options.draws, int) or isinstance(options.draws, bool) or options.draws < 1:
        raise SinkscopeError(f"{option('draws')} must be at least 1 (got {options.draws}).")
    if options.junk_source not in JUNK_SOURCES:
        raise SinkscopeError(f"unknown {option('junk_source')} {options.junk_source!r}; use clean or corrupted.")
    problem = batch_problem(options.junk, options.eval_batch, options.n_seqs)
    if problem:
        raise SinkscopeError(problem)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # distributed.world(), without importing torch
    if world_size > 1:
        starts = [options.n_seqs * r // world_size for r in range(world_size)]
        if any(s % options.eval_batch for s in starts):
            raise SinkscopeError(f"under torchrun every process needs whole evaluation batches: make {option('n_seqs')} "
                                 f"({options.n_seqs}) a multiple of {option('eval_batch')} x processes "
                                 f"({options.eval_batch} x {world_size}).")


def _own_direction_error(what: str) -> SinkscopeError:
    return SinkscopeError(f"own-direction junk is the head's projection-gate direction w_h/||w_h||, which only "
                          f"projection-gate trainer checkpoints ({', '.join(PROJECTION_GATE_VARIANTS)}) have; "
                          f"{what} has none.")


def _variant(source: Source) -> str | None:
    from sinkscope.models.model_config import config_file_dict

    if source.kind != "checkpoint":
        return None
    return (config_file_dict(source) or {}).get("variant", "baseline")


def _check_source(options: InjectOptions, source: Source) -> None:
    if "own-direction" in options.junk and _variant(source) not in PROJECTION_GATE_VARIANTS:
        what = f"{source.location} (variant {_variant(source)})" if source.kind == "checkpoint" else source.location
        raise _own_direction_error(what)


def _check_sources(options: InjectOptions, sources: list[Source]) -> None:
    for source in sources:
        _check_source(options, source)


def _probes(options: InjectOptions, spec: ModelSpec) -> list[tuple[str, dict]]:
    params = {"junk": options.junk, "cutoffs": options.cutoffs, "doses": options.doses, "seed": options.seed,
              "eval_batch": options.eval_batch, "draws": options.draws, "junk_source": options.junk_source}
    if "own-direction" in options.junk:
        from sinkscope.models.resolve import resolve_source

        source = resolve_source(options.model, options.revision) if options.model else None
        if source is None or source.kind != "checkpoint":
            raise _own_direction_error(f"the model ({spec.family})")
        params["directions"] = str(source.path)
    probes = [("injection", params)]
    return probes + [("exposure", {})] if options.exposure else probes


INJECT = register_command(Command(
    name="inject",
    summary="value-read injection (loss increase per junk type, cutoff and dose) and exposure (quiet, phantom mass)",
    options=InjectOptions,
    probes=_probes,
    check=_check,
    check_source=_check_source,
    check_sources=_check_sources,
))
