"""``median(host_select=True)``: the CPU's numpy selection gives the default paths' values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.probes import stats
from sinkscope.probes.stats import median


def _rows(kind: str, shape: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng(len(kind) + shape[1])
    if kind == "abs":
        return np.abs(rng.standard_normal(shape)).astype(np.float32)
    if kind == "lognormal":
        return rng.lognormal(0, 4, size=shape).astype(np.float32)
    return rng.integers(0, 3, size=shape).astype(np.float32)  # "ties": a block of ties at the median


@pytest.mark.parametrize("kind", ["abs", "lognormal", "ties"])
@pytest.mark.parametrize("shape", [(1, 16_385), (3, 100_000), (2, 400_001)])
def test_host_select_equals_numpy_and_the_default_path(kind, shape):
    data = _rows(kind, shape)
    x = torch.from_numpy(data)
    got = median(x, dtype=torch.float32, host_select=True)  # (R,)
    np.testing.assert_array_equal(got.numpy(), np.median(data, axis=-1))
    assert torch.equal(got, median(x, dtype=torch.float32))
    np.testing.assert_array_equal(median(x.double(), host_select=True).numpy(),
                                  np.median(data.astype(np.float64), axis=-1))


def test_host_select_nan_inf_moved_dims_and_inference_tensors():
    data = _rows("abs", (3, 50_000))
    data[0, 7], data[2, 9] = np.nan, np.inf
    with torch.inference_mode():
        x = torch.from_numpy(data).clone()
        got = median(x.t(), dim=0, host_select=True)  # (3,) along a moved dim
    np.testing.assert_array_equal(got.numpy(), np.median(data, axis=-1))
    assert np.isnan(got[0]) and np.isfinite(got[2])


def test_host_select_falls_back_when_the_bounds_miss(monkeypatch):
    data = _rows("lognormal", (1, 400_000))
    monkeypatch.setattr(stats, "BAND_SAMPLE", 16)  # bounds from 16 values: wide, rejected -> whole row
    np.testing.assert_array_equal(median(torch.from_numpy(data), host_select=True).numpy(), np.median(data, axis=-1))


def test_host_select_only_where_host_reads_are_free(monkeypatch):
    x = torch.from_numpy(_rows("abs", (1, 20_000)))
    assert stats._host_selectable(x, 20_000)
    assert not stats._host_selectable(x, 16_384)  # short rows: sorted, as by the default path
    assert not stats._host_selectable(x.bfloat16(), 20_000)  # 16-bit floats: one radix pass
    monkeypatch.setattr(stats, "CPU_BAND", False)  # as on an accelerator: no host reads
    assert not stats._host_selectable(x, 20_000)
    monkeypatch.setattr(stats, "_select_on_host", lambda *args: pytest.fail("host path taken"))
    np.testing.assert_array_equal(median(x, host_select=True).numpy(), np.median(x.numpy(), axis=-1))
