"""How a model hands over its internals: named hook points, attention records, interventions.

``capture(model, sink)`` attaches the hook points a sink asks for (``hooks.py`` names them);
``AttentionRecord`` is what attention probes see. Imports are lazy so that the hook-point table
(``sinkscope ls hooks``) is read without loading torch or transformers.
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
