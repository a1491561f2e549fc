"""Nested tensor state in one safetensors file with a JSON header: nothing in it can run code.

A long run keeps its probes' accumulators for ``--resume`` in such a file (``run/measuring.py``).
The format is safetensors (a JSON header of names, dtypes, shapes and offsets, then the raw
bytes), never pickle, so a planted or damaged file can at worst be refused:

    metadata["sinkscope_state"]  the format version ("1")
    metadata["header"]           JSON chosen by the writer (the run's fingerprint, stage, next window)
    metadata["skeleton"]         JSON describing the nested structure, with tensor leaves by name

:func:`read_header` reads the JSON header alone (no tensor is read), so a caller checks that the
file belongs to its run before loading anything else; :func:`load_state` then rebuilds the tree.

The tree may hold tensors, numpy arrays, dicts (keys: str, int, float, bool or None), lists,
tuples, and JSON scalars (str, int, float, bool, None).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sinkscope.errors import SinkscopeError, option
from sinkscope.store.files import atomic_write_bytes, try_parse_json

FORMAT = "1"
_KEY_TYPES = (str, int, float, bool, type(None))


def _flatten(node: Any, tensors: dict) -> Any:
    """The skeleton of ``node``, its tensors added to ``tensors`` under ``t<k>`` names."""
    import numpy as np
    import torch

    if isinstance(node, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = node.detach().to("cpu").contiguous().clone()
        return {"t": name}
    if isinstance(node, np.ndarray):
        name = f"t{len(tensors)}"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(node).copy())
        return {"n": name}
    if isinstance(node, dict):
        bad = [k for k in node if not isinstance(k, _KEY_TYPES)]
        if bad:
            raise TypeError(f"a state dict key must be a str, number, bool or None, not {type(bad[0]).__name__}")
        return {"d": [[key, _flatten(value, tensors)] for key, value in node.items()]}
    if isinstance(node, list):
        return {"l": [_flatten(value, tensors) for value in node]}
    if isinstance(node, tuple):
        return {"u": [_flatten(value, tensors) for value in node]}
    if isinstance(node, _KEY_TYPES):
        return {"v": node}
    raise TypeError(f"a {type(node).__name__} cannot be stored in a state file (tensors, arrays, dicts, lists, "
                    "tuples and JSON scalars can)")


def _unflatten(node: Any, tensors: dict) -> Any:
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError("malformed skeleton")
    (kind, value), = node.items()
    if kind == "t":
        return tensors[value]
    if kind == "n":
        return tensors[value].numpy()
    if kind == "d":
        return {key: _unflatten(item, tensors) for key, item in value}
    if kind == "l":
        return [_unflatten(item, tensors) for item in value]
    if kind == "u":
        return tuple(_unflatten(item, tensors) for item in value)
    if kind == "v":
        return value
    raise ValueError(f"unknown skeleton node {kind!r}")


def save_state(path: Path, tree: Any, header: dict) -> None:
    """Write ``tree`` (with the JSON ``header``) to ``path`` atomically."""
    from safetensors.torch import save

    tensors: dict = {}
    skeleton = _flatten(tree, tensors)
    metadata = {"sinkscope_state": FORMAT, "header": json.dumps(header, sort_keys=True),
                "skeleton": json.dumps(skeleton)}
    atomic_write_bytes(Path(path), save(tensors, metadata=metadata))


def _damaged(path: Path, what: str, reason: str) -> SinkscopeError:
    return SinkscopeError(f"{what} {path} is damaged or was not written by sinkscope ({reason}); "
                          f"delete it, or run without {option('resume', True)}.")


def read_header(path: Path, what: str = "the state file") -> dict:
    """The JSON header of a state file, read without reading any tensor; one sentence if it is not one."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except Exception as error:  # noqa: BLE001 - safetensors raises its own types for a file that is not one
        raise _damaged(path, what, str(error).splitlines()[0][:120] if str(error) else type(error).__name__) from error
    if metadata.get("sinkscope_state") != FORMAT:
        raise _damaged(path, what, "no sinkscope state header")
    header, problem = try_parse_json(metadata["header"]) if isinstance(metadata.get("header"), str) else (None, "")
    if problem is not None:  # not JSON, or nested too deeply ([[[[...]]]] would be a RecursionError)
        raise _damaged(path, what, f"its header is not JSON{f' ({problem})' if problem else ''}")
    if not isinstance(header, dict):
        raise _damaged(path, what, "its header is not a JSON object")
    return header


def load_state(path: Path, what: str = "the state file") -> Any:
    """The tree a state file holds (check :func:`read_header` first); one sentence if it is damaged."""
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        skeleton, problem = try_parse_json(metadata["skeleton"])
        if problem is not None:
            raise ValueError(f"its skeleton is not JSON ({problem})")
        return _unflatten(skeleton, tensors)
    except Exception as error:  # noqa: BLE001 - any damage is one sentence
        raise _damaged(path, what, str(error).splitlines()[0][:120] if str(error) else type(error).__name__) from error
