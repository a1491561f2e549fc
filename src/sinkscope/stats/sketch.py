"""A streaming sketch of a second-moment matrix in O(rank x F) memory: Frequent Directions (issue 56, item 3).

Liberty, "Simple and deterministic matrix sketching" (KDD 2013), in the form of Ghashami, Liberty,
Phillips and Woodruff, "Frequent Directions: simple and deterministic matrix sketching" (SIAM J.
Comput. 45, 2016), Algorithm 2. Rows x_i (F wide) arrive in batches; the sketch keeps at most
``2 l`` rows B (l = ``rank``) and, whenever it is full, *shrinks* it to l rows:

    B = U S V^T (its SVD, singular values s_1 >= s_2 >= ...),  delta = s_{l+1}^2
    B <- diag(sqrt(max(s_i^2 - delta, 0)))_{i <= l} V_{:l}^T,      shrunk <- shrunk + delta

so that, for X the stacked rows seen and every unit vector u (the guarantee this module is for):

    0 <= u^T (X^T X - B^T B) u <= shrunk <= ||X - X_k||_F^2 / (l - k)   for every k < l

``shrunk`` is kept, so a caller can state the bound it got. Two sketches of disjoint rows merge
by stacking and shrinking (the bound adds: the sketch is mergeable, Ghashami et al. §3), so
shares of a data-parallel run combine. The shrink is computed from the Gram matrix B B^T
(2l x 2l, eigh) instead of an SVD of the (2l, F) rows: B's right singular vectors are
U_i^T B / s_i, so the shrunk row i is U_i^T B sqrt(1 - delta / s_i^2), with no division by a
small singular value. Float64 throughout (the caller's dtype).
"""

from __future__ import annotations

import torch
from torch import Tensor


def shrink(rows: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """``rows`` (m, F) -> (at most ``rank`` rows, delta): the Frequent Directions shrink (module docstring).

    ``delta`` (a 0-d tensor on the rows' device: no host sync) is the (rank+1)-th largest squared
    singular value (0 when m <= rank: nothing is lost).
    """
    m = rows.shape[0]
    if m <= rank:
        return rows, rows.new_zeros(())
    gram = rows @ rows.T  # (m, m)
    values, vectors = torch.linalg.eigh(gram)  # ascending
    values, vectors = values.flip(0).clamp_min(0), vectors.flip(1)  # descending
    delta = values[rank]  # ()
    kept = values[:rank]  # (rank,) squared singular values
    scale = torch.where(kept > 0, (1 - delta / kept.clamp_min(torch.finfo(kept.dtype).tiny)).clamp_min(0).sqrt(),
                        torch.zeros_like(kept))  # (rank,)
    return (vectors[:, :rank].T @ rows) * scale[:, None], delta  # (rank, F)


class FrequentDirections:
    """Rows B with B^T B <= X^T X <= B^T B + shrunk I for the rows X added (module docstring)."""

    def __init__(self, rank: int, rows: Tensor | None = None, shrunk: float | Tensor = 0.0):
        if rank < 1:
            raise ValueError("rank must be at least 1")
        self.rank = rank
        self.rows = rows  # (m, F), m < 2 rank; None before the first row
        self.shrunk = shrunk  # the summed deltas: a float, or a 0-d tensor where the rows are

    def add(self, x: Tensor) -> None:
        """Fold in rows ``x`` (n, F), ``rank`` at a time (the buffer never holds more than 2 rank + rank rows)."""
        for chunk in x.split(self.rank):
            self.rows = chunk.clone() if self.rows is None else torch.cat([self.rows.to(chunk), chunk])
            if self.rows.shape[0] >= 2 * self.rank:
                self.rows, delta = shrink(self.rows, self.rank)
                self.shrunk = self.shrunk + delta

    def merge(self, other: "FrequentDirections") -> None:
        """Fold in a sketch of other rows: stack, then shrink until at most 2 rank rows remain (bounds add)."""
        if other.rows is not None:
            self.add(other.rows)
        self.shrunk = self.shrunk + (other.shrunk.to(self.rows) if torch.is_tensor(other.shrunk) else other.shrunk)

    def bound(self) -> float:
        """``shrunk`` as a number: no direction's X^T X is understated by more."""
        return float(self.shrunk)

    def gram(self) -> Tensor:
        """B^T B (F, F): for tests and small F only."""
        return self.rows.T @ self.rows
