"""What the attention explorer keeps of a run, and how the page carries it (SPEC.md "The explorer").

A run keeps, for a few windows and a few heads, the attention pattern a_qj the model computed
(the weights Hugging Face's eager attention returns: normalised over the real keys and any
learned phantom, so that sum_j a_qj + phi_q = 1), sparse and at reduced precision:

    stored weight  = round(a_qj / scale) * scale,  scale = 1 / 65,535   (uint16 codes; error <= scale / 2)
    dropped        a_qj < threshold (1e-3) is not stored and reads as 0  (error < threshold)

so every weight the page holds is within ``max(threshold, scale / 2)`` = 1e-3 of the model's.
Beside each pattern: the head's value norm ||v_j|| per key and, on learned-sink models, the
phantom mass phi_q per query (float32); and for every head the position-0 mass over the stored
windows (queries q >= 1, SPEC.md "Position-0 mass"), which chose the heads.

``explorer.npz`` in the run folder (numpy arrays only, read without pickle):

    heads        int32 (K, 2)        (layer, head) of each stored head, in the order chosen
    chosen       str (K,)            why: "top" (p0 mass), "sample", "asked" or "all"
    windows      int64 (W,)          the windows' rows in tokens.npy
    labels       str (W, T)          each token as the tokenizer writes it alone
    blocks       int64 (W, K, 2)     [start, stop) of the (window, head) pattern in keys/codes; -1 -1: not kept
    indptr       int64 (W, K, T + 1) row q's entries are start + [indptr[q], indptr[q + 1])
    keys         int32 (N,)          key j of each entry, ascending within a row
    codes        uint16 (N,)         a_qj = code * scale
    value_norms  float32 (W, K, T)   ||v_j|| of the head's value (zeros where the record has no values)
    phantom      float32 (W, K, T)   phi_q (zeros without a learned sink)
    p0           float32 (L, H)      position-0 mass over the stored windows (NaN: a layer without attention)
    meta         float64 (4,)        threshold, scale, has_phantom, has_value_norms

The page (``report/explorer.py``) carries each kept (window, head) pattern as one block: the
zlib-compressed little-endian bytes ``int32 indptr[T + 1] | float32 value_norm[T] | float32
phantom[T] | uint32 keys[n] | uint16 codes[n]``, base64-encoded, which ``explorer.js`` inflates with
the browser's ``DecompressionStream``. :func:`fit` keeps blocks, window 0's heads first, while the
page's explorer data stays within a byte budget (``--explore-max-mb``).
"""

from __future__ import annotations

import base64
import json
import zipfile
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from sinkscope.errors import SinkscopeError, option

#: the file a run folder keeps the explorer's data in.
FILE = "explorer.npz"
#: weights below this are not stored (they read as 0).
THRESHOLD = 1e-3
#: one uint16 code is this much weight.
SCALE = 1.0 / 65535
#: the heads ``auto`` keeps: the top ones by position-0 mass, plus a seeded sample of the rest.
AUTO_TOP, AUTO_SAMPLE = 8, 4
#: the page's explorer data budget by default (report.html stays under 5 MB with its figures).
DEFAULT_MAX_MB = 3.5


@dataclass
class ExplorerData:
    """The explorer's share of a run (the arrays of ``explorer.npz``; see the module docstring)."""

    heads: np.ndarray
    chosen: np.ndarray
    windows: np.ndarray
    labels: np.ndarray
    blocks: np.ndarray
    indptr: np.ndarray
    keys: np.ndarray
    codes: np.ndarray
    value_norms: np.ndarray
    phantom: np.ndarray
    p0: np.ndarray
    threshold: float = THRESHOLD
    scale: float = SCALE
    has_phantom: bool = False
    has_value_norms: bool = True
    #: what :func:`fit` left out, as (window row, layer, head), for the page's note and the manifest.
    left_out: list = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return int(self.p0.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.p0.shape[1])

    @property
    def seq_len(self) -> int:
        return int(self.indptr.shape[-1] - 1)

    def kept(self) -> list[tuple[int, int]]:
        """The (window position, head position) pairs whose pattern is stored."""
        return [(w, k) for w in range(len(self.windows)) for k in range(len(self.heads)) if self.blocks[w, k, 0] >= 0]

    def dense(self, window: int, layer: int, head: int) -> np.ndarray:
        """The stored pattern as a (T, T) float64 matrix (0 where nothing is stored), for tests and notebooks.

        ``window`` is the row in tokens.npy; a pattern that is not stored is a one-sentence error.
        """
        w, k = self._position(window, layer, head)
        start, _ = self.blocks[w, k]
        T = self.seq_len
        out = np.zeros((T, T))
        for q in range(T):
            lo, hi = start + self.indptr[w, k, q], start + self.indptr[w, k, q + 1]
            out[q, self.keys[lo:hi]] = self.codes[lo:hi] * self.scale
        return out

    def _position(self, window: int, layer: int, head: int) -> tuple[int, int]:
        ws = np.flatnonzero(self.windows == window)
        ks = np.flatnonzero((self.heads[:, 0] == layer) & (self.heads[:, 1] == head))
        if not len(ws) or not len(ks) or self.blocks[ws[0], ks[0], 0] < 0:
            raise SinkscopeError(f"the explorer holds no pattern for window {window}, layer {layer}, head {head}.")
        return int(ws[0]), int(ks[0])

    # ---- the run folder's file ----------------------------------------------------------------------
    def save(self, path: Path) -> None:
        """Write ``explorer.npz`` (uncompressed npz: the blocks are compressed for the page, not here)."""
        meta = np.array([self.threshold, self.scale, float(self.has_phantom), float(self.has_value_norms)])
        with open(path, "wb") as handle:
            np.savez(handle, heads=self.heads, chosen=self.chosen, windows=self.windows, labels=self.labels,
                     blocks=self.blocks, indptr=self.indptr, keys=self.keys, codes=self.codes,
                     value_norms=self.value_norms, phantom=self.phantom, p0=self.p0, meta=meta)

    @classmethod
    def load(cls, path: Path) -> "ExplorerData":
        """Read ``explorer.npz`` (no pickle); a damaged file is one sentence."""
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
            meta = arrays.pop("meta")
            data = cls(**arrays, threshold=float(meta[0]), scale=float(meta[1]), has_phantom=bool(meta[2]),
                       has_value_norms=bool(meta[3]))
            data.check()
        except (OSError, ValueError, KeyError, TypeError, IndexError, EOFError, zlib.error, zipfile.BadZipFile) as error:
            raise SinkscopeError(f"the explorer data at {path} is damaged ({error}); rerun the measurement.") from None
        return data

    def check(self) -> None:
        """Shapes that agree with each other (a damaged or foreign file fails here, not in the page)."""
        W, K = len(self.windows), len(self.heads)
        T = self.labels.shape[-1] if self.labels.ndim == 2 else -1
        if (self.blocks.shape != (W, K, 2) or self.indptr.shape != (W, K, T + 1) or self.labels.shape != (W, T)
                or self.value_norms.shape != (W, K, T) or self.phantom.shape != (W, K, T)
                or self.keys.shape != self.codes.shape or self.p0.ndim != 2 or self.heads.shape != (K, 2)):
            raise ValueError("its arrays' shapes disagree")
        if self.blocks.size and int(self.blocks.max(initial=0)) > len(self.keys):
            raise ValueError("a pattern points past its entries")
        if self.keys.size and (int(self.keys.min()) < 0 or int(self.keys.max()) >= T):
            raise ValueError("a key lies outside its window")

    # ---- the page's blocks ----------------------------------------------------------------------------
    def block_bytes(self, w: int, k: int) -> bytes:
        """One pattern as the page carries it: the zlib-compressed layout of the module docstring."""
        start, stop = (int(x) for x in self.blocks[w, k])
        parts = [self.indptr[w, k].astype("<i4"), self.value_norms[w, k].astype("<f4"),
                 self.phantom[w, k].astype("<f4"), self.keys[start:stop].astype("<u4"),
                 self.codes[start:stop].astype("<u2")]
        return zlib.compress(b"".join(p.tobytes() for p in parts), 6)

    def block_text(self, w: int, k: int) -> str:
        """:meth:`block_bytes` in base64 (what the page's JSON holds)."""
        return base64.b64encode(self.block_bytes(w, k)).decode("ascii")


def labels_bytes(data: ExplorerData) -> int:
    """The bytes the windows' token labels take in the page's JSON."""
    return sum(len(json.dumps([str(t) for t in row])) for row in data.labels)


def fit(data: ExplorerData, max_bytes: int | None) -> tuple[ExplorerData, int]:
    """Keep the patterns that fit in ``max_bytes`` of page data: window by window, heads in their order.

    The token labels count first; a pattern that does not fit is left out (recorded in
    ``left_out``), and so is every later one, so what is kept is always a prefix of the order
    (window 0's top heads first). ``max_bytes`` None keeps everything. Returns the data with only
    the kept entries, and the bytes its page data takes (labels and blocks).
    """
    used = labels_bytes(data)
    keep, left_out, full = [], [], False
    for w, k in data.kept():
        size = len(data.block_text(w, k)) + 64  # the block's JSON keys and numbers
        if not full and (max_bytes is None or used + size <= max_bytes):
            keep.append((w, k))
            used += size
        else:
            full = True
            left_out.append((int(data.windows[w]), int(data.heads[k, 0]), int(data.heads[k, 1])))
    return select(data, keep, left_out), used


def select(data: ExplorerData, keep: list[tuple[int, int]], left_out: list | None = None) -> ExplorerData:
    """The data holding only the (window position, head position) patterns in ``keep``."""
    blocks = np.full_like(data.blocks, -1)
    keys, codes, at = [], [], 0
    for w, k in sorted(keep):
        start, stop = (int(x) for x in data.blocks[w, k])
        keys.append(data.keys[start:stop])
        codes.append(data.codes[start:stop])
        blocks[w, k] = (at, at + stop - start)
        at += stop - start
    return replace(data, blocks=blocks, keys=np.concatenate(keys) if keys else np.zeros(0, np.int32),
                   codes=np.concatenate(codes) if codes else np.zeros(0, np.uint16),
                   left_out=list(data.left_out) + list(left_out or []))


def choose_heads(p0: np.ndarray, seed: int) -> dict[tuple[int, int], str]:
    """``auto``'s heads from each head's position-0 mass on the stored windows (``p0`` (L, H), NaN: no attention).

    AUTO_SAMPLE heads are drawn uniformly from the attention heads with ``default_rng(seed)``, then
    the AUTO_TOP others of highest p0 are added. Returns {(layer, head): "top" | "sample"} in the
    page's order: the top heads by p0 (highest first), then the sampled ones by p0.
    """
    heads = [(int(l), int(h)) for l, h in zip(*np.nonzero(~np.isnan(p0)))]
    drawn = np.random.default_rng(seed).permutation(len(heads))[:AUTO_SAMPLE]
    sampled = {heads[i] for i in drawn}
    by_p0 = sorted(heads, key=lambda key: (-p0[key], key))
    tops = [key for key in by_p0 if key not in sampled][:AUTO_TOP]
    return {**{key: "top" for key in tops}, **{key: "sample" for key in by_p0 if key in sampled}}


def parse_heads(value: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """``--explore-heads``: ``auto`` | ``all`` | ``none`` | ``L.H,L.H,...`` -> (kind, asked heads).

    A malformed value is one sentence (checked before anything loads).
    """
    text = str(value).strip().lower()
    if text in ("auto", "all", "none"):
        return text, ()
    heads = []
    for part in text.split(","):
        layer, dot, head = part.strip().partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise SinkscopeError(f"{option('explore_heads')} takes auto, all, none or LAYER.HEAD pairs such as "
                                 f"3.1,5.0, not {value!r}.")
        heads.append((int(layer), int(head)))
    return "asked", tuple(dict.fromkeys(heads))


def check_heads_exist(value: str, n_layers: int, n_heads: int, attention_layers) -> None:
    """Named heads that the model has (a layer with attention, a head below H), or one sentence."""
    kind, heads = parse_heads(value)
    for layer, head in heads:
        if layer not in attention_layers or not 0 <= head < n_heads:
            raise SinkscopeError(f"{option('explore_heads')} names layer {layer} head {head}, which the model does not "
                                 f"have as an attention head ({n_layers} layers, attention in "
                                 f"{len(attention_layers)} of them, {n_heads} heads each).")
