"""Keep the process's heap from growing with the text while streaming (issue 25's memory target).

Each chunk's logits are one large block (``chunk`` x vocabulary x 4 bytes: 12.6 MB for SmolLM2 at
chunk 64). glibc serves a block above its mmap threshold with its own mapping and returns it
whole when freed, but it raises that threshold to the size of each such block freed (its
"dynamic mmap threshold", up to 32 MB). From the second chunk on, the logits then come from the
heap, between the cache's small long-lived tensors, and the heap fragments: measured on SmolLM2,
about 0.23 MB more resident memory per token read, 3 GB at 16k tokens. Fixing the threshold at
1 MiB (``mallopt(M_MMAP_THRESHOLD, 1 MiB)``, which also turns the dynamic adjustment off) keeps
every large block in its own mapping: 32,768 tokens through a 512-key cache then peak at 0.99x
a plain 512-token forward (benchmarks/bench_stream.py).

The setting is process-wide and only changes where glibc puts blocks of 1 MiB and more; other C
libraries (macOS, musl) have no such threshold and are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 1 << 20


@functools.cache
def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at 1 MiB once per process; True where it was set."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(ctypes.c_int(M_MMAP_THRESHOLD), ctypes.c_int(MMAP_THRESHOLD_BYTES)))
    except (OSError, AttributeError):
        return False
