"""Synthetic explorer data (``explorer_data.ExplorerData``) for the tests of the file, the page and the script."""

from __future__ import annotations

import numpy as np

from sinkscope.store.explorer_format import ExplorerData


def synthetic(W: int = 2, K: int = 3, T: int = 16, seed: int = 0) -> ExplorerData:
    """Random sparse patterns: each row keeps key 0 and its last few keys."""
    rng = np.random.default_rng(seed)
    blocks = np.zeros((W, K, 2), np.int64)
    indptr = np.zeros((W, K, T + 1), np.int64)
    keys, codes, at = [], [], 0
    for w in range(W):
        for k in range(K):
            start = at
            for q in range(T):
                row = sorted({0, *range(max(0, q - 3), q + 1)})
                keys += row
                codes += list(rng.integers(66, 65536, size=len(row)))
                at += len(row)
                indptr[w, k, q + 1] = at - start
            blocks[w, k] = (start, at)
    return ExplorerData(
        heads=np.array([[0, 1], [2, 0], [1, 3]][:K], np.int32), chosen=np.array(["top", "top", "sample"][:K]),
        windows=np.arange(W, dtype=np.int64) * 5, labels=np.array([[f"w{w}t{i}" for i in range(T)] for w in range(W)]),
        blocks=blocks, indptr=indptr, keys=np.array(keys, np.int32), codes=np.array(codes, np.uint16),
        value_norms=rng.random((W, K, T)).astype(np.float32), phantom=rng.random((W, K, T)).astype(np.float32) * 0.1,
        p0=rng.random((3, 4)).astype(np.float32), has_phantom=True)
