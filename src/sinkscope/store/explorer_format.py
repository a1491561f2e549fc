"""What the attention explorer keeps of a run, and how the page carries it (SPEC.md "The explorer").

A run keeps, for a few windows and a few heads, the attention pattern a_qj the model computed
(the weights Hugging Face's eager attention returns: normalised over the real keys and any
learned phantom, so that sum_j a_qj + phi_q = 1), sparse and at reduced precision:

    stored weight  = round(a_qj / scale) * scale,  scale = 1 / 65,535   (uint16 codes; error <= scale / 2
                     against the a_qj the model computed, in its own precision)
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

The page (``report/explorer_page.py``) carries each kept (window, head) pattern as one block: the
zlib-compressed little-endian bytes ``int32 indptr[T + 1] | float32 value_norm[T] | float32
phantom[T] | uint32 keys[n] | uint16 codes[n]``, base64-encoded, which ``explorer.js`` inflates with
the browser's ``DecompressionStream``. :func:`fit` keeps blocks, window 0's heads first, while the
page's explorer data stays within a byte budget (``--explore-max-mb``).

Reading a run folder's arrays (:func:`read_npz`, :func:`read_npy`: ``explorer.npz`` here,
``tokens.npy`` by ``run_result.Result.load``) checks each member's header (dtype, shape) and, in an
npz, the zip entry's uncompressed size, against the sizes the run's manifest allows before a byte of
data is read, and never unpickles: a planted file that would inflate to gigabytes, or whose header
declares 10**12 elements, is one sentence naming the file.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
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
#: the heads ``auto`` keeps: a seeded sample drawn first, then the top ones of the rest by position-0 mass.
AUTO_TOP = 8
AUTO_SAMPLE = 4
#: the page's explorer data budget by default (report.html stays under 5 MB with its figures).
DEFAULT_MAX_MB = 3.5
#: the members of ``explorer.npz``: (numpy kinds allowed, dimensions); shapes are checked by :func:`_npz_limits`.
MEMBERS = {"heads": ("iu", 2), "chosen": ("U", 1), "windows": ("iu", 1), "labels": ("U", 2), "blocks": ("iu", 3),
           "indptr": ("iu", 3), "keys": ("iu", 1), "codes": ("u", 1), "value_norms": ("f", 3), "phantom": ("f", 3),
           "p0": ("f", 2), "meta": ("f", 1)}
#: the widest ``chosen`` value ("sample") and token label a file may hold, in characters.
MAX_CHOSEN_CHARS, MAX_LABEL_CHARS = 16, 1024


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
    #: (window position, head position) of the patterns read past the budget, whose entries were not
    #: kept (the explorer pass's windows after the budget was spent); :func:`fit` leaves them out in
    #: their place. Not written to the file.
    beyond: list = field(default_factory=list)

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
    def load(cls, path: Path, manifest: dict | None = None) -> "ExplorerData":
        """Read ``explorer.npz`` (no pickle); a damaged file is one sentence.

        Every member's header is checked before anything is read (:func:`read_npz`): against the
        run's ``manifest`` (default: the ``manifest.json`` beside the file, where there is one: its
        windows, the explorer's heads and windows, the model's layers and heads), else against each
        other and the memory available.
        """
        path = Path(path)
        if manifest is None:
            manifest = _manifest_beside(path)
        try:
            arrays = read_npz(path, lambda shapes: _npz_limits(shapes, manifest), "the explorer data")
            meta = arrays.pop("meta")
            data = cls(**arrays, threshold=float(meta[0]), scale=float(meta[1]), has_phantom=bool(meta[2]),
                       has_value_norms=bool(meta[3]))
            data.check()
        except (OSError, ValueError, KeyError, TypeError, IndexError, EOFError, zlib.error, zipfile.BadZipFile) as error:
            raise SinkscopeError(f"the explorer data at {path} is damaged ({error}); rerun the measurement.") from None
        return data

    def check(self) -> None:
        """Shapes and values that agree with each other (a damaged or foreign file fails here, not in the page)."""
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
        for name, value, low, high in (("threshold", self.threshold, 0, 1), ("scale", self.scale, 0, 1)):
            if not (isinstance(value, float) and math.isfinite(value) and low < value <= high):
                raise ValueError(f"its {name} is {value!r}, not a number in ({low}, {high}]")
        if self.heads.size and (int(self.heads.min()) < 0 or int(self.heads[:, 0].max()) >= self.n_layers
                                or int(self.heads[:, 1].max()) >= self.n_heads):
            raise ValueError("a head lies outside the model's layers and heads")
        if self.windows.size and int(self.windows.min()) < 0:
            raise ValueError("a window row is negative")
        kept = self.blocks[:, :, 0] >= 0  # (W, K)
        sizes = (self.blocks[:, :, 1] - self.blocks[:, :, 0])[kept]  # (n_kept,)
        rows = self.indptr[kept]  # (n_kept, T + 1)
        if kept.any() and (int(self.blocks[:, :, 0][kept].min()) < 0 or (sizes < 0).any() or (rows[:, 0] != 0).any()
                           or (np.diff(rows, axis=-1) < 0).any() or (rows[:, -1] != sizes).any()):
            raise ValueError("a pattern's rows do not add up to its entries")
        if set(map(str, self.chosen)) - {"top", "sample", "asked", "all"}:
            raise ValueError("a head is kept for no known reason")

    # ---- the page's blocks ----------------------------------------------------------------------------
    def block_bytes(self, w: int, k: int) -> bytes:
        """One pattern as the page carries it: the zlib-compressed layout of the module docstring."""
        start, stop = (int(x) for x in self.blocks[w, k])
        return pack_block(self.indptr[w, k], self.value_norms[w, k], self.phantom[w, k], self.keys[start:stop],
                          self.codes[start:stop])

    def block_text(self, w: int, k: int) -> str:
        """:meth:`block_bytes` in base64 (what the page's JSON holds)."""
        return base64.b64encode(self.block_bytes(w, k)).decode("ascii")


def pack_block(indptr: np.ndarray, value_norms: np.ndarray, phantom: np.ndarray, keys: np.ndarray,
               codes: np.ndarray) -> bytes:
    """``int32 indptr[T + 1] | float32 value_norm[T] | float32 phantom[T] | uint32 keys[n] | uint16 codes[n]``,
    little-endian, zlib level 6 (the page's block)."""
    parts = [indptr.astype("<i4"), value_norms.astype("<f4"), phantom.astype("<f4"), keys.astype("<u4"),
             codes.astype("<u2")]
    return zlib.compress(b"".join(p.tobytes() for p in parts), 6)


def block_size(indptr: np.ndarray, value_norms: np.ndarray, phantom: np.ndarray, keys: np.ndarray,
               codes: np.ndarray) -> int:
    """What one block costs the page's budget: its base64 text plus 64 bytes of JSON keys and numbers (:func:`fit`)."""
    return 4 * math.ceil(len(pack_block(indptr, value_norms, phantom, keys, codes)) / 3) + 64


def label_array(rows: list[list[str]], seq_len: int) -> np.ndarray:
    """The windows' token labels as the file holds them: (W, seq_len) unicode, as wide as the widest label."""
    width = max([len(t) for row in rows for t in row] + [1])
    return np.array([row[:seq_len] for row in rows], dtype=f"<U{width}")


def labels_size(labels: np.ndarray) -> int:
    """The bytes token labels (W, T) take in the page's JSON."""
    return sum(len(json.dumps([str(t) for t in row])) for row in labels)


def labels_bytes(data: ExplorerData) -> int:
    """The bytes the windows' token labels take in the page's JSON."""
    return labels_size(data.labels)


def fit(data: ExplorerData, max_bytes: int | None) -> tuple[ExplorerData, int]:
    """Keep the patterns that fit in ``max_bytes`` of page data: window by window, heads in their order.

    The token labels count first; a pattern that does not fit is left out (recorded in
    ``left_out``), and so is every later one, so what is kept is always a prefix of the order
    (window 0's top heads first). A pattern read past the budget (``data.beyond``) is left out in its
    place. ``max_bytes`` None keeps everything. Returns the data with only the kept entries, and the
    bytes its page data takes (labels and blocks).
    """
    used = labels_bytes(data)
    keep, left_out, full = [], [], False
    beyond = set(data.beyond)
    for w, k in sorted(data.kept() + list(beyond)):
        size = None if (w, k) in beyond else len(data.block_text(w, k)) + 64  # the block's JSON keys and numbers
        if not full and size is not None and (max_bytes is None or used + size <= max_bytes):
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
                   left_out=list(data.left_out) + list(left_out or []), beyond=[])


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
        found = _HEAD.fullmatch(part.strip())  # ASCII digits only: str.isdigit also takes '²' and '٣'
        if found is None:
            raise SinkscopeError(f"{option('explore_heads')} takes auto, all, none or LAYER.HEAD pairs such as "
                                 f"3.1,5.0, not {value!r}.")
        heads.append((int(found.group(1)), int(found.group(2))))
    return "asked", tuple(dict.fromkeys(heads))


_HEAD = re.compile(r"([0-9]{1,9})\.([0-9]{1,9})")


def check_max_mb(value) -> float | None:
    """``--explore-max-mb``: None (no budget) or a finite number of MB above 0, as a float; else one sentence."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number <= 0:
        raise SinkscopeError(f"{option('explore_max_mb')} must be a finite number of MB above 0 (got {value!r}); "
                             f"the default is {DEFAULT_MAX_MB:g}.")
    return number


def check_heads_exist(value: str, n_layers: int, n_heads: int, attention_layers) -> None:
    """Named heads that the model has (a layer with attention, a head below H), or one sentence."""
    kind, heads = parse_heads(value)
    for layer, head in heads:
        if layer not in attention_layers or not 0 <= head < n_heads:
            raise SinkscopeError(f"{option('explore_heads')} names layer {layer} head {head}, which the model does not "
                                 f"have as an attention head ({n_layers} layers, attention in "
                                 f"{len(attention_layers)} of them, {n_heads} heads each).")


# ---- a run folder's arrays, checked before they are read -------------------------------------------------

#: the longest npy header read (numpy's own limit for headers it reads without ``max_header_size``).
MAX_HEADER = 10000


def _header(handle, what: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, header bytes) of the npy stream ``handle``, reading its header only."""
    start = handle.read(12)
    if len(start) < 10 or start[:6] != b"\x93NUMPY" or start[6] not in (1, 2):
        raise ValueError(f"{what} is not an npy array")
    size = 10 + int.from_bytes(start[8:10], "little") if start[6] == 1 else 12 + int.from_bytes(start[8:12], "little")
    if size > MAX_HEADER:
        raise ValueError(f"{what} has a header of {size:,} bytes")
    head = start + handle.read(size - len(start))
    if len(head) < size:
        raise ValueError(f"{what} is cut short")
    stream = io.BytesIO(head)
    version = np.lib.format.read_magic(stream)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(stream)
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"{what} holds {dtype} values, not numbers or text")
    return tuple(int(n) for n in shape), dtype, size


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize  # Python ints: 10**12 elements do not overflow


def read_npz(path: Path, limits, what: str) -> dict[str, np.ndarray]:
    """The arrays of the npz at ``path``, every member's header checked before any data is read.

    Each member must be one of :data:`MEMBERS` (all of them present), of an allowed dtype kind and
    dimension; ``limits(shapes)`` (``{name: shape}``) raises ValueError for shapes the run does not
    allow; the zip entry's uncompressed size must be exactly the header plus the data it declares
    (so nothing inflates past what was checked). Raises ValueError (or a zip error) naming what is wrong.
    """
    with zipfile.ZipFile(path) as archive:
        infos = {info.filename: info for info in archive.infolist()}
        expected = {f"{name}.npy" for name in MEMBERS}
        if set(infos) != expected:
            strange = sorted(set(infos) ^ expected)[:3]
            raise ValueError(f"its members are not the explorer's ({', '.join(map(repr, strange))})")
        shapes, dtypes = {}, {}
        for name, (kinds, ndim) in MEMBERS.items():
            info = infos[f"{name}.npy"]
            with archive.open(info) as member:
                shape, dtype, header = _header(member, f"its member {name}")
            if dtype.kind not in kinds or len(shape) != ndim:
                raise ValueError(f"its member {name} is {dtype} of {len(shape)} dimensions")
            if info.file_size != header + _nbytes(shape, dtype):
                raise ValueError(f"its member {name} inflates to {info.file_size:,} bytes, not the "
                                 f"{header + _nbytes(shape, dtype):,} its header declares")
            shapes[name], dtypes[name] = shape, dtype
        if dtypes["chosen"].itemsize > 4 * MAX_CHOSEN_CHARS or dtypes["labels"].itemsize > 4 * MAX_LABEL_CHARS:
            raise ValueError("its text is wider than any token")
        limits(shapes)
        _check_memory(sum(_nbytes(shapes[n], dtypes[n]) for n in MEMBERS), what)
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in MEMBERS}


def read_npy(path: Path, shape: tuple[int, ...] | None, kinds: str, what: str) -> np.ndarray:
    """The array of the npy file at ``path``, its header checked first: a dtype of ``kinds``, the
    ``shape`` the run's manifest gives (None: any shape that fits in memory), and a file as long as
    the header says. Raises ValueError naming what is wrong."""
    with open(path, "rb") as handle:
        found, dtype, header = _header(handle, what)
    if dtype.kind not in kinds:
        raise ValueError(f"it holds {dtype} values")
    if shape is not None and found != tuple(shape):
        raise ValueError(f"its shape is {found}, but the run's manifest says {tuple(shape)}")
    if Path(path).stat().st_size != header + _nbytes(found, dtype):
        raise ValueError(f"it is {Path(path).stat().st_size:,} bytes long, not the "
                         f"{header + _nbytes(found, dtype):,} its header declares")
    _check_memory(_nbytes(found, dtype), what)
    return np.load(path, allow_pickle=False)


def _check_memory(nbytes: int, what: str) -> None:
    from sinkscope.runtime.memory import available_memory

    memory = available_memory()
    if memory is not None and nbytes > memory:
        raise ValueError(f"{what} would take {nbytes:,} bytes, more than the {memory:,} available")


def _manifest_beside(path: Path) -> dict | None:
    """The run's manifest.json beside ``path``, or None (no manifest, or not one a run writes)."""
    file = path.parent / "manifest.json"
    if not file.is_file():
        return None
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def _count(value) -> int | None:
    """A non-negative integer from a manifest, or None (missing, or not one)."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _npz_limits(shapes: dict[str, tuple[int, ...]], manifest: dict | None) -> None:
    """``explorer.npz``'s shapes against each other and, where there is one, the run's manifest.

    W windows, K heads, T tokens per window, L layers and H heads per layer, N entries:

        heads (K, 2)  chosen (K,)  windows (W,)  labels (W, T)  blocks (W, K, 2)  indptr (W, K, T + 1)
        value_norms, phantom (W, K, T)  p0 (L, H)  meta (4,)  keys, codes (N,), N <= W K T (T + 1) / 2

    and from the manifest: W and K as its ``explorer`` record lists them, T its windows' ``seq_len``, W at
    most its ``n_seqs``, (L, H) its model's ``spec``.
    """
    K, W, T = shapes["heads"][0], shapes["windows"][0], shapes["labels"][1]
    want = {"heads": (K, 2), "chosen": (K,), "windows": (W,), "labels": (W, T), "blocks": (W, K, 2),
            "indptr": (W, K, T + 1), "value_norms": (W, K, T), "phantom": (W, K, T), "meta": (4,),
            "codes": shapes["keys"]}
    for name, shape in want.items():
        if shapes[name] != shape:
            raise ValueError(f"its member {name} has the shape {shapes[name]}, not {shape}")
    if shapes["keys"][0] > W * K * T * (T + 1) // 2:
        raise ValueError(f"it declares {shapes['keys'][0]:,} entries, more than {W} windows of {K} heads can hold")
    if manifest is None:
        return
    record = manifest.get("explorer") if isinstance(manifest.get("explorer"), dict) else {}
    windows = manifest.get("windows") if isinstance(manifest.get("windows"), dict) else {}
    spec = ((manifest.get("model") or {}).get("spec") or {}) if isinstance(manifest.get("model"), dict) else {}
    spec = spec if isinstance(spec, dict) else {}
    allowed = {"windows": len(record["windows"]) if isinstance(record.get("windows"), list) else None,
               "heads": len(record["heads"]) if isinstance(record.get("heads"), list) else None,
               "tokens per window": _count(windows.get("seq_len")),
               "layers": _count(spec.get("n_layers")), "heads per layer": _count(spec.get("n_heads"))}
    found = {"windows": W, "heads": K, "tokens per window": T, "layers": shapes["p0"][0],
             "heads per layer": shapes["p0"][1]}
    if allowed["windows"] is None and allowed["heads"] is None:
        raise ValueError("the run's manifest records no explorer")
    for name, value in found.items():
        if allowed[name] is not None and value != allowed[name]:
            raise ValueError(f"it holds {value:,} {name}, but the run's manifest says {allowed[name]:,}")
    n_seqs = _count(windows.get("n_seqs"))
    if n_seqs is not None and W > n_seqs:
        raise ValueError(f"it holds {W:,} windows of a run of {n_seqs:,}")
