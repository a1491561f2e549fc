"""stats/emergence.py: the emergence step of a synthetic series with a known step lies inside its interval, and
the interval narrows as the windows grow (issue 58)."""

from __future__ import annotations

import numpy as np
import pytest

from sinkscope.stats.emergence import emergence, first_crossing

STEPS = np.array([0, 250, 500, 750, 1000, 1250, 1500, 1750, 2000, 3000], dtype=float)
KNOWN = 1100.0  # where the true curve crosses half-way


def _series(n_windows: int, seed: int) -> np.ndarray:
    """(K, n): a logistic rise from 0.05 to 0.55 centred on KNOWN, plus per-window noise (sd 0.15) and a window
    effect shared by every checkpoint (windows differ, and the checkpoints are paired by window)."""
    rng = np.random.default_rng(seed)
    truth = 0.05 + 0.5 / (1 + np.exp(-(STEPS - KNOWN) / 150))  # (K,)
    window = rng.normal(0, 0.1, n_windows)  # (n,)
    return truth[:, None] + window[None, :] + rng.normal(0, 0.15, (STEPS.size, n_windows))


def test_the_crossing_is_interpolated_between_the_checkpoints_around_it():
    x, curve = np.array([0.0, 10.0, 20.0]), np.array([0.0, 0.2, 1.0])
    assert first_crossing(x, curve, 0.5, rising=True) == pytest.approx(10 + 0.3 / 0.8 * 10)
    assert first_crossing(x, curve[::-1], 0.5, rising=False) == pytest.approx(0.5 / 0.8 * 10)  # 1.0 -> 0.2
    assert np.isnan(first_crossing(x, curve, 2.0, rising=True))
    assert first_crossing(x, curve, -1.0, rising=True) == 0.0


def test_a_known_emergence_step_lies_inside_its_interval_and_the_interval_narrows_with_windows():
    widths = []
    for n_windows in (16, 256):
        found = emergence(STEPS, _series(n_windows, seed=n_windows))
        assert found.rising and found.n_windows == n_windows
        assert found.low <= KNOWN <= found.high, found
        assert found.low <= found.step <= found.high
        widths.append(found.high - found.low)
    assert widths[1] < widths[0] / 2, widths  # 16 times the windows: about a quarter of the width


def test_a_given_threshold_and_a_falling_metric():
    values = -_series(64, seed=1)
    found = emergence(STEPS, values, threshold=-0.3)
    assert not found.rising and found.threshold == -0.3 and found.low <= KNOWN <= found.high
    never = emergence(STEPS, _series(8, seed=2), threshold=5.0)
    assert np.isnan(never.step) and never.no_crossing == 1.0
    with pytest.raises(ValueError, match="increase"):
        emergence(STEPS[::-1], _series(8, seed=3))
