"""The bundled trainer: a separate mini project that makes models to measure.

``model.py`` holds the decoder and every attention variant of SPEC.md; ``data.py`` the tokenizer,
token cache, split, window policies and seeded batches; ``tasks.py`` the data sources the loop
consumes (text, the trigger task) and ``checkpoint_windows``; ``loop.py`` the training loop
(``train``); and ``checkpoint.py`` the checkpoint folder every probe command accepts as MODEL.
"""

from sinkscope.train.checkpoint import is_checkpoint, load_checkpoint, save_checkpoint
from sinkscope.train.loop import TrainOptions, train
from sinkscope.train.tasks import checkpoint_windows
from sinkscope.train.model import (
    GPT,
    MODEL_TYPE,
    TIERS,
    VARIANTS,
    GPTConfig,
    Variant,
    lm_loss,
    load_balance_loss,
)

__all__ = ["GPT", "MODEL_TYPE", "TIERS", "VARIANTS", "GPTConfig", "TrainOptions", "Variant", "checkpoint_windows",
           "is_checkpoint", "lm_loss", "load_balance_loss", "load_checkpoint", "save_checkpoint", "train"]
