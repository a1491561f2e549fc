"""Keep the process's heap from growing with the sequence length (issues 25 and 42).

A large block (a layer's (T, C) activations, a chunk's logits) that glibc serves above its mmap
threshold gets its own mapping and goes back to the system whole when freed. But glibc raises
that threshold to the size of each such block freed (its "dynamic mmap threshold", up to 32 MB),
so from the second layer on the same blocks come from the heap, between small long-lived
tensors, and the heap fragments and grows. Measured on SmolLM2-135M (docs/costs.md, "Memory at
long context"): `sinks` at 8,192 tokens peaked at 1.63x a plain SDPA forward's resident memory
with glibc's default, from the heap and not from live tensors.

``mallopt(M_MMAP_THRESHOLD, n)`` fixes the threshold at n bytes, which also turns the dynamic
adjustment off. Two sizes are used:

- :data:`RUN_THRESHOLD_BYTES`, 16 MiB, for every measuring run (``runner.run_probes``). A smaller
  threshold maps and faults afresh every block above it: at 1 MiB `sinks` took 1.69x the time at
  512 tokens and 1.44x at 2,048; at 16 MiB no time cost was measurable (docs/costs.md).
- :data:`STREAM_THRESHOLD_BYTES`, 1 MiB, for ``stream``: each chunk's logits (12.6 MB for SmolLM2
  at chunk 64) sit between the cache's small tensors; 16 MiB would leave them on the heap.

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

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
#: the threshold every measuring run fixes (docs/costs.md, "Memory at long context").
RUN_THRESHOLD_BYTES = 16 << 20
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


def asked_threshold(default: int) -> int | None:
    """The threshold to set: ``SINKSCOPE_MMAP_THRESHOLD`` when given (None for ``off``), else ``default``.

    A value that is neither ``off`` nor a whole number of bytes in [0, 32 MiB] is ignored (the default applies).
    """
    value = os.environ.get(ENVIRONMENT, "").strip().lower()
    if value == "off":
        return None
    if value.isdigit() and int(value) <= GLIBC_MAX_BYTES:
        return int(value)
    return default


def fix_mmap_threshold(size: int = STREAM_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``size`` bytes (or what the environment asks), unless a lower one is set.

    Returns True where the threshold in force is now at most the one asked for (set here or before),
    False off glibc, where ``mallopt`` refuses, or with ``SINKSCOPE_MMAP_THRESHOLD=off``.
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
