"""A HookedTransformer-like model measured through its own TransformerLens hooks (capture/hooked.py).

The model here is written against TransformerLens's ``HookedRootModule`` and ``HookPoint`` (kept in
TransformerLens 4): two attention-only blocks with TransformerLens's hook names and shapes. The
reference is the model's own ``hook_pattern`` and ``hook_v`` read with ``run_with_cache``, put through
SPEC.md's formulas by hand. The real ``HookedTransformer`` (TransformerLens 3) is checked in
tests/integration/test_hooked_transformer.py.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import sinkscope
from sinkscope.capture.hooked import HookedModel, is_hooked_transformer

tl = pytest.importorskip("transformer_lens")
from transformer_lens.hook_points import HookPoint  # noqa: E402

V, C, H, D, LAYERS, T = 50, 16, 2, 8, 2, 12


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.randn(C, H, D) / C ** 0.5) for _ in range(3))
        self.W_O = nn.Parameter(torch.randn(H, D, C) / D ** 0.5)
        for name in ("hook_q", "hook_k", "hook_v", "hook_pattern", "hook_z"):
            setattr(self, name, HookPoint())

    def forward(self, x):  # (B, T, C)
        q = self.hook_q(torch.einsum("btc,chd->bthd", x, self.W_Q))
        k = self.hook_k(torch.einsum("btc,chd->bthd", x, self.W_K))
        v = self.hook_v(torch.einsum("btc,chd->bthd", x, self.W_V))
        scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
        n = x.shape[1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        pattern = self.hook_pattern(scores.softmax(-1))  # (B, H, T, S)
        z = self.hook_z(torch.einsum("bhts,bshd->bthd", pattern, v))
        return torch.einsum("bthd,hdc->btc", z, self.W_O)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _Attention()
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x):
        x = self.hook_resid_pre(x)
        out = self.hook_attn_out(self.attn(x))
        return self.hook_resid_post(x + out)


class _TinyHooked(tl.HookedRootModule):
    """Attention-only, learned positions: ``cfg``, ``blocks``, ``hook_dict`` and ``hooks()`` as a HookedTransformer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.cfg = SimpleNamespace(n_layers=LAYERS, n_heads=H, d_head=D, d_model=C, d_vocab=V, n_ctx=64,
                                   positional_embedding_type="standard", attn_scale=math.sqrt(D), use_attn_scale=True,
                                   original_architecture="tiny")
        self.embed = nn.Embedding(V, C)
        self.blocks = nn.ModuleList(_Block() for _ in range(LAYERS))
        self.unembed = nn.Linear(C, V)
        self.setup()

    def forward(self, ids, return_type="logits"):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.unembed(x)


def _ids():
    return torch.randint(0, V, (3, T), generator=torch.Generator().manual_seed(1))


def test_a_hooked_model_is_told_apart_from_other_modules():
    assert is_hooked_transformer(_TinyHooked())
    assert not is_hooked_transformer(nn.Linear(2, 2))
    spec = HookedModel(_TinyHooked()).model_spec()
    assert (spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.head_dim) == (LAYERS, H, H, D)
    assert "blocks.{l}.mlp.hook_pre" in spec.missing_hooks and "blocks.{l}.attn" not in spec.missing_hooks


def test_p0_mass_and_value_norms_are_the_models_own_pattern_and_values():
    model, ids = _TinyHooked().eval(), _ids()
    result = sinkscope.measure("sinks", model, windows=ids, progress=False)
    table = result.table
    _, cache = model.run_with_cache(ids)
    heads = table[table["layer"].notna() & table["head"].notna()]
    for layer in range(LAYERS):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]  # (B, H, T, S)
        p0 = pattern[..., 1:, 0].mean((0, 2))  # SPEC.md p0_mass: queries i >= 1, then windows
        mine = heads[(heads.metric == "p0_mass") & (heads["layer"] == layer)].sort_values("head").value
        assert torch.allclose(torch.tensor(mine.to_numpy(), dtype=torch.float32), p0, atol=1e-6)
        norms = cache[f"blocks.{layer}.attn.hook_v"].norm(dim=-1)  # (B, S, H)
        ratio = (norms[:, 0] / norms[:, 1:].double().quantile(0.5, dim=1).float()).mean(0)  # SPEC.md r0
        mine = heads[(heads.metric == "value_norm_ratio") & (heads["layer"] == layer)].sort_values("head").value
        assert torch.allclose(torch.tensor(mine.to_numpy(), dtype=torch.float32), ratio, atol=1e-5)
    assert model.training is False  # the model leaves in the mode it came in



def test_what_a_hooked_model_cannot_give_is_one_sentence():
    from sinkscope.errors import SinkscopeError

    model = _TinyHooked()
    with pytest.raises(SinkscopeError, match="key-value cache, which a HookedTransformer does not expose"):
        sinkscope.measure("stream", model, windows=_ids()[:1], length=T, policy="full,window", cache=4,
                          positions="original", mode="mask", progress=False)
    with pytest.raises(SinkscopeError, match="own run_with_cache gives these names"):
        sinkscope.trace(model, _ids()[:1])


def test_the_manifest_names_the_class_and_the_hooks_an_sae_sits_at(tmp_path):
    model = _TinyHooked()
    model.acts_to_saes = {"blocks.1.hook_resid_pre": object()}  # as SAELens's HookedSAETransformer keeps them
    result = sinkscope.measure("sinks", model, windows=_ids(), progress=False, figures=False, out=str(tmp_path / "run"))
    assert result.manifest["model"]["transformer_lens"] == {"class": "_TinyHooked",
                                                             "saes_at": ["blocks.1.hook_resid_pre"]}
