"""Frequent Directions (``stats/sketch.py``): the guarantee it is used for, checked on explicit Gram matrices.

For X the rows added and B the sketch, Ghashami et al. (2016) give 0 <= u^T (X^T X - B^T B) u <= shrunk for
every unit u, i.e. the eigenvalues of X^T X - B^T B lie in [0, shrunk]; the reference is X^T X computed
directly in float64.
"""

from __future__ import annotations

import pytest
import torch

from sinkscope.stats.sketch import FrequentDirections, shrink


def _rows(n: int, F: int, seed: int) -> torch.Tensor:
    """(n, F) rows with a decaying spectrum and a mean (like a pre-activation)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(1, -1, F, dtype=torch.float64)
    return torch.randn(n, F, generator=g, dtype=torch.float64) * scales + 0.5


def _error_range(x: torch.Tensor, fd: FrequentDirections) -> tuple[float, float]:
    values = torch.linalg.eigvalsh(x.T @ x - fd.gram())
    return float(values.min()), float(values.max())


@pytest.mark.parametrize("rank", [4, 16, 32])
def test_the_sketch_understates_no_direction_by_more_than_its_bound(rank):
    x = _rows(700, 60, seed=rank)
    fd = FrequentDirections(rank)
    for batch in x.split(97):  # batches that do not line up with the rank
        fd.add(batch)
    low, high = _error_range(x, fd)
    scale = float(torch.linalg.matrix_norm(x, 2)) ** 2
    assert low >= -1e-9 * scale
    assert high <= fd.bound() * (1 + 1e-9) + 1e-9 * scale
    assert fd.rows.shape[0] < 2 * rank and fd.bound() > 0


def test_a_sketch_at_least_as_wide_as_the_rows_is_exact():
    x = _rows(300, 12, seed=1)
    fd = FrequentDirections(16)  # rank >= F: every shrink drops a zero singular value
    fd.add(x)
    torch.testing.assert_close(fd.gram(), x.T @ x, rtol=1e-10, atol=1e-8)
    assert fd.bound() < 1e-8 * float(torch.linalg.matrix_norm(x, 2)) ** 2


def test_merged_sketches_keep_the_guarantee_with_their_bounds_added():
    x = _rows(900, 50, seed=3)
    first, second = FrequentDirections(10), FrequentDirections(10)
    first.add(x[:400])
    second.add(x[400:])
    before = first.bound() + second.bound()
    first.merge(second)
    low, high = _error_range(x, first)
    assert low >= -1e-8 and high <= first.bound() * (1 + 1e-9)
    assert first.bound() >= before


def test_shrink_keeps_the_leading_directions_and_subtracts_the_next_squared_singular_value():
    rows = _rows(8, 6, seed=4)
    kept, delta = shrink(rows, 3)
    s = torch.linalg.svdvals(rows)  # descending
    assert float(delta) == pytest.approx(float(s[3] ** 2), rel=1e-10)
    torch.testing.assert_close(torch.linalg.svdvals(kept), (s[:3] ** 2 - s[3] ** 2).sqrt(), rtol=1e-8, atol=1e-10)
    same, zero = shrink(rows[:3], 3)
    assert same is not None and float(zero) == 0.0 and torch.equal(same, rows[:3])
