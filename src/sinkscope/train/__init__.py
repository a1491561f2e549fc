"""The bundled trainer: a separate mini project that makes models to measure (and watches them form sinks).

Lives here: ``model.py`` (the decoder and every attention variant of SPEC.md) and ``taps.py`` (how
it hands its hook points over); ``data.py`` (tokenizer, token cache, split, window policies, seeded
batches); ``tasks.py`` (text, the trigger task, ``checkpoint_windows``); ``config.py``
(``TrainOptions``, tiers and their resolution); ``loop.py`` (``train``); ``checkpoint.py`` (the
checkpoint folder every probe command accepts as MODEL); ``monitor.py`` (``SinkMonitor``: sink probes
during any training loop). Names are imported on first use, so reading a checkpoint's config needs no torch.
May import: forward, probes, capture, kvcache, stats, report, data, models, store, runtime; never
commands, run or anything above.
Add here: a trainer variant (``models/trainer_config.py``'s ``VARIANTS`` and ``model.py``), with its test.
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
