"""How a model hands over its internals: named hook points, attention records, kernels, interventions.

Lives here: ``hooks.py`` (the hook points' names), ``discover.py`` and ``families.py`` (a family's
parts, found not listed; the rare quirk), ``attention.py`` (the registered attention functions and
the capture), ``record.py`` (``AttentionRecord``), ``kernels.py`` (fused attention with its
log-sum-exp), ``masks.py`` and ``window_masks.py``. Imports are lazy so that the hook-point table
(``sinkscope ls hooks``) is read without loading torch or transformers.
May import: data, models, store, runtime, errors; never probes (a capture knows no metric).
Add here: a model family that is not found on its own (a quirk in ``families.py``, with its reason).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "IMPLEMENTATION": "attention",
    "HookSink": "attention",
    "capture": "attention",
    "register_interfaces": "attention",
    "QUIRKS": "discover",
    "Parts": "discover",
    "discover": "discover",
    "ModelSpec": "families",
    "family_of": "families",
    "supported_families": "families",
    "AttentionRecord": "record",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
