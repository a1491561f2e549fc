"""Where plans run (DESIGN.md "One plan, many executors").

``execute(plans)`` runs what ``plan.plan`` made: one plan alone through the pipeline
(``pipeline.run_plan``: load, run, write), several sharing a comparison one after the other into its
folder, then its page (``comparison.run_comparison``). Each plan writes its own run folder
atomically, so an executor carries only plans; this one runs them in this process. (Ray and SLURM
executors, issue 41, take the same plans.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from sinkscope.plan import Plan


def execute(plans: list[Plan], inputs=None, *, write: bool = True, log: Callable[[str], None] | None = None):
    """Run ``plans``: the :class:`~sinkscope.pipeline.Result` of a plan alone, or a comparison's page (its
    folder with figures off); None on data-parallel processes other than 0."""
    if len(plans) == 1 and plans[0].comparison is None:
        from sinkscope.pipeline import run_plan

        return run_plan(plans[0], inputs, write=write, log=log)
    from sinkscope.comparison import run_comparison

    return run_comparison(plans, log=log)


def written_path(outcome) -> Path | None:
    """What the command line prints: a run's folder, or a comparison's page."""
    return getattr(outcome, "path", outcome)
