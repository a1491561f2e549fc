"""The bundled trainer: a separate mini project that makes models to measure.

``model.py`` holds the decoder and every attention variant of SPEC.md, and ``taps.py`` how it
hands its hook points over; ``data.py`` the tokenizer, token cache, split, window policies and
seeded batches; ``tasks.py`` the data sources the loop consumes (text, the trigger task),
``checkpoint_windows`` and the ``key=value`` parser; ``config.py`` the options (``TrainOptions``),
tiers and their resolution; ``loop.py`` the training loop (``train``); and ``checkpoint.py`` the
checkpoint folder every probe command accepts as MODEL.
Names are imported on first use, so reading a checkpoint's config (the report does) needs no torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "is_checkpoint": "checkpoint", "load_checkpoint": "checkpoint", "save_checkpoint": "checkpoint",
    "TrainOptions": "config", "train": "loop", "checkpoint_windows": "tasks",
    "GPT": "model", "MODEL_TYPE": "model", "TIERS": "model", "VARIANTS": "model", "GPTConfig": "model",
    "Variant": "model", "lm_loss": "model", "load_balance_loss": "model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
