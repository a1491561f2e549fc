"""glibc's mmap threshold, fixed per process: 4 MiB for measuring runs, 1 MiB for ``stream`` (issues 25, 42).

A large block (a chunk's logits, a layer's (T, C) activations) that glibc serves above its mmap
threshold gets its own mapping and goes back to the system whole when freed. glibc raises that
threshold to the size of each such block freed (its "dynamic mmap threshold", up to 32 MiB), so
later blocks below that size come from the heap, between small long-lived tensors, where they
fragment it and the process's resident memory grows. ``mallopt(M_MMAP_THRESHOLD, n)`` fixes the
threshold at n bytes, which also turns the dynamic adjustment off.

- Every measuring run (``runner.run_probes``) fixes :data:`RUN_THRESHOLD_BYTES`, 4 MiB. Measured on
  SmolLM2-135M-Instruct with `benchmarks/bench_sinks.py --mmap-thresholds` (docs/costs.md, "Memory at long
  context"): glibc's own threshold let `heads` peak at 1.38x a plain forward at 8,192 tokens and
  `selectivity` at 1.25x; a fixed 16 MiB gave `sinks` 1.24x at 2,048 and 1.20x at 16,384 tokens;
  8 MiB, 1.18x at 2,048; 4 MiB kept every one within 1.01-1.08x. Below it (a window of 512
  tokens: SmolLM2's largest block is 3 MB) nothing changes; a threshold of 1 MiB maps and faults
  every block above it afresh (`sinks` took 1.69x the time at 512 tokens).
- ``stream`` fixes :data:`STREAM_THRESHOLD_BYTES`, 1 MiB: each chunk's logits (12.6 MB for
  SmolLM2 at chunk 64) sit between the cache's small tensors, and with glibc's default the heap
  grew by about 0.23 MB per token read (3 GB at 16k tokens); fixed, 32,768 tokens peak at 0.99x a
  plain 512-token forward (benchmarks/bench_stream.py).

The setting is process-wide and only changes where glibc puts blocks of at least that size. The
lowest threshold asked for in a process wins (a stream after a run keeps 1 MiB). The environment
variable ``SINKSCOPE_MMAP_THRESHOLD`` overrides both: a size in bytes, or ``off`` to leave glibc
alone (``benchmarks/bench_sinks.py --mmap-thresholds`` measures each). Other C libraries (macOS,
musl) have no such threshold and are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

from sinkscope.errors import whole_number

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
#: the threshold every measuring run fixes (docs/costs.md, "Memory at long context"); None would leave glibc alone.
RUN_THRESHOLD_BYTES: int | None = 4 << 20
#: the threshold ``stream`` fixes: below its chunk's logits.
STREAM_THRESHOLD_BYTES = 1 << 20
#: the largest threshold glibc accepts (HEAP_MAX / 2 on 64-bit systems).
GLIBC_MAX_BYTES = 32 << 20
ENVIRONMENT = "SINKSCOPE_MMAP_THRESHOLD"

_fixed: list[int] = []  # the threshold set in this process, once one is


@functools.cache
def glibc_mallopt():
    """glibc's ``mallopt``, or None off glibc or where the C library cannot be loaded (looked up once)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def asked_threshold(default: int | None) -> int | None:
    """The threshold to set: ``SINKSCOPE_MMAP_THRESHOLD`` when given (None for ``off``), else ``default``
    (None: leave glibc alone).

    A value that is neither ``off`` nor a whole number of bytes in [0, 32 MiB] is ignored (the default applies).
    """
    value = os.environ.get(ENVIRONMENT, "").strip().lower()
    if value == "off":
        return None
    bytes_asked = whole_number(value)
    if bytes_asked is not None and bytes_asked <= GLIBC_MAX_BYTES:
        return bytes_asked
    return default


def fix_mmap_threshold(size: int | None = STREAM_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``size`` bytes (or what the environment asks), unless a lower one is set.

    Returns True where the threshold in force is now at most the one asked for (set here or before),
    False off glibc, where ``mallopt`` refuses, with ``SINKSCOPE_MMAP_THRESHOLD=off``, or where
    ``size`` is None and the environment asks for nothing (glibc left alone).
    """
    wanted = asked_threshold(size)
    if wanted is None:
        return False
    if _fixed and _fixed[0] <= wanted:
        return True
    mallopt = glibc_mallopt()
    if mallopt is None or not mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(wanted)):
        return False
    _fixed[:] = [wanted]
    return True


def fixed_threshold() -> int | None:
    """The threshold this process fixed, in bytes, or None (for the manifest)."""
    return _fixed[0] if _fixed else None


def forget() -> None:
    """Forget what was set and the looked-up ``mallopt`` (tests)."""
    _fixed.clear()
    glibc_mallopt.cache_clear()
