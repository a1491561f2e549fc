"""Trainer checkpoints for tests, written without training: the trainer's GPT at its initial weights,
saved as ``sinkscope train`` saves one (an optimizer that never stepped)."""

from __future__ import annotations

import torch

from sinkscope.train.checkpoint import save_checkpoint
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT


def trainer_checkpoint(folder, variant: str, tokenizer, seed: int = 0, tier: str = "test", **fields):
    """A 2-layer, 2-head, width-32 ``variant`` checkpoint in ``folder`` (context 64); returns the folder."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=len(tokenizer), block_size=64, n_layer=2, n_head=2, n_embd=32,
                          variant=variant, **fields))
    save_checkpoint(folder, model, None, step=0, train_state=None, tokenizer=tokenizer,
                    meta={"tier": tier, "seed": seed})
    return folder
