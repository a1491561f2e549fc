"""One plan through every stage: prepare -> load -> measure -> write (``run_plan``).

    prepare   run/prepare.py   the lock, the corpus, the device, the model's config, the lengths
    load      run/load.py      tokenizer, windows, model, spec, the capture's logits check
    measure   run/measuring.py   the probes over the windows (resume, torchrun, OOM back-off)
    write     run/write.py     table + manifest -> ``Result``; ``Result.save`` writes the run folder

A command (``commands/``) only declares its options, its probes and its checks; the CLI, the
Python API (``api.py``), recipes and sweeps reach here through ``run.plan.plan`` and
``run.dispatch.execute``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable

from sinkscope.commands.spec import seq_lens
from sinkscope.forward import distributed
from sinkscope.run.load import load
from sinkscope.run.measuring import _add_explorer, explorer_rider, measure, measure_lengths
from sinkscope.run.plan import Plan
from sinkscope.run.prepare import Inputs, prepare, Prepared
from sinkscope.run.result import Result
from sinkscope.run.write import _warn_non_finite, assemble, assemble_lengths


def run_plan(planned: Plan, inputs: Inputs | None = None, *, write: bool = True,
             log: Callable[[str], None] | None = None) -> Result | None:
    """Prepare, load, run and write one plan (``plan.plan``'s checks are not repeated)."""
    log = log or (lambda message: print(message, file=sys.stderr))
    with contextlib.ExitStack() as cleanup:  # the run folder's lock; a bridge's components set aside
        prepared = prepare(planned, inputs, write=write, cleanup=cleanup)
        return carry_out(prepared, write, log)


def carry_out(prepared: Prepared, write: bool, log, *, finish: bool = True) -> Result | None:
    """load -> run -> assemble -> (write) for a plan; ``finish`` ends the data-parallel group after."""
    if prepared.world_size > 1:
        distributed.init()
        if prepared.rank != 0:
            log = lambda message: None  # noqa: E731 - only process 0 talks
    loaded = load(prepared, log)
    lengths = seq_lens(prepared.options.seq_len) or ()
    riding, why_not = explorer_rider(prepared, loaded) if len(lengths) <= 1 else (None, None)
    finished = measure_lengths(prepared, loaded, lengths, log) if len(lengths) > 1 else measure(
        prepared, loaded, log, riders=() if riding is None else (riding.probe,))
    if finished is None:
        if finish:
            distributed.finish()
        return None
    result = assemble_lengths(prepared, loaded, finished) if len(lengths) > 1 else assemble(prepared, loaded, *finished)
    if len(lengths) <= 1:
        _add_explorer(prepared, loaded, result, log, riding, why_not)
    _warn_non_finite(result.table, log)
    if write:
        result.save(prepared.out_dir, overwrite=prepared.options.overwrite,
                    figures=prepared.options.figures)
        if prepared.progress_file is not None:
            prepared.progress_file.unlink(missing_ok=True)
        log(f"Wrote {prepared.out_dir}")
    if prepared.world_size > 1 and finish:
        distributed.finish()
    return result
