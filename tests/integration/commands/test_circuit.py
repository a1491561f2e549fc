"""``sinkscope circuit`` (issue 12; SPEC.md "The position-zero circuit"; the P0-sink study, §2-3).

Every number is checked against a direct float64 computation on tiny models: the reference reads
each decoder layer's output (forward hooks on the layers themselves, not on sinkscope's points),
the model's own modules (the MLP's projection on a residual built by hand) and its own loss.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import sinkscope
from collect import Collect
from sinkscope.capture import hooks as hp, capture
from sinkscope.capture.families import ModelSpec, get_submodule
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import Probe
from tiny_models import PATHS, FAMILY_NAMES, build, random_ids

TOL = 1e-4
runner = CliRunner()


def _out(out):
    return out[0] if isinstance(out, tuple) else out


def layer_outputs(model, ids, family):
    """Each decoder layer's output hidden state (hook_resid_post), float64 numpy (B, T, C)."""
    layers = get_submodule(model, PATHS[family].layers)
    got, handles = {}, []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(lambda _m, _i, out, i=i: got.__setitem__(i, _out(out))))
    with torch.no_grad():
        model(ids, use_cache=False)
    for h in handles:
        h.remove()
    return [got[i].double().numpy() for i in range(len(layers))]


def _cells(table, metric, **conditions):
    rows = table[table.metric == metric]
    for key, value in conditions.items():
        rows = rows[rows[key] == value] if isinstance(value, (int, float)) else rows[rows[key].astype(str) == value]
    return {(None if pd.isna(r.layer) else int(r.layer)): r.value for r in rows.itertuples()}


def _mean_pairwise_cos(x):  # (N, C)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    n = len(u)
    return np.mean([u[i] @ u[j] for i, j in itertools.permutations(range(n), 2)])


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_norms_and_cosines_equal_direct_computation(family):
    model = build(family)
    ids = random_ids(5, 20, seed=3)
    result = sinkscope.measure("circuit", model, windows=ids.numpy(), bos_experiments=False, later_position=64,
                               progress=False, batch_size=2)
    table = result.table
    hidden = layer_outputs(model, ids, family)
    p0, other, ratio = _cells(table, "p0_norm"), _cells(table, "other_norm"), _cells(table, "p0_norm_ratio")
    cos0, cosl = _cells(table, "p0_cosine"), _cells(table, "later_cosine")
    first = math.nan
    for layer, h in enumerate(hidden):
        norms = np.linalg.norm(h, axis=-1)  # (B, T)
        want_p0, want_other = norms[:, 0].mean(), np.median(norms[:, 1:], axis=1).mean()
        assert p0[layer] == pytest.approx(want_p0, rel=TOL)
        assert other[layer] == pytest.approx(want_other, rel=TOL)
        assert ratio[layer] == pytest.approx(want_p0 / want_other, rel=TOL)
        if math.isnan(first) and want_p0 / want_other > 2:
            first = layer
        assert cos0[layer] == pytest.approx(_mean_pairwise_cos(h[:, 0]), abs=TOL)
        assert cosl[layer] == pytest.approx(_mean_pairwise_cos(h[:, 19]), abs=TOL)  # 64 capped to T - 1
    separates = table[table.metric == "p0_norm_separates"].value.iloc[0]
    assert (math.isnan(separates) and math.isnan(first)) or separates == first
    assert set(table[table.metric == "later_cosine"].position) == {19}


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "qwen3", "gemma3_text"])
def test_attention_output_at_position_0_is_its_own_value_through_w_o(family):
    """Position 0 attends only to itself: attn_out[0] = W_O(v_0 of every head) (+ the post-attention norm)."""
    model = build(family)
    spec = ModelSpec.from_model(model)
    ids = random_ids(3, 16, seed=1)
    sink = Collect(hp.ATTN_V, hp.ATTN_OUT)
    with capture(model, sink, mode="explicit"), torch.no_grad():
        model(ids, use_cache=False)
    family_row = PATHS[family]
    layer = get_submodule(model, family_row.layers)[0]
    v = sink.values[hp.ATTN_V][0]  # (B, S, Hkv, D)
    z0 = v[:, 0].repeat_interleave(spec.n_heads // spec.n_kv_heads, dim=1)  # (B, H, D): a_00 = 1
    with torch.no_grad():
        want = get_submodule(layer, family_row.out_proj)(z0.reshape(z0.shape[0], 1, -1))[:, 0]  # (B, C)
        if family_row.attn_out != family_row.attention:
            want = get_submodule(layer, family_row.attn_out)(want)
    got = sink.values[hp.ATTN_OUT][0][:, 0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # and the probe's position-0 norm is that vector's norm, averaged over windows
    table = sinkscope.measure("circuit", model, windows=ids.numpy(), bos_experiments=False, progress=False).table
    norms = _cells(table, "attn_out_norm")
    rows = table[(table.metric == "attn_out_norm") & (table.position == 0)]
    assert rows.value.iloc[0] == pytest.approx(float(want.double().norm(dim=-1).mean()), rel=1e-5)
    assert len(table[table.metric == "attn_out_norm"]) == 16 and norms


def _trend_reference(curve):  # (T,) -> relative slope per doubling over t >= 1
    t = np.arange(1, len(curve))
    slope = np.polyfit(np.log2(t), curve[1:], 1)[0]
    return slope / curve[1:].mean()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_weighted_value_sum_norm_per_head_equals_an_explicit_forward(family):
    """The P0-sink study Table 2's quantity: ||sum_j a_tj v_j|| per head and position (before W_O), from the model's own
    eager weights and values made by hand from its input norm and value projection; the headline rows match
    it per head and pooled (the norm of all heads side by side), and the after-W_O rows stay beside it under their own name."""
    model = build(family)
    ids = random_ids(5, 18, seed=8)
    table = sinkscope.measure("circuit", model, windows=ids.numpy(), bos_experiments=False, progress=False,
                              batch_size=2).table
    with torch.no_grad():
        out = model(ids, output_attentions=True, use_cache=False)
        a = out.attentions[0].double()  # (B, H, T, T) layer 0, eager softmax
        if family == "llama":
            layer = model.model.layers[0]
            x = layer.input_layernorm(model.model.embed_tokens(ids))  # (B, T, C)
            v = layer.self_attn.v_proj(x).view(5, 18, 2, 16).transpose(1, 2).repeat_interleave(2, dim=1)
        else:
            block = model.transformer.h[0]
            x = block.ln_1(model.transformer.wte(ids) + model.transformer.wpe(torch.arange(18)))
            v = block.attn.c_attn(x)[..., 128:].view(5, 18, 4, 16).transpose(1, 2)  # (B, H, T, D)
    z = a @ v.double()  # (B, H, T, D): the weighted sum of values
    per_head = z.norm(dim=-1).mean(0).numpy()  # (H, T)
    rows = table[table.metric == "attn_z_norm"]
    assert len(rows) == 18 * (4 + 1)
    for head in range(4):
        got = rows[rows["head"] == head].sort_values("position")
        np.testing.assert_allclose(got.value.to_numpy(float), per_head[head], rtol=1e-5)
        ratio = table[(table.metric == "attn_z_norm_p0_ratio") & (table["head"] == head)].value.item()
        assert ratio == pytest.approx(per_head[head, 0] / per_head[head, 1:].mean(), rel=1e-5)
        trend = table[(table.metric == "attn_z_norm_trend") & (table["head"] == head)].value.item()
        assert trend == pytest.approx(_trend_reference(per_head[head]), rel=1e-5, abs=1e-9)
    pooled_curve = z.transpose(1, 2).reshape(5, 18, 64).norm(dim=-1).mean(0).numpy()  # (T,): heads concatenated
    pooled = rows[rows["head"].isna()].sort_values("position")
    np.testing.assert_allclose(pooled.value.to_numpy(float), pooled_curve, rtol=1e-5)
    pooled_rows = table[table["head"].isna()]
    ratio = pooled_rows[pooled_rows.metric == "attn_z_norm_p0_ratio"].value.item()
    assert ratio == pytest.approx(pooled_curve[0] / pooled_curve[1:].mean(), rel=1e-5)
    trend = pooled_rows[pooled_rows.metric == "attn_z_norm_trend"].value.item()
    assert trend == pytest.approx(_trend_reference(pooled_curve), rel=1e-5, abs=1e-9)
    # after W_O: a different number under its own name (the model's attention output, pooled only)
    with torch.no_grad():
        if family == "llama":
            after = model.model.layers[0].self_attn.o_proj(z.transpose(1, 2).reshape(5, 18, 64).float())
        else:
            after = model.transformer.h[0].attn.c_proj(z.transpose(1, 2).reshape(5, 18, 64).float())
    after_curve = after.double().norm(dim=-1).mean(0).numpy()
    got = table[table.metric == "attn_out_norm"].sort_values("position")
    assert got["head"].isna().all()
    np.testing.assert_allclose(got.value.to_numpy(float), after_curve, rtol=1e-4)
    assert table[table.metric == "attn_out_norm_trend"].value.item() == pytest.approx(
        _trend_reference(after_curve), rel=1e-4, abs=1e-9)


def _pca_reference(x, n_windows):
    """(separation, pc1 share, pc2 share) of rows x (B*T, F), position 0 every T-th row, in float64."""
    T = len(x) // n_windows
    is0 = np.zeros(len(x), bool)
    is0[::T] = True
    mu = x.mean(0)
    cov = (x - mu).T @ (x - mu) / len(x)
    values, vectors = np.linalg.eigh(cov)
    v1 = vectors[:, -1]
    p = (x - mu) @ v1
    gap = abs(p[is0].mean() - p[~is0].mean())
    projections = (x - mu) @ vectors[:, ::-1][:, :10]  # the 10 leading components
    scores = np.abs(projections[is0].mean(0) - projections[~is0].mean(0)) / projections[~is0].std(0)
    return gap / p[~is0].std(), values[-1] / values.sum(), values[-2] / values.sum(), scores.max(), scores.argmax() + 1


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_subtracting_every_layer0_head_is_the_mlp_without_attention(family):
    """The pass with every layer-0 head subtracted sees up_proj(ln2(resid_pre)): the residual without the
    attention output (these families have no o_proj bias); the clean pass sees the real up projection."""
    model = build(family)
    spec = ModelSpec.from_model(model)
    ids = random_ids(4, 12, seed=2)
    heads = tuple(f"0.{h}" for h in range(spec.n_heads))
    table = sinkscope.measure("circuit", model, windows=ids.numpy(), subtract_head=heads, bos_experiments=False,
                              progress=False, batch_size=3, scatter_positions=4, scatter_windows=2).table
    layer = model.model.layers[0]
    with torch.no_grad():
        resid_pre = model.model.embed_tokens(ids)  # (B, T, C)
        without = layer.mlp.up_proj(layer.post_attention_layernorm(resid_pre)).double()
    sink = Collect(hp.MLP_PRE_LINEAR)
    with capture(model, sink), torch.no_grad():
        model(ids, use_cache=False)
    clean = sink.values[hp.MLP_PRE_LINEAR][0].double()
    label = "+".join(heads)
    for cond, x in (("none", clean), (label, without)):
        sep, pc1, pc2, best, which = _pca_reference(x.reshape(-1, x.shape[-1]).numpy(), len(ids))
        assert _cells(table, "pca_separation", subtracted=cond)[0] == pytest.approx(sep, rel=1e-4)
        assert _cells(table, "pca_separation_best", subtracted=cond)[0] == pytest.approx(best, rel=1e-4)
        assert _cells(table, "pca_separation_best_pc", subtracted=cond)[0] == which
        assert _cells(table, "pca_explained_pc1", subtracted=cond)[0] == pytest.approx(pc1, rel=1e-4)
        assert _cells(table, "pca_explained_pc2", subtracted=cond)[0] == pytest.approx(pc2, rel=1e-4)
    # the scatter sample: every window's position 0, plus evenly spaced positions of the first 2 windows
    points = table[(table.metric == "pca_scatter_pc1") & (table.subtracted == "none")]
    assert (points.position == 0).sum() == len(ids)
    assert len(points) == len(ids) + 2 * 4
    # and subtracting is exact only at layer 0: other layers are refused
    with pytest.raises(SinkscopeError, match="layer 0"):
        sinkscope.measure("circuit", model, windows=ids.numpy(), subtract_head=("1.0",), progress=False)


def test_one_head_subtracted_equals_removing_its_hook_result():
    """Subtracting head 0.1 equals the MLP's projection of ln2(resid_mid - hook_result[..., 1, :])."""
    model = build("llama")
    ids = random_ids(3, 10, seed=4)
    sink = Collect(hp.RESID_MID, hp.ATTN_RESULT)
    with capture(model, sink), torch.no_grad():
        model(ids, use_cache=False)
    layer = model.model.layers[0]
    with torch.no_grad():
        x = layer.mlp.up_proj(layer.post_attention_layernorm(
            sink.values[hp.RESID_MID][0] - sink.values[hp.ATTN_RESULT][0][:, :, 1])).double()
    table = sinkscope.measure("circuit", model, windows=ids.numpy(), subtract_head=("0.1",), bos_experiments=False,
                              progress=False).table
    sep, pc1, *_ = _pca_reference(x.reshape(-1, x.shape[-1]).numpy(), len(ids))
    assert _cells(table, "pca_separation", subtracted="0.1")[0] == pytest.approx(sep, rel=1e-4)
    assert _cells(table, "pca_explained_pc1", subtracted="0.1")[0] == pytest.approx(pc1, rel=1e-4)


def test_outlier_channels_equal_direct_z_scores():
    model = build("llama")
    ids = random_ids(4, 14, seed=5)
    table = sinkscope.measure("circuit", model, windows=ids.numpy(), bos_experiments=False, outlier_top=3,
                              progress=False, batch_size=3).table
    sink = Collect(hp.RESID_PRE, hp.LN1_NORMALIZED)
    with capture(model, sink), torch.no_grad():
        model(ids, use_cache=False)
    for template, where in ((hp.RESID_PRE, "resid_pre"), (hp.LN1_NORMALIZED, "normed")):
        for layer in range(3):
            x = sink.values[template][layer].double().numpy()  # (B, T, C)
            rest = x[:, 1:].reshape(-1, x.shape[-1])
            z = (x[:, 0].mean(0) - rest.mean(0)) / rest.std(0)
            order = np.argsort(-np.abs(z), kind="stable")[:3]
            rows = table[(table.metric == "p0_outlier_z") & (table.layer == layer) & (table["where"] == where)]
            chans = table[(table.metric == "p0_outlier_channel") & (table.layer == layer) & (table["where"] == where)]
            np.testing.assert_allclose(rows.sort_values("rank").value, z[order], rtol=1e-5)
            assert list(chans.sort_values("rank").value.astype(int)) == list(order)
            top = table[(table.metric == "p0_outlier_max_z") & (table.layer == layer) & (table["where"] == where)]
            assert top.value.iloc[0] == pytest.approx(np.abs(z).max(), rel=1e-5)


def _loss(model, ids):  # (B, T-1) float64
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits.double()
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                           reduction="none").view(ids.shape[0], -1)


def test_the_repeated_token_experiment_changes_only_what_it_should():
    """Each pass's inputs are exactly [BOS]*r + K or K_0*r + K[1:]; its loss covers the targets K[1:] only
    (the same tokens in every pass); Sink_0^eps comes from the r = 1 passes; the other probes see the
    windows untouched."""
    model = build("llama")
    T, bos, repeats = 16, 7, (1, 2, 4)
    ids = random_ids(3, T, seed=6)
    result = sinkscope.measure("circuit", model, windows=ids.numpy(), bos_token_id=bos, repeats=repeats,
                               progress=False, batch_size=2)
    table = result.table
    K = ids[:, 1:1 + T - max(repeats)]  # (B, L)
    for setting in ("with", "without"):
        for r in repeats:
            if setting == "with":
                x = torch.cat([torch.full((3, r), bos), K], dim=1)
                kept = _loss(model, x)[:, r:]
            else:
                x = torch.cat([K[:, :1].repeat(1, r), K[:, 1:]], dim=1)
                kept = _loss(model, x)[:, r - 1:]
            assert x.shape[1] <= T
            assert torch.equal(x[:, -(K.shape[1] - 1):], K[:, 1:])  # the scored targets: the same tokens
            assert kept.shape == (3, K.shape[1] - 1)
            want = float(kept.mean())
            assert _cells(table, "bos_repeat_loss", bos=setting, repeat=r)[None] == pytest.approx(want, rel=1e-5)
    for setting in ("with", "without"):
        base = _cells(table, "bos_repeat_loss", bos=setting, repeat=1)[None]
        for r in repeats:
            assert _cells(table, "bos_repeat_loss_delta", bos=setting, repeat=r)[None] == pytest.approx(
                _cells(table, "bos_repeat_loss", bos=setting, repeat=r)[None] - base, abs=1e-9)
    # Sink_0^eps with and without BOS: the r = 1 inputs through the model's own attention weights
    for setting, x in (("with", torch.cat([torch.full((3, 1), bos), K], 1)), ("without", K)):
        with torch.no_grad():
            att = model(x, output_attentions=True, use_cache=False).attentions
        for layer, a in enumerate(att):
            alpha = a[:, :, :, 0].double().mean(-1)  # (B, H)
            want = float((alpha > 0.3).double().mean())
            assert _cells(table, "bos_sink_rate", bos=setting)[layer] == pytest.approx(want, abs=1e-9)
    # the other probes measured the windows themselves
    plain = sinkscope.measure("circuit", model, windows=ids.numpy(), bos_experiments=False, progress=False).table
    ours = table[~table.probe.astype(str).eq("bos_experiment")].reset_index(drop=True)
    assert len(ours) == len(plain)
    assert list(ours.metric) == list(plain.metric) and list(ours.layer) == list(plain.layer)
    np.testing.assert_allclose(ours.value, plain.value, rtol=1e-5, atol=1e-6)  # fused vs own attention


def test_without_a_bos_id_only_the_without_setting_runs():
    model = build("llama")
    table = sinkscope.measure("circuit", model, windows=random_ids(2, 12).numpy(), repeats=(1, 2),
                              progress=False).table
    assert set(table[table.probe == "bos_experiment"].bos.dropna()) == {"without"}


def test_the_trainer_model_runs_through_its_native_hook_points():
    """A trainer model (GELU MLP: mlp.hook_pre; force-sink on) gives the same norms as its layers' outputs."""
    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=24, n_layer=2, n_head=2, n_embd=32, force_sink_k=4,
                          norm="rmsnorm")).eval()
    ids = torch.randint(1, 40, (4, 24), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 0
    result = sinkscope.measure("circuit", model, windows=ids.numpy(), subtract_head=("0.1",), bos_token_id=0,
                               repeats=(1, 2), progress=False)
    table = result.table
    assert {"pca_separation", "p0_norm", "bos_repeat_loss", "attn_out_norm"} <= set(table.metric)
    assert "mlp_pca" in set(table.probe)  # a GELU MLP: the pre-activation is c_fc's output
    sink = Collect(hp.RESID_POST)
    with torch.no_grad():
        model(ids, hooks=sink)
    for layer in range(2):
        h = sink.values[hp.RESID_POST][layer].double()
        assert _cells(table, "p0_norm")[layer] == pytest.approx(float(h[:, 0].norm(dim=-1).mean()), rel=1e-5)
    # force-sink keeps its k channels only at position 0 (zero elsewhere): their z-score is infinite
    top = table[(table.metric == "p0_outlier_max_z") & (table["where"] == "resid_pre")]
    assert np.isinf(top.value).all()
    assert np.isfinite(_cells(table, "p0_cosine")[1])


def test_cli_runs_and_writes_a_report(tmp_path, tiny_llama_dir, text_file):
    out = tmp_path / "one"
    result = runner.invoke(app, ["circuit", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "24",
                                 "--n-seqs", "4", "--subtract-head", "0.1", "--subtract-head", "0.2", "--repeats", "1",
                                 "--repeats", "2", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    page = (out / "report.html").read_text()
    for stem in ("circuit_norms", "circuit_cosine", "circuit_attn_z_norm", "circuit_attn_out_norm", "circuit_pca_scatter", "circuit_outliers",
                 "circuit_bos_sink_rate", "circuit_bos_repeat"):
        assert (out / "figures" / f"{stem}.png").is_file(), stem
        assert stem in page
    table = pd.read_csv(out / "results.csv")
    assert set(table[table.metric == "pca_separation"].subtracted) == {"none", "0.1+0.2"}


def test_two_models_give_one_comparison_page(tmp_path, tiny_llama_dir, text_file):
    several = tmp_path / "two"
    result = runner.invoke(app, ["circuit", str(tiny_llama_dir), str(tiny_llama_dir), "--text-file", str(text_file),
                                 "--seq-len", "16", "--n-seqs", "3", "--no-bos-experiments", "--out", str(several),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    assert (several / "report.html").is_file() and (several / "figures" / "circuit_pca_scatter.png").is_file()


def test_cli_mistakes_are_one_sentence():
    for args, phrase in ((["--subtract-head", "2.1"], "layer 0"), (["--subtract-head", "x"], "LAYER.HEAD"),
                         (["--repeats", "2"], "including 1"), (["--seq-len", "8"], "seq-len >= 10"),
                         (["--later-position", "0"], "at least 1")):
        result = runner.invoke(app, ["circuit", *args])
        assert result.exit_code != 0
        assert phrase in result.output, result.output


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_subtraction_is_refused_where_it_is_not_exact(family):
    with pytest.raises(SinkscopeError, match="subtract_head"):
        sinkscope.measure("circuit", build(family), windows=random_ids(2, 12).numpy(), subtract_head=("0.1",),
                          progress=False)


BRIDGE_POINTS = (hp.RESID_PRE, hp.LN1_NORMALIZED, hp.ATTN_Z, hp.ATTN_OUT, hp.RESID_MID, hp.MLP_PRE, hp.RESID_POST)


@pytest.mark.parametrize("family, architecture", [("llama", "LlamaForCausalLM"), ("gpt2", "GPT2LMHeadModel")])
def test_transformer_bridge_hook_values_equal_ours(tmp_path, tokenizer, family, architecture):
    """TransformerLens's TransformerBridge (v4, booted offline on the HF model) caches the same values at
    the same names as sinkscope's hook points, where its logits equal the HF model's (checked on Llama,
    Mistral, Qwen2, Qwen3, GPT-2, GPT-NeoX, Gemma 3; NeoX's parallel blocks have no hook_resid_mid there).
    gpt-oss is never routed through it (its adapter drops the learned sinks)."""
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    hf = build(family)
    hf.config.architectures = [architecture]
    ids = random_ids(2, 12)
    with torch.no_grad():
        reference = hf(ids).logits
    bridge = bridge_module.TransformerBridge.boot_transformers(str(tmp_path), hf_model=hf,
                                                               tokenizer=AutoTokenizer.from_pretrained(tmp_path))
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(ids)
    torch.testing.assert_close(logits, reference, atol=1e-6, rtol=0)
    ours = build(family)
    sink = Collect(*BRIDGE_POINTS)
    with capture(ours, sink), torch.no_grad():
        ours(ids, use_cache=False)
    for template in BRIDGE_POINTS:
        for layer in range(3):
            torch.testing.assert_close(cache[hp.name_at(template, layer)], sink.values[template][layer],
                                       atol=1e-5, rtol=1e-5, msg=lambda m: f"{hp.name_at(template, layer)}: {m}")


def test_shares_merge_and_checkpoints_restore_to_the_same_rows():
    """Two shares of the windows merged (torchrun), and a state_dict round trip (--resume), give the rows of
    one pass over all the windows: the custom accumulators (scatter sample, later position, BOS) included."""
    from sinkscope.commands.circuit import CIRCUIT, CircuitOptions
    from sinkscope.commands import make_probes
    from sinkscope.forward.runner import run_probes

    model = build("llama")
    spec = ModelSpec.from_model(model)
    ids = random_ids(5, 16, seed=7).numpy()
    options = CircuitOptions(subtract_head=("0.1",), bos_token_id=3, repeats=(1, 2), scatter_positions=3,
                             scatter_windows=4)

    def probes():
        return make_probes(CIRCUIT, options, spec)

    def rows(ps):
        return [(r.probe, r.metric, r.layer, r.head, r.conditions, r.value) for p in ps for r in p.rows()]

    whole = probes()
    run_probes(model, ids, whole, batch_size=2, progress=False)
    first, second = probes(), probes()
    run_probes(model, ids[:3], first, batch_size=3, progress=False)
    run_probes(model, ids[3:], second, batch_size=1, progress=False)
    restored = probes()
    for probe, share, other in zip(restored, first, second):
        probe.load_state_dict(share.state_dict())
        probe.merge(other)
    for got, want in zip(rows(restored), rows(whole)):
        assert got[:5] == want[:5]
        assert got[5] == pytest.approx(want[5], rel=1e-5, abs=1e-6, nan_ok=True)
    assert len(rows(restored)) == len(rows(whole))


class _EveryPassAttention(Probe):
    """Joins every pass of a BOS experiment and reads its attention records: the behaviour before issue 28,
    where each pass built the records any pass read."""

    name = "every_pass_attention"
    metrics = {}
    observers = {hp.ATTN: "see"}

    def __init__(self, spec, labels):
        self.labels = tuple(labels)
        super().__init__(spec)

    def passes(self):
        return (None, *self.labels)

    def see(self, layer, record):
        pass

    def rows(self):
        return []


def test_bos_passes_build_attention_records_only_where_they_are_read(monkeypatch):
    """Issue 28: a pass builds no attention record unless one of its probes reads them (the r > 1 BOS passes
    read only the loss; the clean pass here only hook_resid_post), and the r = 1 pass's loss is unchanged:
    bit-identical to a run where every pass builds records, and equal to the model's own forward."""
    from collections import Counter

    from sinkscope.forward import runner as runner_mod
    from sinkscope.capture import attention as attention_mod
    from sinkscope.probes import get_probe

    model = build("llama")
    spec = ModelSpec.from_model(model)
    T, bos, repeats = 16, 7, (1, 2, 4)
    ids = random_ids(4, T, seed=6)
    built, current = Counter(), [None]
    real_forward, real_record = runner_mod._forward, attention_mod.AttentionRecord

    def forward(model_, ids_, dispatcher, **kwargs):
        current[0] = dispatcher.probes[0].pass_label if dispatcher.probes else None
        return real_forward(model_, ids_, dispatcher, **kwargs)

    def record(*args, **kwargs):
        built[current[0]] += 1
        return real_record(*args, **kwargs)

    monkeypatch.setattr(runner_mod, "_forward", forward)
    monkeypatch.setattr(attention_mod, "AttentionRecord", record)

    def run(extra: bool):
        built.clear()
        bos_probe = get_probe("bos_experiment")(spec, bos_id=bos, repeats=repeats)
        probes = [get_probe("p0_norm")(spec), bos_probe]
        if extra:
            probes.append(_EveryPassAttention(spec, bos_probe.labels))
        runner_mod.run_probes(model, ids.numpy(), probes, batch_size=2, progress=False)
        return bos_probe, dict(built)

    ours, counts = run(extra=False)
    per_pass = len(spec.attention_layers) * 2  # layers x batches
    assert counts == {"with-bos-r1": per_pass, "without-bos-r1": per_pass}  # the r = 1 passes read Sink_0^eps
    everything, old_counts = run(extra=True)
    assert old_counts == {label: per_pass for label in (None, *ours.labels)}
    assert torch.equal(ours.loss_sum, everything.loss_sum) and torch.equal(ours.loss_n, everything.loss_n)
    assert ours.rows() == everything.rows()  # Sink_0^eps and the loss rows, exactly
    K = ids[:, 1:1 + T - max(repeats)]  # (B, L)
    for setting, x, start in (("with", torch.cat([torch.full((4, 1), bos), K], 1), 1), ("without", K, 0)):
        index = ours.labels.index(f"{setting}-bos-r1")
        got = float(ours.loss_sum[index] / ours.loss_n[index])
        assert got == pytest.approx(float(_loss(model, x)[:, start:].mean()), rel=1e-5)  # the model's own forward
