"""Which evaluation batches can carry a junk battery (SPEC.md "Value-read injection"); torch-free.

One definition shared by ``commands/inject.py`` (its option check runs before torch is imported)
and ``probes/injection.py`` (the probe's own check of the batches the runner will make).
"""

from __future__ import annotations

from sinkscope.errors import option


def batch_problem(junk: tuple, eval_batch: int, n_windows: int) -> str | None:
    """Why batches of ``eval_batch`` over ``n_windows`` windows cannot carry this junk, as a sentence, or None.

    Structured junk comes from the other windows of the evaluation batch, so every batch must hold
    ``eval_batch >= 2`` windows; a last batch with fewer (one window: same-window junk under the
    name structured) would change what is measured. Other junk types never look across windows.
    """
    if "structured" not in junk:
        return None
    if eval_batch < 2:
        return ("structured junk is drawn from the other windows of its evaluation batch, so it needs "
                f"{option('eval_batch')} 2 or more (got {eval_batch}); use a larger {option('eval_batch')}, or other {option('junk')}.")
    if n_windows % eval_batch:
        lower, upper = n_windows // eval_batch * eval_batch, (n_windows // eval_batch + 1) * eval_batch
        short = (f"{n_windows} windows leave a last batch of {n_windows % eval_batch}" if lower
                 else f"there are only {n_windows} windows")
        return (f"structured junk is drawn from the other windows of its evaluation batch, so every batch needs "
                f"{option('eval_batch')} ({eval_batch}) windows, but {short}; use {option('n_seqs')} "
                f"{f'{lower} or {upper}' if lower else upper}, or an {option('eval_batch')} that divides {n_windows}.")
    return None
