"""The model's trained context, and what a run longer than it gets (issue 42; SPEC.md "Past the trained context").

Two kinds of position encoding meet a window longer than the model was trained on:

- **Computed positions** (RoPE, ALiBi, none): every position has an encoding, only an untrained
  one. The run continues after one warning line naming the trained length
  (``max_position_embeddings``, ``n_positions``, ``n_ctx``), and the manifest records it: sink
  mass past the trained context is a measurement of its own (length extrapolation), not an error.
- **A learned position table** (GPT-2's ``wpe``, OPT's ``embed_positions``, the bundled trainer's
  ``wpe``): positions past its last row do not exist, and the model would fail with an index
  error deep in its forward, so the run stops first, in one sentence naming the table.
"""

from __future__ import annotations

from typing import Callable, Mapping

from torch import nn

from sinkscope.errors import SinkscopeError, option

#: config keys of the trained context, in the order they are read.
CONTEXT_KEYS = ("block_size", "max_position_embeddings", "n_positions", "n_ctx")
#: names a learned absolute position table has in transformers' models and the bundled trainer.
POSITION_TABLE_NAMES = ("wpe", "embed_positions", "position_embeddings", "pos_emb", "position_embedding")


def config_context(config: Mapping | object | None) -> int | None:
    """The trained context from a config (a dict read from config.json, or a transformers config), or None."""
    if config is None:
        return None
    for key in CONTEXT_KEYS:
        value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def learned_positions(model: nn.Module) -> tuple[str, int] | None:
    """The learned absolute position table, as (its module path, the positions it holds), or None.

    An ``nn.Embedding`` whose attribute name is one of :data:`POSITION_TABLE_NAMES` (a rotary or
    sinusoidal module is no ``nn.Embedding``). OPT's table keeps ``offset`` (2) rows before position
    0, which are not positions.
    """
    for path, module in model.named_modules():
        if isinstance(module, nn.Embedding) and path.rsplit(".", 1)[-1] in POSITION_TABLE_NAMES:
            return path, module.num_embeddings - int(getattr(module, "offset", 0) or 0)
    return None


def is_native_config(config: Mapping | None) -> bool:
    """A bundled trainer checkpoint's model section (``block_size``): its positions are a learned table."""
    return isinstance(config, Mapping) and "block_size" in config


def require_positions(seq_len: int | None, table: tuple[str, int] | None) -> None:
    """Stop, in one sentence, where a window is longer than a learned position table."""
    if seq_len is None or table is None or seq_len <= table[1]:
        return
    path, rows = table
    raise SinkscopeError(f"{option('seq_len')} {seq_len} is past the model's learned position table ({path}, "
                         f"{rows} positions): positions past {rows} do not exist in it; use at most {rows}.")


def warn_past_context(seq_len: int | None, trained: int | None, log: Callable[[str], None]) -> bool:
    """One warning line where ``seq_len`` is past the trained context; True where it is (the run continues)."""
    if seq_len is None or trained is None or seq_len <= trained:
        return False
    log(f"warning: the windows ({seq_len} tokens) are past the model's trained context of {trained} tokens; "
        f"positions {trained} to {seq_len - 1} were never trained on (the run continues, and its manifest records it).")
    return True
