"""The exact median and quantile equal numpy's, on both selection paths (sort and radix)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sinkscope.probes import stats
from sinkscope.probes.stats import median, quantile, select_ranks
from sync_guard import HostSyncGuard


@pytest.fixture(params=["sort", "band", "radix", "radix-lanes"])
def path(request, monkeypatch):
    """Run a test with every row sorted, band-selected (the CPU's way), radix-selected (the
    accelerators' way), and radix-selected with the sub-histograms per row ("lanes") of a GPU."""
    monkeypatch.setattr(stats, "SORT_MAX", 10**9 if request.param == "sort" else 0)
    monkeypatch.setattr(stats, "CPU_BAND", request.param == "band")
    if request.param == "radix-lanes":
        lanes = stats._lanes
        monkeypatch.setattr(stats, "_lanes", lambda rows, n, device, bits=32: lanes(rows, n, torch.device("cuda"), bits))
    return request.param


def _samples(rng: np.random.Generator, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Float32 data with the awkward cases: heavy ties, negatives and zeros (+0/-0), spread scales."""
    return {
        "ties": rng.integers(-3, 4, size=shape).astype(np.float32),
        "normal": rng.standard_normal(shape).astype(np.float32),
        "lognormal": (np.exp(rng.normal(0, 4, size=shape)) * rng.choice([-1, 1], size=shape)).astype(np.float32),
        "signed zeros": rng.choice(np.array([0.0, -0.0, 1e-30, -1e-30, 5.0], dtype=np.float32), size=shape),
    }


@pytest.mark.parametrize("shape", [(1,), (2,), (3, 7), (4, 10), (1, 1001), (3, 1000)])
def test_median_matches_numpy(path, shape):
    rng = np.random.default_rng(sum(shape))
    dims = range(-1, -len(shape) - 1, -1) if path == "sort" else [-1]  # moved dims: test_median_along_every_dim
    for name, data in _samples(rng, shape).items():
        for dim in dims:
            got = median(torch.from_numpy(data), dim=dim)
            expected = np.median(data, axis=dim)
            assert got.dtype == torch.float32 and got.shape == expected.shape
            np.testing.assert_array_equal(got.numpy(), expected, err_msg=f"{name}, dim {dim}")


def test_median_along_every_dim_of_a_3d_tensor(monkeypatch):
    monkeypatch.setattr(stats, "SORT_MAX", 0)  # radix everywhere: reshapes and moved dims
    monkeypatch.setattr(stats, "CPU_BAND", False)
    data = np.random.default_rng(2).standard_normal((2, 3, 24)).astype(np.float32)
    for dim in (0, 1, 2, -1):
        np.testing.assert_array_equal(median(torch.from_numpy(data), dim=dim).numpy(), np.median(data, axis=dim))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (3, 7), (2, 33), (1, 1000)])
def test_select_ranks_equal_sorted_numpy(path, shape, dtype):
    rng = np.random.default_rng(len(shape))
    for name, data in _samples(rng, shape).items():
        x = data.astype(dtype)
        for dim in [-1]:
            n = shape[dim]
            ranks = sorted({0, n // 3, n // 2, n - 1})
            expected = np.take(np.sort(x, axis=dim), ranks, axis=dim)  # ranks along dim
            got = select_ranks(torch.from_numpy(x), ranks, dim=dim)  # (..., K)
            np.testing.assert_array_equal(got.numpy(), np.moveaxis(expected, dim, -1), err_msg=f"{name}, dim {dim}")


@pytest.mark.parametrize("path_name", ["sort", "radix"])
@pytest.mark.parametrize("shape", [(1,), (3, 7), (2, 11)])
def test_quantile_matches_numpy_linear(monkeypatch, path_name, shape):
    monkeypatch.setattr(stats, "SORT_MAX", 10**9 if path_name == "sort" else 0)
    monkeypatch.setattr(stats, "CPU_BAND", False)
    rng = np.random.default_rng(len(shape))
    for name, data in _samples(rng, shape).items():
        x = data.astype(np.float64)  # float64: numpy's interpolation arithmetic, bit for bit
        qs = [0.0, 0.25, 0.5, 0.7, 0.999, 1.0]
        for dim in range(len(shape)):
            got = quantile(torch.from_numpy(x), qs, dim=dim)  # (6, ...)
            np.testing.assert_array_equal(got.numpy(), np.quantile(x, qs, axis=dim), err_msg=f"{name}, dim {dim}")


def test_quantile_float32_and_several_q(path):
    data = np.random.default_rng(3).standard_normal((6, 301)).astype(np.float32)
    qs = [0.25, 0.5, 0.75]
    got = quantile(torch.from_numpy(data), qs, dim=-1)
    assert got.shape == (3, 6)
    np.testing.assert_allclose(got.numpy(), np.quantile(data, qs, axis=-1), rtol=1e-6, atol=0)
    np.testing.assert_array_equal(quantile(torch.from_numpy(data), torch.tensor(0.25)).numpy(),
                                  got[0].numpy())
    with pytest.raises(ValueError):
        quantile(torch.from_numpy(data), 1.5)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_median_of_other_float_dtypes(path, dtype, rows):
    """Half types: the two middle values are exact; their mean is taken in ``dtype``."""
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.standard_normal((rows, 2000)) * 50).to(dtype)  # (rows, 2000): many repeats in bf16
    as_float = x.double().numpy()  # the same values, exactly
    lower = np.sort(as_float, axis=-1)[:, 999]
    upper = np.sort(as_float, axis=-1)[:, 1000]
    np.testing.assert_array_equal(select_ranks(x, [999, 1000]).double().numpy(), np.stack([lower, upper], -1))
    np.testing.assert_array_equal(median(x, dtype=torch.float64).numpy(), np.median(as_float, axis=-1))
    same_dtype = median(x)
    assert same_dtype.dtype == dtype
    np.testing.assert_array_equal(same_dtype.numpy() if dtype == torch.float64 else same_dtype.float().numpy(),
                                  torch.from_numpy((lower + upper) / 2).to(dtype).double().numpy())


def test_nan_rows_give_nan_like_numpy(path):
    data = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    data[1, 17] = np.nan
    data[2, :] = np.inf
    got = median(torch.from_numpy(data))
    np.testing.assert_array_equal(got.numpy(), np.median(data, axis=-1))  # [m, nan, inf]
    assert np.isnan(got[1]) and got[2] == np.inf


@pytest.mark.parametrize("dtype, inf_word", [(torch.bfloat16, 0x7F80), (torch.float16, 0x7C00)])
def test_half_precision_nan_from_the_histogram(path, dtype, inf_word):
    """Radix on 16-bit floats reads NaN off the top-word histogram: every NaN pattern, not inf."""
    base = torch.arange(1, 41, dtype=torch.int16).view(1, 40).repeat(5, 1)  # (5, 40) small positive floats
    specials = [inf_word + 1, 0x7FFF, (0x8000 + inf_word + 1) - 0x10000, -1, inf_word]  # NaNs (+/-, extremes), +inf
    for row, word in enumerate(specials):
        base[row, 7] = word
    base[4, 8] = (0x8000 + inf_word) - 0x10000  # -inf beside +inf: no NaN in that row
    x = base.view(dtype)  # (5, 40)
    got = median(x, dtype=torch.float64)
    expected = np.median(x.double().numpy(), axis=-1)
    np.testing.assert_array_equal(got.numpy(), expected)
    assert np.isnan(expected[:4]).all() and np.isfinite(expected[4])


@pytest.mark.parametrize("band", [True, False])
def test_large_rows_equal_numpy(monkeypatch, band):
    """Rows the size of a layer's |h| (T*C values): the CPU's band path and the radix path."""
    monkeypatch.setattr(stats, "CPU_BAND", band)
    rng = np.random.default_rng(11)
    data = np.abs(rng.standard_normal((2, 1_000_001)).astype(np.float32))  # odd count
    data[0, :1000] = np.median(data[0])  # a block of ties at the median itself
    x = torch.from_numpy(data)
    np.testing.assert_array_equal(median(x).numpy(), np.median(data, axis=-1))
    np.testing.assert_array_equal(median(x[:, 1:]).numpy(), np.median(data[:, 1:], axis=-1))  # even count
    np.testing.assert_array_equal(quantile(x.double(), 0.25).numpy(),
                                  np.quantile(data.astype(np.float64), 0.25, axis=-1))


def test_band_path_selects_within_a_small_band_and_falls_back_when_the_bounds_miss(monkeypatch):
    rows_seen = []
    radix = stats._select_by_radix
    monkeypatch.setattr(stats, "_select_by_radix", lambda rows, ranks: rows_seen.append(rows.shape[1]) or radix(
        rows, ranks))
    data = np.random.default_rng(5).lognormal(size=(1, 400_000)).astype(np.float32)
    x = torch.from_numpy(data)
    np.testing.assert_array_equal(median(x).numpy(), np.median(data, axis=-1))
    assert len(rows_seen) == 1 and 16_384 < rows_seen[0] < 400_000 // 10  # one selection, in a band of <10%
    rows_seen.clear()
    monkeypatch.setattr(stats, "BAND_SAMPLE", 16)  # bounds from 16 values: wide, rejected -> whole row
    np.testing.assert_array_equal(median(x).numpy(), np.median(data, axis=-1))
    assert rows_seen == [400_000]
    rows_seen.clear()
    monkeypatch.setattr(stats, "BAND_SAMPLE", 16_384)
    monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: torch.zeros(16_384, dtype=torch.long))
    np.testing.assert_array_equal(median(x).numpy(), np.median(data, axis=-1))  # a sample of one value: a miss
    assert rows_seen == [400_000]


def test_lanes_per_device():
    assert stats._lanes(1, 4096, torch.device("cpu")) == 1  # a serial loop: one histogram
    assert stats._lanes(1, 4096, torch.device("cuda")) == 16
    assert stats._lanes(2, 4094, torch.device("cuda")) == 2  # 8 lanes would not divide 4094
    assert stats._lanes(1, 4095, torch.device("cuda")) == 1
    assert stats._lanes(64, 4096, torch.device("cuda")) == 1  # many rows spread the adds already
    # 16-bit values: 256 lanes per window (issue 42: the median of 32k x 2,048 bf16 |h| 2.4x faster on an H200)
    assert stats._lanes(1, 4096, torch.device("cuda"), bits=16) == 256
    assert stats._lanes(4, 4096, torch.device("cuda"), bits=16) == 64
    assert stats._lanes(1, 4096, torch.device("cuda"), bits=32) == 16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_radix_select_is_exact_with_many_lanes(monkeypatch, dtype):
    """The accelerator's lane counts, forced on the CPU: every rank equals the sorted row's."""
    monkeypatch.setattr(stats, "_lanes", lambda rows, n, device, bits=32: 256 if bits == 16 else 16)
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 8192, generator=g) * 3).to(dtype)  # (2, 8192), ties aplenty in 16 bits
    x[0, :5] = 300.0
    ranks = [0, 4095, 4096, 8191]
    expected = torch.sort(x, dim=-1).values[:, ranks]  # (2, 4)
    assert torch.equal(stats._select_by_radix(x, ranks), expected)


def test_no_host_sync_except_on_the_cpu_band_path(path):
    x = torch.randn(4, 3000)  # (4, 3000)
    with HostSyncGuard() as guard:
        median(x, dim=-1)
        median(x.bfloat16(), dim=0, dtype=torch.float32)
        quantile(x, 0.25, dim=-1)
    if path == "band":  # reads counts back on purpose: on a CPU that is no synchronisation
        assert guard.count > 0
    else:
        assert guard.count == 0, guard.report()


def test_errors_are_clear():
    with pytest.raises(TypeError, match="floating"):
        median(torch.arange(5))
    with pytest.raises(ValueError, match="empty"):
        median(torch.zeros(3, 0))
