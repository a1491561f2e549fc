"""What ``mlp_pca``'s covariance will hold, decided and stated before it is allocated (issue 56, item 3).

The PCA of an MLP pre-activation F wide (``probes/mlp_pca.py``) needs the second moment X^T X of
every position. Held exactly it is F^2 float64 numbers per pass (a 70B model's F = 28,672: 6.6 GB
each); above a budget the probe keeps a Frequent Directions sketch instead (``stats/sketch.py``:
at most 2 l rows per sketch, l = ``sketch_rank``), whose error is bounded and reported. The
plan is made once, when the width is known, from:

- the **budget**: ``memory_gb`` when given, else half the memory free on the device the
  activations are on (``runtime.memory.free_memory``, what the runner holds a forward to: a CUDA
  device's free memory, the host's available RAM), measured when the run starts (the weights
  already loaded);
- the **peak** of each way (bytes, P passes, F the width, l the rank), counting everything the
  probe allocates:

  exact:   max(2 P, P + 4) F^2 x 8   while a batch runs its sums are held twice (the runner's
           rollback copy); when fitting, one pass's covariance, its eigenvectors and LAPACK's
           workspace (syevd: about 2 F^2) beside the P sums
  sketch:  max(4 l P + 4 l, 4 l P + 3 (4 l + 1)) F x 8   two sketches per pass (the other
           positions, position 0) of at most 2 l rows, never changed in place (so the rollback
           copy shares them), a batch's 4 l rows in flight; when fitting, a basis of 4 l + 1
           columns, its QR and the eigenvectors
  both:    6 P F x 8 (three sums per pass, held twice), 3 CHUNK_ROWS F x 8 (the rows read in
           float64 at a time), the scatter sample's other positions (P x scatter_windows x
           scatter_positions x F float32), and P x F float32 per window (position 0's rows,
           kept for the scatter and the separation: the only part that grows with the windows)

``covariance="auto"`` (the default) takes the exact way when its peak fits the budget, else the
sketch; ``"exact"`` and ``"sketch"`` force one. A plan that does not fit is one sentence before
anything is allocated. A decision of this project: the rule uses the budget, not the free memory
itself, so that the forward's own activations keep the other half.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sinkscope.errors import SinkscopeError, option
from sinkscope.runtime.memory import free_memory

#: rows of the pre-activation read in float64 at a time (bounds the working copy: 3 CHUNK_ROWS F doubles).
CHUNK_ROWS = 512
COVARIANCE_CHOICES = ("auto", "exact", "sketch")
GB = 1e9


def exact_bytes(width: int, passes: int) -> int:
    """The exact covariance's peak: max(2 P, P + 4) F^2 doubles (module docstring)."""
    return max(2 * passes, passes + 4) * width * width * 8


def sketch_bytes(width: int, passes: int, rank: int) -> int:
    """The sketch's peak: max(4 l P + 4 l, 4 l P + 3 (4 l + 1)) F doubles (module docstring)."""
    held = 4 * rank * passes
    return max(held + 4 * rank, held + 3 * (4 * rank + 1)) * width * 8


def common_bytes(width: int, passes: int, scatter_windows: int, scatter_positions: int) -> int:
    """What either way holds besides the second moment, before the first window (module docstring)."""
    return (6 * passes * width * 8 + 3 * CHUNK_ROWS * width * 8
            + passes * scatter_windows * scatter_positions * width * 4)


def per_window_bytes(width: int, passes: int) -> int:
    """Position 0's rows: P x F float32 per window."""
    return passes * width * 4


@dataclass(frozen=True)
class CovariancePlan:
    """How one ``mlp_pca`` probe holds its covariance, and what that costs (bytes)."""

    probe: str
    layer: int
    width: int
    passes: int
    method: str  # "exact" or "sketch"
    rank: int  # the sketch's l (kept for the record when exact)
    peak: int  # the chosen way's peak, plus what both ways hold
    per_window: int
    exact_peak: int
    budget: int | None
    budget_source: str

    def statement(self) -> str:
        """One line for the terminal: the way chosen, its memory and the budget it was held to."""
        budget = "no budget (the free memory is unknown)" if self.budget is None else (
            f"budget {self.budget / GB:.2f} GB: {self.budget_source}")
        grows = f"plus {_size(self.per_window)} per window (position 0's rows)"
        if self.method == "exact":
            return (f"{self.probe}: exact covariance of layer {self.layer}'s {self.width:,}-wide MLP, "
                    f"{_size(self.peak)} at most, {grows} ({budget}).")
        return (f"{self.probe}: layer {self.layer}'s MLP is {self.width:,} wide, the exact covariance would need "
                f"{_size(self.exact_peak)}; a streaming sketch of rank {self.rank} holds {_size(self.peak)} at most, "
                f"{grows} ({budget}; its error bound is the pca_sketch_bound row).")


def _size(n: int) -> str:
    return f"{n / GB:.2f} GB" if n >= 0.1 * GB else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"


def plan_covariance(probe: str, layer: int, width: int, passes: int, *, rank: int, scatter_windows: int,
                    scatter_positions: int, choice: str = "auto", memory_gb: float = 0.0,
                    device: torch.device = torch.device("cpu"), free: int | None = None) -> CovariancePlan:
    """The plan for one probe (module docstring), or one sentence when the way it must take does not fit.

    ``free`` replaces the measured free memory (tests); ``memory_gb`` > 0 replaces the budget.
    """
    if choice not in COVARIANCE_CHOICES:
        raise SinkscopeError(f"the {probe} parameter covariance takes {', '.join(COVARIANCE_CHOICES)}, not {choice!r}.")
    if memory_gb > 0:
        budget, source = int(memory_gb * GB), "memory_gb"
    else:
        free = free_memory(device) if free is None else free
        budget = None if free is None else free // 2
        source = f"half the {free / GB:.2f} GB free on {device}" if free is not None else ""
    base = common_bytes(width, passes, scatter_windows, scatter_positions)
    exact = exact_bytes(width, passes) + base
    sketch = sketch_bytes(width, passes, rank) + base
    fits = (lambda n: True) if budget is None else (lambda n: n <= budget)
    method = choice if choice != "auto" else "exact" if fits(exact) else "sketch"
    peak = exact if method == "exact" else sketch
    if not fits(peak):
        way = (f"the exact covariance of its {width:,}-wide MLP" if method == "exact"
               else f"even a sketch of rank {rank} of its {width:,}-wide MLP")
        hint = ("take covariance=auto or sketch" if method == "exact"
                else f"lower sketch_rank, {option('scatter_windows')} or {option('scatter_positions')}")
        raise SinkscopeError(f"{probe} at layer {layer}: {way} needs {_size(peak)}, more than its budget of "
                             f"{_size(budget)} ({source}); {hint}, raise memory_gb, or run on a device with more memory.")
    return CovariancePlan(probe, layer, width, passes, method, rank, peak, per_window_bytes(width, passes),
                          exact, budget, source)
