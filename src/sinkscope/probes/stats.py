"""Exact order statistics shared by probes: the median and quantiles, numpy's definitions.

For the ``n`` values along ``dim``, sorted ascending as ``x_(0) <= ... <= x_(n-1)``:

    median     = x_(m)                              n odd, m = (n - 1) / 2
               = (x_(m) + x_(m+1)) / 2              n even, m = n / 2 - 1
    quantile q = x_(j) + (h - j) (x_(j+1) - x_(j))  h = (n - 1) q, j = floor(h)

(``numpy.median`` and ``numpy.quantile(..., method="linear")``, its default). A row holding a
NaN gives NaN, as in numpy. ``torch.median`` returns the lower middle value and
``torch.quantile`` refuses more than 2**24 values, hence these.

No ``kthvalue`` (on CUDA it selects with one thread block per row: 757 of 791 ms of a Llama-1B
forward in the H200 profile) and, on accelerators, no host synchronisation. Exact selection:

- short rows (``n <= SORT_MAX``) or many rows: one batched ``torch.sort``;
- long rows on an accelerator: a radix select on the bit patterns, 16 bits at a time. Count
  each value's top 16-bit word (a histogram by ``index_add_``; each row is split into ``lanes``
  sub-histograms so that a popular word is not one hot atomic address), find the word whose
  cumulative count passes the rank, then count the next word of the values that share the
  words chosen so far, and so on. bfloat16/float16 take one histogram pass, float32 two,
  float64 four; every step has a fixed shape, so nothing waits on the device;
- long rows of float32/float64 on the CPU (``CPU_BAND``): a seeded sample places bounds around
  the ranks, the few percent of values between them are gathered and radix-selected (falling
  back to the whole row if the bounds miss). Gathering has a data-dependent size, which costs
  nothing on a CPU; there it is 2.5-5x faster than kthvalue and 3x faster than the two-level
  radix select (float32, 1-24M values, one thread);
- ``median(..., host_select=True)`` (massive_activation's |h|): the same band on the CPU, in
  numpy, the band's ranks found by ``numpy.partition`` (introselect) rather than a radix
  select, whose 65,536-bin histograms are most of the band path's time on a layer's |h|: 3-10x
  faster on one thread, 10-40x on two busy threads (float32, 0.2-4.7M values).

Every path returns exact bit patterns, so all agree (tests: numpy, ties, signed zeros, NaN,
every path forced).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

#: rows with at most this many values are sorted; longer rows are selected.
SORT_MAX = 16_384
#: more rows than this are sorted too (the radix path keeps 65,536 bins per row).
RADIX_MAX_ROWS = 64
#: on the CPU, long rows of 32/64-bit floats first narrow the ranks to a band found from a
#: sample (data-dependent sizes cost no synchronisation there); False: the radix select, as on
#: accelerators (16-bit floats always take it: one histogram pass, faster than the band).
CPU_BAND = True
#: values drawn (seeded, with replacement) to place the band.
BAND_SAMPLE = 8_192
#: bits per radix digit (65,536 bins per histogram).
DIGIT_BITS = 16
_BINS = 1 << DIGIT_BITS
#: (bit-pattern integer dtype, bits) for each floating dtype the radix path reads directly.
_BITS = {torch.bfloat16: (torch.int16, 16), torch.float16: (torch.int16, 16),
         torch.float32: (torch.int32, 32), torch.float64: (torch.int64, 64)}


def median(x: Tensor, dim: int = -1, *, dtype: torch.dtype | None = None, host_select: bool = False) -> Tensor:
    """The exact median along ``dim``: the middle value, or the mean of the two middle values.

    Args:
        x: floating tensor (any shape; ``x.shape[dim] >= 1``).
        dim: the dimension reduced.
        dtype: dtype of the result and of the mean of the two middle values (default
            ``x.dtype``); e.g. ``torch.float32`` for a bfloat16 ``x`` averages the two middle
            bfloat16 values in float32.
        host_select: on the CPU, select long rows of 32/64-bit floats with numpy
            (:func:`_select_on_host`: introselect within a sampled band) rather than the
            band-and-radix path; the same values, several times faster for a layer's |h|.
            Ignored elsewhere (accelerators, 16-bit floats, short rows, ``CPU_BAND`` off).

    Returns:
        ``x.shape`` without ``dim``. NaN where the row holds a NaN.
    """
    n = x.shape[dim]
    low, high = (n - 1) // 2, n // 2
    if host_select and _host_selectable(x, n):
        values = _select_on_host(x, dim, sorted({low, high}))  # (..., 1 or 2)
    else:
        values = _select(x, dim, sorted({low, high}))  # (..., 1 or 2)
    out_dtype = dtype or x.dtype
    lower = values[..., 0].to(out_dtype)
    if low == high:
        return lower
    return (lower + values[..., 1].to(out_dtype)) / 2


def quantile(x: Tensor, q: float | Sequence[float] | Tensor, dim: int = -1, *,
             dtype: torch.dtype | None = None) -> Tensor:
    """The exact ``q``-quantile along ``dim`` with numpy's default linear interpolation.

    Args:
        x: floating tensor (``x.shape[dim] >= 1``).
        q: a probability in [0, 1], or a sequence/1-D tensor of them (a tensor is read on the
            host: keep it on the CPU, or pass floats, to stay free of device syncs).
        dim: the dimension reduced.
        dtype: dtype of the result and of the interpolation (default ``x.dtype``).

    Returns:
        ``x.shape`` without ``dim`` for a scalar ``q``; ``(len(q),) + that`` for a sequence
        (as numpy). NaN where the row holds a NaN.
    """
    scalar = isinstance(q, (int, float)) or (isinstance(q, Tensor) and q.dim() == 0)
    qs = [float(q)] if scalar else [float(v) for v in (q.tolist() if isinstance(q, Tensor) else q)]
    if any(not 0.0 <= v <= 1.0 for v in qs):
        raise ValueError(f"quantiles must be in [0, 1], got {qs}")
    n = x.shape[dim]
    plan = []  # (j, j + 1 clipped, t) per q, numpy's h = (n - 1) q
    for v in qs:
        h = (n - 1) * v
        j = min(int(h), n - 1)
        plan.append((j, min(j + 1, n - 1), h - j))
    ranks = sorted({r for j, k, _ in plan for r in (j, k)})
    values = _select(x, dim, ranks)  # (..., len(ranks))
    out_dtype = dtype or x.dtype
    column = {r: values[..., i].to(out_dtype) for i, r in enumerate(ranks)}
    results = []
    for j, k, t in plan:
        a, b = column[j], column[k]
        diff = b - a
        results.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)  # numpy's _lerp: from the nearer end
    return results[0] if scalar else torch.stack(results)


def select_ranks(x: Tensor, ranks: Sequence[int], dim: int = -1) -> Tensor:
    """The values of the given 0-based ranks along ``dim`` (as ``sort(x, dim)[..., ranks]``).

    Returns ``x.shape`` without ``dim`` plus a last axis of ``len(ranks)``, in ``x.dtype``;
    NaN where the row holds a NaN.
    """
    return _select(x, dim, list(ranks))


def _select(x: Tensor, dim: int, ranks: list[int]) -> Tensor:
    """Rank values along ``dim``: (..., len(ranks)) in x's dtype; rows with a NaN give NaN."""
    if not x.is_floating_point():
        raise TypeError(f"expected a floating tensor, got {x.dtype}")
    n = x.shape[dim]
    if n == 0:
        raise ValueError("cannot take an order statistic of an empty dimension")
    if any(not 0 <= r < n for r in ranks):
        raise ValueError(f"ranks {ranks} out of range for {n} values")
    moved = x.movedim(dim, -1)  # (..., n)
    batch = moved.shape[:-1]
    rows = moved.reshape(-1, n)  # (R, n)
    if n <= SORT_MAX or rows.shape[0] > RADIX_MAX_ROWS or rows.dtype not in _BITS:
        out = _select_by_sort(rows, ranks)  # (R, K)
    elif rows.device.type == "cpu" and CPU_BAND and _BITS[rows.dtype][1] > 16:
        out = _select_by_band(rows, ranks)  # (R, K)
    else:
        out = _select_by_radix(rows, ranks)  # (R, K)
    return out.reshape(*batch, len(ranks))


def _select_by_sort(rows: Tensor, ranks: list[int]) -> Tensor:
    """(R, n) -> (R, K): one batched sort (NaN sorts last: a row holding one gives NaN)."""
    ordered = torch.sort(rows, dim=-1).values  # (R, n)
    picked = torch.stack([ordered[:, r] for r in ranks], dim=-1)  # (R, K) slices: no host index copied in
    return picked.masked_fill(ordered[:, -1:].isnan(), float("nan"))  # (R, K)


def _select_by_band(rows: Tensor, ranks: list[int]) -> Tensor:
    """(R, n) -> (R, K) on the CPU: radix-select within a band of values that holds the ranks.

    A seeded random sample places two bounds around the ranks' quantiles, far enough apart (six
    standard deviations of a sample quantile) that they nearly always bracket them; the values
    between the bounds are gathered (a few percent of the row) and selected exactly, the
    counts below the lower bound shifting the ranks. If the bounds miss, the whole row is
    radix-selected: the answer is exact either way, only the time differs.
    """
    R, n = rows.shape
    m = min(BAND_SAMPLE, n)
    generator = torch.Generator().manual_seed(0)
    low_rank, high_rank = min(ranks), max(ranks)
    spread = 6 * math.sqrt(m * 0.25) + 2  # six sd of a sample quantile (largest at p = 1/2), in sample ranks
    first = max(0, math.floor(low_rank * m / n - spread))
    last = min(m - 1, math.ceil((high_rank + 1) * m / n + spread))
    out = []
    for row in rows:  # (n,)
        total = row.sum()  # (): finite unless the row holds a NaN or an infinity (a cheaper test first)
        if not bool(torch.isfinite(total)) and bool(torch.isnan(row).any()):
            out.append(torch.full((1, len(ranks)), float("nan"), dtype=rows.dtype))
            continue
        sample = torch.sort(row[torch.randint(0, n, (m,), generator=generator)]).values  # (m,)
        low, high = sample[first], sample[last]  # (), ()
        under = row < low  # (n,)
        below = int(under.sum())
        band = row[(row <= high) ^ under]  # (b,) low <= x <= high; NaN never in it
        if below <= low_rank and high_rank < below + band.numel() and band.numel() <= n // 4:
            local = [r - below for r in ranks]
            picked = _select_by_radix(band[None], local) if band.numel() > SORT_MAX else \
                _select_by_sort(band[None], local)  # (1, K)
        else:
            picked = _select_by_radix(row[None], ranks)  # (1, K)
        out.append(picked)
    return torch.cat(out)  # (R, K)


def _host_selectable(x: Tensor, n: int) -> bool:
    """Whether :func:`_select_on_host` takes ``x``: a CPU tensor of 32/64-bit floats, rows longer
    than ``SORT_MAX`` (shorter ones are sorted, as by :func:`_select`), host reads allowed."""
    return x.device.type == "cpu" and CPU_BAND and x.dtype in (torch.float32, torch.float64) and n > SORT_MAX


def _select_on_host(x: Tensor, dim: int, ranks: list[int]) -> Tensor:
    """Rank values along ``dim`` of a CPU tensor by numpy: (..., len(ranks)) in x's dtype, exact.

    The band of :func:`_select_by_band` (a seeded sample's order statistics around the ranks,
    six standard deviations apart; the counts below the lower bound shift the ranks), with the
    values in it, then the ranks, found by ``numpy.partition`` (introselect: the exact values
    at those ranks of the sorted row) instead of a radix select: no 65,536-bin histograms, and
    numpy runs each pass on one thread, so a busy machine's other threads do not stall it. If
    the bounds miss, the whole row is partitioned. A row holding a NaN gives NaN.
    """
    n = x.shape[dim]
    if n == 0:
        raise ValueError("cannot take an order statistic of an empty dimension")
    if any(not 0 <= r < n for r in ranks):
        raise ValueError(f"ranks {ranks} out of range for {n} values")
    moved = x.detach().movedim(dim, -1)  # (..., n)
    batch = moved.shape[:-1]
    rows = moved.reshape(-1, n).contiguous().numpy()  # (R, n) the tensor's memory where it is contiguous
    m = min(BAND_SAMPLE, n)
    generator = np.random.default_rng(0)
    low_rank, high_rank = min(ranks), max(ranks)
    spread = 6 * math.sqrt(m * 0.25) + 2  # six sd of a sample quantile (largest at p = 1/2), in sample ranks
    first = max(0, math.floor(low_rank * m / n - spread))
    last = min(m - 1, math.ceil((high_rank + 1) * m / n + spread))
    out = np.empty((rows.shape[0], len(ranks)), dtype=rows.dtype)  # (R, K)
    for i, row in enumerate(rows):  # (n,)
        if not np.isfinite(row.sum()) and np.isnan(row).any():  # a cheap test first, as the band path
            out[i] = np.nan
            continue
        sample = np.partition(row[generator.integers(0, n, m)], [first, last])  # (m,)
        low, high = sample[first], sample[last]  # 0-d, the row's dtype
        under = row < low  # (n,)
        below = int(np.count_nonzero(under))
        inside = row <= high  # (n,)
        inside ^= under  # low <= x <= high
        band = row[inside]  # (b,)
        if below <= low_rank and high_rank < below + band.size and band.size <= n // 4:
            local = [r - below for r in ranks]
            out[i] = np.partition(band, local)[local]  # (K,)
        else:
            out[i] = np.partition(row, ranks)[ranks]  # (K,)
    return torch.from_numpy(out).reshape(*batch, len(ranks))


#: sub-histograms per window on an accelerator (``_lanes``), for 16-bit values (one level) and wider ones.
#: On an H200, the median of 32,768 x 2,048 bfloat16 |h| took 4.46 ms with 16 lanes, 2.45 with 64, 1.85 with
#: 256 and 1.76 with 1,024 (issue 42; 256 keeps the counts at 128 MiB). A wider value's lower levels keep
#: two banks of bins per rank and lane, so it stays at 16 (1,024 lanes made float32 slower: 4.0 ms, not 2.5).
ACCELERATOR_LANES_16_BIT = 256
ACCELERATOR_LANES = 16


def _lanes(rows: int, n: int, device: torch.device, bits: int = 32) -> int:
    """Sub-histograms per row: spreads the counts of a popular digit over ``lanes`` addresses.

    On a GPU every increment of one bin is an atomic add on one address, and |h| values crowd
    into a few hundred 16-bit prefixes, so a single histogram per row would serialise on them;
    several rows already spread the adds. On the CPU the adds are a serial loop: one lane.
    """
    if device.type == "cpu":
        return 1
    lanes = max(1, (ACCELERATOR_LANES_16_BIT if bits == 16 else ACCELERATOR_LANES) // rows)
    while n % lanes:
        lanes //= 2
    return lanes


def _histogram(index: Tensor, rows: int, width: int) -> Tensor:
    """Counts of ``index`` (P, m) int, values in [0, P * width) with part p's bins at p * width,
    summed over the P / rows parts of each row: (rows, width) int64."""
    parts = index.shape[0]
    ones = torch.ones(1, dtype=torch.int64, device=index.device).expand(index.numel())  # (P*m,)
    counts = torch.zeros(parts * width, dtype=torch.int64, device=index.device)  # (P*width,)
    counts.index_add_(0, index.reshape(-1), ones)
    if parts == rows:
        return counts.view(rows, width)  # (rows, width)
    return counts.view(rows, parts // rows, width).sum(dim=1)  # (rows, width)


def _pick(counts: Tensor, remaining: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For counts (R, 65536) in value order and ranks ``remaining`` (R, K): the bin holding each
    rank, the rank within that bin, and the cumulative counts: ((R, K), (R, K), (R, 65536))."""
    cumulative = counts.cumsum(dim=-1)  # (R, 65536)
    position = (cumulative.unsqueeze(1) <= remaining.unsqueeze(-1)).sum(dim=-1)  # (R, K)
    return position, remaining - (cumulative - counts).gather(-1, position), cumulative


_TOP_ORDER: dict[torch.device, Tensor] = {}


def _top_order(device: torch.device) -> Tensor:
    """(65536,) biased top words in value order: negative ones (below 32768) reversed, then the
    positive ones. Built once per device, on the device."""
    if device not in _TOP_ORDER:
        half = _BINS // 2
        with torch.inference_mode(False), torch.no_grad():
            _TOP_ORDER[device] = torch.cat([torch.arange(half - 1, -1, -1, device=device),
                                            torch.arange(half, _BINS, device=device)])
    return _TOP_ORDER[device]


def _select_by_radix(rows: Tensor, ranks: list[int]) -> Tensor:
    """(R, n) -> (R, K) by a most-significant-digit-first radix select on the bit patterns (exact).

    Digits are the 16-bit words of each value's bit pattern ``raw``: the top one signed, plus
    32768 ("biased"), the others unsigned. Their order is fixed up on the 65,536 bins rather
    than per value: at the top word negative values (biased < 32768) count in reverse before
    the positive ones; below it a negative value's words count in reverse. A lower word is
    counted only for values whose higher words equal those chosen so far; the others are sent
    to a second bank of bins (same digit, so no bin of the first bank gets crowded) and ignored.
    All ranks are selected together (one histogram per level and rank, in one ``index_add_``).
    A row holding a NaN gives NaN: for 16-bit floats the top-word histogram says so (NaN words
    are exactly 0x7F81-0x7FFF and 0xFF81-0xFFFF for bfloat16, 0x7C01-0x7FFF and 0xFC01-0xFFFF
    for float16); wider floats take an ``isnan`` pass.
    """
    R, n = rows.shape
    K = len(ranks)
    int_dtype, bits = _BITS[rows.dtype]
    device = rows.device
    levels = bits // DIGIT_BITS
    lanes = _lanes(R, n, device, bits)
    parts = R * lanes
    half = _BINS // 2
    raw = rows.contiguous().view(int_dtype).view(parts, n // lanes)  # (P, n/lanes) bit patterns
    offsets = torch.arange(half, half + parts * _BINS, _BINS, device=device, dtype=torch.int32)  # (P,) bins + bias
    top = (raw >> (bits - DIGIT_BITS)) + offsets.unsqueeze(-1)  # (P, n/lanes) int32+: biased top word + part bins

    def per_part(chosen: Tensor, width: int) -> Tensor:  # (R, K) chosen word -> (K, P, 1) in index space
        part = torch.arange(0, parts * width, width, device=device, dtype=torch.int32).unsqueeze(-1)  # (P, 1)
        return chosen.t().repeat_interleave(lanes, dim=1).to(torch.int32).unsqueeze(-1) + part

    top_counts = _histogram(top, R, _BINS)  # (R, 65536) by biased top word
    in_order = top_counts.index_select(-1, _top_order(device))  # (R, 65536) in value order
    # ranks made on the device (a host tensor copied in would make torch wait for the stream)
    if ranks == list(range(ranks[0], ranks[0] + K)):
        remaining = torch.arange(ranks[0], ranks[0] + K, device=device).expand(R, K)  # (R, K)
    else:
        remaining = torch.stack([torch.full((R,), r, dtype=torch.int64, device=device) for r in ranks], -1)  # (R, K)
    position, remaining, cumulative = _pick(in_order, remaining)  # (R, K), (R, K), (R, 65536)
    biased = torch.where(position < half, half - 1 - position, position)  # (R, K) top word + 32768
    negative = biased < half  # (R, K)
    key = biased - half  # (R, K) the signed top word
    if levels > 1:
        mismatch = top != per_part(biased, _BINS)  # (K, P, n/lanes): higher words differ from those chosen
    for level in range(1, levels):
        shift = bits - DIGIT_BITS * (level + 1)
        word = ((raw >> shift) if shift else raw) & (_BINS - 1)  # (P, n/lanes) unsigned
        if parts > 1:
            banks = torch.arange(0, parts * 2 * _BINS, 2 * _BINS, device=device, dtype=torch.int32)  # (P,)
            word = word + banks.unsqueeze(-1)  # (P, n/lanes) each part's two banks
        rank_bank = torch.arange(K, device=device, dtype=torch.int32).view(K, 1, 1) * (parts * 2 * _BINS)
        index = (word + rank_bank).add(mismatch, alpha=_BINS)  # (K, P, n/lanes) each rank's bins
        counts = _histogram(index.view(K * parts, -1), K * R, 2 * _BINS)  # (K*R, 131072)
        counts = counts.view(K, R, 2 * _BINS)[..., :_BINS].transpose(0, 1)  # (R, K, 65536) by unsigned word
        ordered = torch.where(negative.unsqueeze(-1), counts.flip(-1), counts)  # (R, K, 65536)
        position, remaining = _pick_each(ordered, remaining)  # (R, K), (R, K)
        unsigned = torch.where(negative, _BINS - 1 - position, position)  # (R, K) the word, 0..65535
        key = (key << DIGIT_BITS) | unsigned  # (R, K)
        if level + 1 < levels:
            mismatch = mismatch | (word != per_part(unsigned, 2 * _BINS))  # (K, P, n/lanes)
    values = key.to(int_dtype).view(rows.dtype)  # (R, K)
    if bits == 16:  # NaN words, counted in the top histogram: the two ends of the value order
        inf_word = 0x7F80 if rows.dtype == torch.bfloat16 else 0x7C00
        # negative NaN words 0x8000+inf_word+1.. come first (value order 0..half-inf_word-2), positive
        # ones inf_word+1..0x7FFF last (value order half+inf_word+1..65535)
        nan = cumulative[:, half - inf_word - 2] + cumulative[:, -1] - cumulative[:, half + inf_word]  # (R,)
    else:
        nan = torch.isnan(rows).any(dim=-1)  # (R,)
    return values.masked_fill(nan.unsqueeze(-1) > 0, float("nan"))  # (R, K)


def _pick_each(counts: Tensor, remaining: Tensor) -> tuple[Tensor, Tensor]:
    """Like :func:`_pick` with one histogram per rank: counts (R, K, 65536), remaining (R, K)."""
    cumulative = counts.cumsum(dim=-1)  # (R, K, 65536)
    position = (cumulative <= remaining.unsqueeze(-1)).sum(dim=-1)  # (R, K)
    return position, remaining - (cumulative - counts).gather(-1, position.unsqueeze(-1)).squeeze(-1)
