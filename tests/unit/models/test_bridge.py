"""models/bridge.py on a stand-in bridge: unbridged puts the replaced modules back for the block and the bridge's
components after it, at any depth (the real TransformerLens bridge: tests/integration/test_api.py)."""

from __future__ import annotations

import torch

from sinkscope.models.bridge import is_bridge, unbridged


class Component(torch.nn.Module):
    """A bridge component: it replaced ``original_component`` in the model."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.original_component = original


class TransformerBridge(torch.nn.Module):  # the name is how a bridge is recognised
    def __init__(self, original_model: torch.nn.Module):
        super().__init__()
        self.original_model = original_model


def test_unbridged_restores_the_originals_for_the_block_only():
    inner = torch.nn.Linear(2, 2)
    block = torch.nn.Module()
    block.attn = torch.nn.Module()
    block.attn.proj = inner
    hf = torch.nn.Module()
    hf.block = block
    bridged_attn = Component(block.attn)  # the bridge replaced the attention module...
    block.attn = bridged_attn
    bridge = TransformerBridge(hf)
    assert is_bridge(bridge) and not is_bridge(hf) and not is_bridge(TransformerBridge.__new__(TransformerBridge))
    with unbridged(bridge) as model:
        assert model is hf and model.block.attn is bridged_attn.original_component and model.block.attn.proj is inner
    assert hf.block.attn is bridged_attn  # the bridge's component is back
