"""A TransformerLens ``TransformerBridge`` measured through the Hugging Face model it wraps.

TransformerLens 4's bridge boots by replacing the HF model's submodules with components that
re-implement attention, so transformers' attention interface (sinkscope's capture) is never called;
each component keeps the module it replaced in ``original_component``. :func:`unbridged` puts those
back for a block, so the model runs its own code and the capture sees it, and returns the bridge's
components on exit (research/tl-bridge-hooks.md).
"""

from __future__ import annotations

import contextlib

import torch


def is_bridge(model) -> bool:
    """A TransformerLens ``TransformerBridge`` (it wraps a Hugging Face model in ``original_model``)."""
    return type(model).__name__ == "TransformerBridge" and isinstance(getattr(model, "original_model", None),
                                                                        torch.nn.Module)


@contextlib.contextmanager
def unbridged(model: torch.nn.Module):
    """The Hugging Face model inside a ``TransformerBridge``, as it was before the bridge, for the block.

    Booting a bridge replaces the HF model's submodules in place by bridge components that
    re-implement attention (so transformers' attention interface is never called); each keeps
    the module it replaced in ``original_component``. Inside this block those are put back, so
    the model runs its own code; on exit the bridge components return.
    """
    swaps: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []

    def restore(module: torch.nn.Module) -> None:
        for name, child in list(module.named_children()):
            original = getattr(child, "original_component", None)
            if isinstance(original, torch.nn.Module) and original is not child:
                setattr(module, name, original)
                swaps.append((module, name, child))
                restore(original)
            else:
                restore(child)

    hf_model = model.original_model
    restore(hf_model)
    try:
        yield hf_model
    finally:
        for module, name, child in reversed(swaps):
            setattr(module, name, child)
