"""A MODEL's config, read from disk without loading weights, torch-free.

Resolving the model, the context length, the layer count, the vocabulary, whether it has a
phantom key and the size check (``models.size``) all read config.json: a folder's, a trainer
checkpoint's ``model`` section (``models.checkpoint_folder.read_config``), a GGUF's cached
float32 conversion (``<cache>/gguf/<stem>-<content key>``), or a hub id's in the local Hugging
Face cache. Each is parsed once per version of the file (``store.files.read_json_once``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from sinkscope.errors import SinkscopeError
from sinkscope.models.resolve import Source
from sinkscope.models.checkpoint_folder import read_config
from sinkscope.models.trainer_config import VARIANTS
from sinkscope.runtime.paths import cache_root
from sinkscope.store.files import atomic_write_text


# ---- the GGUF cache's key --------------------------------------------------------------------------


def _file_identity(path: Path) -> list[int]:
    """What changes whenever a file's bytes can have changed: device, inode, size, mtime and ctime (ns).

    ctime cannot be set back by a user (``touch -r`` and ``os.utime`` set mtime, and move ctime to now).
    """
    info = path.stat()
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


#: real path -> (file identity, content key) of the GGUF files this process has keyed.
_KEYS: dict[str, tuple[list[int], str]] = {}


def _gguf_cache_key(path: Path) -> str:
    """A content key for a GGUF file: the SHA-256 of all of its bytes, computed once per version of the file.

    The hash is kept in ``<cache>/gguf-hashes.json`` under the file's real path with its
    :func:`_file_identity`; a later load whose identity matches reuses it (no read), and any edit,
    copy or replacement changes the identity and so rehashes. (Keying on the size and the first and
    last MiB, as earlier versions did, measured a GGUF edited in the middle as the stale original.)
    """
    path = Path(path)
    real = os.path.realpath(path)
    identity = _file_identity(path)
    memo = _KEYS.get(real)
    if memo is not None and memo[0] == identity:  # this process asked already (a run asks several times)
        return memo[1]
    index_file = cache_root() / "gguf-hashes.json"
    from sinkscope.store.files import read_json

    try:
        index = read_json(index_file, "the index of GGUF hashes", expect=dict, missing_ok=True) or {}
    except SinkscopeError:  # a damaged index (not JSON, [[[[...]]]]) is rewritten: a rehash, never a failure
        index = {}
    known = index.get(real)
    if isinstance(known, dict) and known.get("identity") == identity and isinstance(known.get("sha256"), str):
        _KEYS[real] = (identity, known["sha256"][:16])
        return known["sha256"][:16]
    sha256 = _file_sha256(path)
    _KEYS[real] = (identity, sha256[:16])
    index[real] = {"identity": identity, "sha256": sha256}
    try:
        index_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(index_file, json.dumps(index, indent=1) + "\n")
    except OSError:  # an unwritable cache costs a rehash next time, never this run
        pass
    return sha256[:16]


def gguf_cache_dir(path: Path) -> Path:
    """Where the float32 conversion of a GGUF file is cached: ``<cache>/gguf/<stem>-<content key>``."""
    return cache_root() / "gguf" / f"{path.stem}-{_gguf_cache_key(path)}"


# ---- config.json -----------------------------------------------------------------------------------


def check_json_files(source: Source) -> None:
    """Read the JSON files transformers will parse for ``source`` (``resolve.check_model_files``) first, so a
    damaged one (not JSON, ``[[[[...]]]]``) is one sentence naming it: a folder's or checkpoint's, and a hub
    model's in the local Hugging Face cache. A GGUF's cached conversion is rebuilt instead (``_gguf_cached``)."""
    from sinkscope.models.resolve import check_model_files

    if source.kind in ("folder", "checkpoint"):
        check_model_files(source.path)
    elif source.kind == "hub":
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source.location, "config.json", revision=source.revision)
        except Exception:  # noqa: BLE001 - an id the cache cannot hold: the loader says so
            cached = None
        if isinstance(cached, str):
            check_model_files(Path(cached).parent)


def _config(source: Source) -> dict | None:
    """The model's config file as a dict, without loading weights (None if there is none yet).

    Read once per version of the file (``fileio.read_json_once``): resolving the model, the context
    length, the layer count, the vocabulary, the phantom and the size check all ask, and config.json
    is parsed once; each caller gets its own copy.
    """
    config_file = None
    if source.kind in ("folder", "checkpoint"):
        config_file = Path(source.path) / "config.json"
    elif source.kind == "gguf":
        config_file = gguf_cache_dir(Path(source.path)) / "config.json"
    if config_file is None or not config_file.is_file():
        return None
    from sinkscope.store.files import read_json_once

    try:
        config = read_json_once(config_file, "the model's config.json", expect=dict)
    except SinkscopeError:
        if source.kind != "gguf":
            raise
        return None  # the cached conversion's: rebuilt from the GGUF when the model loads
    if source.kind == "checkpoint":  # checked: a damaged config.json is one sentence, not a TypeError later
        return read_config(source.path)["model"]
    return config


def check_model_size(source: Source) -> None:
    """Refuse, before anything is allocated, a config whose sizes are not positive integers or whose
    weights cannot fit in this machine's memory (``model_size.check_config_sizes``). A hub id is read
    from the local cache when it is there; a GGUF file is bounded by its own size."""
    from sinkscope.models.size import check_config_sizes

    if source.kind == "hub":
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source.location, "config.json", revision=source.revision)
        except Exception:  # noqa: BLE001 - an id the cache cannot hold: the loader says so
            cached = None
        if not isinstance(cached, str):
            return
        file = Path(cached)
        try:
            config = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return  # the loader names a damaged file
        where = f"the config.json of {source.location} (in the Hugging Face cache)"
    elif source.kind in ("folder", "checkpoint"):
        config = _config(source)
        where = f"the config.json of {source.location}"
    else:
        return
    if isinstance(config, dict):
        check_config_sizes(config, where)


def config_file_dict(source: Source) -> dict | None:
    """The model's config as a dict (a trainer checkpoint's ``model`` section), read from disk without
    loading weights; None when there is no config file to read yet (a hub id not cached)."""
    return _config(source)


def context_length(source: Source) -> int | None:
    """The model's context length from its config file, without loading weights (None if unknown)."""
    config = _config(source) or {}
    return config.get("block_size") or config.get("max_position_embeddings") or config.get("n_positions")


def layer_count(source: Source) -> int | None:
    """The model's number of decoder layers from its config file, without loading weights (None if unknown)."""
    config = _config(source) or {}
    return config.get("num_hidden_layers") or config.get("n_layer") or config.get("num_layers")


def has_phantom_key(source: Source) -> bool | None:
    """Whether the model has a learned phantom key (gpt-oss sinks; the trainer's phantom variants),
    from its config file without loading weights; None when there is no config to read yet."""
    config = _config(source)
    if config is None:
        return None
    if source.kind == "checkpoint":
        variant = VARIANTS.get(config.get("variant"))
        return None if variant is None else variant.has_phantom
    return config.get("model_type") == "gpt_oss" if "model_type" in config else None


def vocab_size(source: Source) -> int | None:
    """The model's embedding rows from its config file, without loading weights (None if unknown)."""
    return (_config(source) or {}).get("vocab_size")
