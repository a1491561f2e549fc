"""The named hook points on every family: each equals an independent reading of the model.

The references never use the capture: they are forward hooks registered here on the modules
themselves (the output projection, the norms, the MLP) and the model's own logits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from collect import Collect
from sinkscope.capture import hooks as hp, capture
from sinkscope.capture.attention import head_results
from sinkscope.capture.discover import find_submodule
from sinkscope.capture.families import ModelSpec, get_submodule
from sinkscope.errors import SinkscopeError
from tiny_models import PATHS, FAMILY_NAMES, build, random_ids

MOE = {"gpt_oss", "qwen3_next"}  # no dense MLP: no mlp.hook_pre
STREAM = (hp.RESID_PRE, hp.RESID_MID, hp.RESID_POST, hp.LN1_NORMALIZED, hp.ATTN_OUT, hp.ATTN_Z, hp.ATTN_RESULT)


def _parts(model, family: str, layer: int):
    layer_module = get_submodule(model, PATHS[family].layers)[layer]
    return layer_module, PATHS[family]


def _module_io(module, store: dict, key: str):
    """Forward hook keeping the module's (first input, first output)."""
    def hook(_m, args, kwargs, out):
        store[key] = (args[0] if args else kwargs["hidden_states"], out[0] if isinstance(out, tuple) else out)
    return module.register_forward_hook(hook, with_kwargs=True)


def _parallel(model, family) -> bool:
    return PATHS[family].parallel


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("mode", ["explicit", "fused"])
def test_stream_hooks_equal_the_models_own_tensors(family, mode):
    model = build(family)
    spec = ModelSpec.from_model(model)
    ids = random_ids(2, 20)
    reference: dict = {}
    handles = []
    for layer in range(spec.n_layers):
        layer_module, fam = _parts(model, family, layer)
        handles.append(_module_io(layer_module, reference, f"layer{layer}"))
        handles.append(_module_io(find_submodule(layer_module, fam.ln1), reference, f"ln1{layer}"))
        out_proj = find_submodule(layer_module, fam.out_proj)
        if out_proj is not None:
            handles.append(_module_io(out_proj, reference, f"o{layer}"))
            handles.append(_module_io(find_submodule(layer_module, fam.attn_out), reference, f"added{layer}"))
    collect = Collect(*STREAM)
    with torch.no_grad():
        plain = model(ids).logits
        with capture(model, collect, mode=mode):
            logits = model(ids).logits
    for handle in handles:
        handle.remove()
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)
    values = collect.values
    for layer in range(spec.n_layers):
        block_in, block_out = reference[f"layer{layer}"]
        torch.testing.assert_close(values[hp.RESID_PRE][layer], block_in, atol=1e-6, rtol=0)
        torch.testing.assert_close(values[hp.RESID_POST][layer], block_out, atol=1e-6, rtol=0)
        if layer + 1 < spec.n_layers:  # resid_post of l is resid_pre of l + 1, exactly
            assert torch.equal(values[hp.RESID_POST][layer], values[hp.RESID_PRE][layer + 1])
        torch.testing.assert_close(values[hp.LN1_NORMALIZED][layer], reference[f"ln1{layer}"][1], atol=1e-6, rtol=0)
        if layer not in spec.attention_layers:
            assert layer not in values[hp.ATTN_Z] and layer not in values[hp.ATTN_OUT]
            continue
        o_in, o_out = reference[f"o{layer}"]
        z, results = values[hp.ATTN_Z][layer], values[hp.ATTN_RESULT][layer]
        assert z.shape == (2, 20, spec.n_heads, spec.head_dim)
        assert results.shape == (2, 20, spec.n_heads, spec.hidden_size)
        assert torch.equal(z.reshape(2, 20, -1), o_in)
        _, o_module = _parts(model, family, layer)[0], find_submodule(_parts(model, family, layer)[0],
                                                                       PATHS[family].out_proj)
        bias = o_module.bias if getattr(o_module, "bias", None) is not None else 0.0
        # the sum over heads of hook_result plus the projection's bias is the projection's output
        torch.testing.assert_close(results.sum(dim=2) + bias, o_out, atol=1e-5, rtol=0)
        added = values[hp.ATTN_OUT][layer]
        torch.testing.assert_close(added, reference[f"added{layer}"][1], atol=0, rtol=0)
        if family == "gemma3_text":  # Gemma 3 normalises the attention output before adding it
            layer_module = _parts(model, family, layer)[0]
            torch.testing.assert_close(added, layer_module.post_attention_layernorm(o_out), atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(results.sum(dim=2) + bias, added, atol=1e-5, rtol=0)
        mid = values[hp.RESID_MID][layer]
        assert torch.equal(mid, values[hp.RESID_PRE][layer] + added)  # what the block adds, exactly


@pytest.mark.parametrize("family", sorted(set(FAMILY_NAMES) - MOE))
def test_mlp_pre_is_the_mlps_first_projection(family):
    model = build(family)
    spec = ModelSpec.from_model(model)
    fam = PATHS[family]
    ids = random_ids(2, 16)
    collect = Collect(hp.RESID_PRE, hp.RESID_MID, hp.MLP_PRE, *([hp.MLP_PRE_LINEAR] if fam.mlp_pre_linear else []))
    with torch.no_grad(), capture(model, collect):
        model(ids)
    for layer in range(spec.n_layers):
        layer_module = _parts(model, family, layer)[0]
        norm = find_submodule(layer_module, fam.ln2)
        mlp_input = values_in = collect.values[hp.RESID_PRE if _parallel(model, family) else hp.RESID_MID][layer]
        normed = norm(values_in)
        first = find_submodule(layer_module, fam.mlp_pre)
        weight = first.weight.T if fam.out_proj_conv1d else first.weight  # GPT-2 Conv1D keeps (in, out)
        expected = F.linear(normed, weight, first.bias)  # the projection written out
        torch.testing.assert_close(collect.values[hp.MLP_PRE][layer], expected, atol=1e-5, rtol=0)
        if fam.mlp_pre_linear:
            up = find_submodule(layer_module, fam.mlp_pre_linear)
            torch.testing.assert_close(collect.values[hp.MLP_PRE_LINEAR][layer], F.linear(normed, up.weight, up.bias),
                                       atol=1e-5, rtol=0)
        assert mlp_input.shape == (2, 16, spec.hidden_size)


@pytest.mark.parametrize("family", sorted(MOE))
def test_mixture_of_experts_has_no_mlp_pre(family):
    model = build(family)
    with pytest.raises(SinkscopeError) as info:
        with capture(model, Collect(hp.MLP_PRE)):
            pass
    assert "blocks.{l}.mlp.hook_pre" in str(info.value) and "\n" not in str(info.value)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # nothing left behind


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("mode", ["explicit", "fused"])
def test_identity_interventions_leave_logits_unchanged(family, mode):
    model = build(family)
    ids = random_ids(2, 20)
    identity = {hp.ATTN_V: lambda layer, v: v.clone(), hp.ATTN_Z: lambda layer, z: z.clone()}
    with torch.no_grad():
        plain = model(ids).logits
        with capture(model, Collect(hp.ATTN_Z, replacements=identity), mode=mode):
            logits = model(ids).logits
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_zeroing_a_head_removes_exactly_its_result(family):
    """hook_z with head 1 zeroed: the projection's output loses exactly hook_result[..., 1, :]."""
    model = build(family)
    spec = ModelSpec.from_model(model)
    ids = random_ids(2, 20)
    layer = spec.attention_layers[-1]
    clean = Collect(hp.ATTN_RESULT)

    def zero_head(l, z):
        if l != layer:
            return z
        z = z.clone()
        z[:, :, 1] = 0
        return z

    ablated = Collect(hp.ATTN_RESULT, replacements={hp.ATTN_Z: zero_head})
    reference = {}
    out_proj = find_submodule(_parts(model, family, layer)[0], PATHS[family].out_proj)
    with torch.no_grad():
        handle = _module_io(out_proj, reference, "clean")
        with capture(model, clean):
            plain = model(ids).logits
        handle.remove()
        handle = _module_io(out_proj, reference, "ablated")
        with capture(model, ablated):
            logits = model(ids).logits
        handle.remove()
    expected = reference["clean"][1] - clean.values[hp.ATTN_RESULT][layer][:, :, 1]
    torch.testing.assert_close(reference["ablated"][1], expected, atol=1e-5, rtol=0)
    assert torch.all(ablated.values[hp.ATTN_RESULT][layer][:, :, 1] == 0)  # observers see the value used
    assert not torch.allclose(logits, plain, atol=1e-4)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("mode", ["explicit", "fused"])
def test_zero_values_zero_every_head_output(family, mode):
    """hook_v replaced by zeros: every head mixes zeros, so z is 0 (the replacement acts before mixing)."""
    model = build(family)
    ids = random_ids(2, 16)
    collect = Collect(hp.ATTN_Z, hp.ATTN_V, replacements={hp.ATTN_V: lambda layer, v: torch.zeros_like(v)})
    with torch.no_grad(), capture(model, collect, mode=mode):
        model(ids)
    spec = ModelSpec.from_model(model)
    for layer in spec.attention_layers:
        v = collect.values[hp.ATTN_V][layer]
        assert v.shape == (2, 16, spec.n_kv_heads, spec.head_dim) and torch.all(v == 0)
        assert torch.all(collect.values[hp.ATTN_Z][layer] == 0)


def test_capture_installs_only_what_is_asked():
    model = build("llama")
    spec = ModelSpec.from_model(model)

    def hook_count():
        return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())

    with capture(model, Collect(hp.RESID_POST), mode="explicit"):
        assert hook_count() == spec.n_layers
        assert model.config._attn_implementation == "eager"  # explicit, no attention point asked: not switched
    with capture(model, Collect(hp.RESID_POST)):  # fused: the fused kernel even for the residual stream alone
        assert hook_count() == spec.n_layers
        assert model.config._attn_implementation == "sinkscope_fused"
    with capture(model, Collect(hp.ATTN), mode="fused"):
        assert hook_count() == 0 and model.config._attn_implementation == "sinkscope_fused"
    assert hook_count() == 0 and model.config._attn_implementation == "eager"


def test_head_results_use_the_conv1d_layout():
    """GPT-2's Conv1D keeps W_O as (in, out): hook_result must index it that way."""
    model = build("gpt2")
    c_proj = model.transformer.h[0].attn.c_proj
    z = torch.randn(1, 3, 4, 16)
    results = head_results(z, c_proj, conv1d=True)
    torch.testing.assert_close(results.sum(2) + c_proj.bias, c_proj(z.reshape(1, 3, 64)), atol=1e-5, rtol=0)


def test_unknown_hook_point_suggests_the_name():
    with pytest.raises(SinkscopeError) as info:
        hp.parse("blocks.3.hook_resid_psot")
    assert "did you mean 'blocks.{l}.hook_resid_post'" in str(info.value)
    assert hp.parse("blocks.3.attn.hook_z") == (hp.ATTN_Z, 3) and hp.parse("tokens") == (hp.TOKENS, None)


# ---- the bundled trainer emits the same points natively ------------------------------------------

TRAINER_VARIANTS = ["baseline", "sinklogit", "sinktoken", "normgate", "projgate", "sink+proj", "routing-norm",
                    "outgate"]


def _trainer_model(variant: str, **fields):
    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=64, block_size=32, n_layer=3, n_head=4, n_embd=32, variant=variant, **fields)
    return GPT(config).eval()


@pytest.mark.parametrize("variant", TRAINER_VARIANTS)
@pytest.mark.parametrize("attention", ["explicit", "fused"])
def test_trainer_hook_points_equal_the_models_own_tensors(variant, attention):
    model = _trainer_model(variant)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    reference: dict = {}
    handles = []
    for layer, block in enumerate(model.transformer.h):
        handles.append(_module_io(block.attn.c_proj, reference, f"o{layer}"))
        handles.append(_module_io(block.ln_2, reference, f"ln2{layer}"))
    collect = Collect(*STREAM, hp.MLP_PRE)
    with torch.no_grad():
        plain, _ = model(ids, attention=attention)
        logits, _ = model(ids, attention=attention, hooks=collect)
    for handle in handles:
        handle.remove()
    torch.testing.assert_close(logits, plain, atol=0, rtol=0)
    values, C = collect.values, model.config.n_embd
    T = 17 if variant == "sinktoken" else 16  # the sink token sits at position 0 of every point
    for layer, block in enumerate(model.transformer.h):
        assert values[hp.RESID_PRE][layer].shape == (2, T, C)
        if layer + 1 < 3:
            assert torch.equal(values[hp.RESID_POST][layer], values[hp.RESID_PRE][layer + 1])
        torch.testing.assert_close(values[hp.LN1_NORMALIZED][layer], block.ln_1(values[hp.RESID_PRE][layer]),
                                   atol=1e-6, rtol=0)
        o_in, o_out = reference[f"o{layer}"]
        assert torch.equal(values[hp.ATTN_Z][layer].reshape(2, T, C), o_in)
        results = values[hp.ATTN_RESULT][layer]
        torch.testing.assert_close(results.sum(dim=2), o_out, atol=1e-6, rtol=0)  # no bias in the trainer
        assert torch.equal(values[hp.ATTN_OUT][layer], o_out)
        assert torch.equal(values[hp.RESID_MID][layer], values[hp.RESID_PRE][layer] + o_out)
        ln2_in, ln2_out = reference[f"ln2{layer}"]
        assert torch.equal(ln2_in, values[hp.RESID_MID][layer])
        torch.testing.assert_close(values[hp.MLP_PRE][layer], F.linear(ln2_out, block.mlp.c_fc.weight), atol=1e-6,
                                   rtol=0)
    # the final norm reads the last resid_post: the logits follow from it
    last = values[hp.RESID_POST][2]
    head = model.lm_head(model.transformer.ln_f(last))[:, (1 if variant == "sinktoken" else 0):]
    torch.testing.assert_close(head, logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", TRAINER_VARIANTS)
@pytest.mark.parametrize("attention", ["explicit", "fused"])
def test_trainer_identity_interventions_leave_logits_unchanged(variant, attention):
    model = _trainer_model(variant)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(2))
    identity = {hp.ATTN_V: lambda layer, v: v.clone(), hp.ATTN_Z: lambda layer, z: z.clone()}
    with torch.no_grad():
        plain, _ = model(ids, attention=attention)
        logits, _ = model(ids, attention=attention, hooks=Collect(hp.ATTN_Z, replacements=identity))
        zeroed = Collect(hp.ATTN_Z, replacements={hp.ATTN_V: lambda layer, v: torch.zeros_like(v)})
        changed, _ = model(ids, attention=attention, hooks=zeroed)
    torch.testing.assert_close(logits, plain, atol=1e-6, rtol=0)
    assert not torch.allclose(changed, plain, atol=1e-4)
    assert all(torch.all(z == 0) for z in zeroed.values[hp.ATTN_Z].values())  # every head mixed zeros


def test_trainer_value_replacement_acts_before_the_value_gate():
    """hook_v doubled: the norm gate reads the doubled values (g = sigmoid(beta(||2v||/sqrt(D) - tau)))."""
    model = _trainer_model("normgate")
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    collect = Collect(hp.ATTN, hp.ATTN_V, replacements={hp.ATTN_V: lambda layer, v: 2 * v})
    with torch.no_grad():
        model(ids, hooks=collect)
    for layer, block in enumerate(model.transformer.h):
        record, v = collect.values[hp.ATTN][layer], collect.values[hp.ATTN_V][layer]  # v: (B, S, H, D), replaced
        norm = v.float().norm(dim=-1).transpose(1, 2) / v.shape[-1] ** 0.5  # (B, H, S)
        expected = torch.sigmoid(8.0 * (norm - block.attn.gate_tau.view(1, -1, 1)))
        torch.testing.assert_close(record.value_gate, expected, atol=1e-6, rtol=0)
        assert torch.equal(record.value, v.transpose(1, 2))


def test_trainer_hooks_respect_force_sink_and_sliding_layers():
    """With force-sink, resid_mid is the masked stream the MLP reads; sliding layers keep their window."""
    model = _trainer_model("sinklogit", force_sink_k=4, layer_pattern="sliding,full", window=4)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(4))
    collect = Collect(hp.RESID_PRE, hp.RESID_MID, hp.ATTN_OUT, hp.ATTN)
    with torch.no_grad():
        model(ids, hooks=collect)
    for layer in range(3):
        mid = collect.values[hp.RESID_MID][layer]
        assert torch.all(mid[:, 0, 4:] == 0) and torch.all(mid[:, 1:, :4] == 0)  # the partition holds exactly
        expected = (collect.values[hp.RESID_PRE][layer] + collect.values[hp.ATTN_OUT][layer])
        keep = model.force_sink_mask(16, expected)
        assert torch.equal(mid, expected * keep)
    assert collect.values[hp.ATTN][0].sliding_window == 4 and collect.values[hp.ATTN][1].sliding_window is None
