"""The bundled trainer: ``model.py`` holds the decoder and every attention variant of SPEC.md."""

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

__all__ = ["GPT", "MODEL_TYPE", "TIERS", "VARIANTS", "GPTConfig", "Variant", "lm_loss", "load_balance_loss"]
