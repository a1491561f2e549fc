"""Token ids of a document cached by content: a run on the same text with the same tokenizer reads its
ids back instead of tokenising again (the bundled corpus: about a million tokens, 2-6 s per run).

The key is the document's sha256 and the tokenizer's fingerprint (its class and its whole
serialised state: vocabulary, merges, normaliser, pre-tokeniser, added tokens), so an edited text or
another tokenizer never shares an entry. Entries are ``<cache>/tokens/<fingerprint>/<text sha>.npy``,
written atomically and read with ``allow_pickle=False``; one that is damaged, of the wrong dtype or
shape, or holds an id outside the tokenizer's vocabulary is ignored and rewritten. ``SINKSCOPE_CACHE``
moves the cache (``runtime.paths.cache_root``); ``SINKSCOPE_TOKEN_CACHE=off`` turns it off.
"""

from __future__ import annotations

import hashlib
import io
import os
import weakref
from collections.abc import Callable

import numpy as np

from sinkscope.runtime.paths import cache_root

ENVIRONMENT = "SINKSCOPE_TOKEN_CACHE"
#: documents shorter than this are tokenised without the cache (not worth a file).
MIN_CHARS = 20_000
_FINGERPRINTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def fingerprint(tokenizer) -> str | None:
    """A stable hash of everything that decides a tokenizer's ids, or None where it cannot be read (then
    nothing is cached)."""
    try:
        return _FINGERPRINTS[tokenizer]
    except (KeyError, TypeError):
        pass
    digest = hashlib.sha256(f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}\n".encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        if backend is not None:
            digest.update(backend.to_str().encode("utf-8"))
        else:
            vocab = tokenizer.get_vocab()
            digest.update(repr(sorted(vocab.items())).encode("utf-8"))
        digest.update(repr(sorted(map(str, getattr(tokenizer, "all_special_tokens", []) or []))).encode("utf-8"))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot describe itself is never cached
        return None
    value = digest.hexdigest()[:24]
    try:
        _FINGERPRINTS[tokenizer] = value
    except TypeError:
        pass
    return value


def cached_ids(tokenizer, text: str, tokenize: Callable[[str], list[int]], vocab_size: int | None) -> np.ndarray:
    """``text``'s ids (int64): read from the cache, or tokenised with ``tokenize`` and stored."""
    key = fingerprint(tokenizer) if len(text) >= MIN_CHARS and os.environ.get(ENVIRONMENT, "").lower() != "off" \
        else None
    if key is None:
        return np.asarray(tokenize(text), dtype=np.int64)
    path = cache_root() / "tokens" / key / f"{hashlib.sha256(text.encode('utf-8')).hexdigest()[:32]}.npy"
    found = _read(path, vocab_size)
    if found is not None:
        return found
    ids = np.asarray(tokenize(text), dtype=np.int64)
    _write(path, ids)
    return ids


def _read(path, vocab_size: int | None) -> np.ndarray | None:
    try:
        ids = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if ids.dtype != np.int64 or ids.ndim != 1 or (ids.size and (ids.min() < 0 or (
            vocab_size is not None and ids.max() >= vocab_size))):
        return None
    return ids


def _write(path, ids: np.ndarray) -> None:
    from sinkscope.store.files import atomic_write_bytes

    buffer = io.BytesIO()
    np.save(buffer, ids, allow_pickle=False)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffer.getvalue())
    except OSError:  # an unwritable cache costs a tokenisation next time, never this run
        pass
