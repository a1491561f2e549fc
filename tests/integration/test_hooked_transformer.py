"""TransformerLens 3's ``HookedTransformer`` measured by ``sinkscope.measure`` (capture/hooked.py), against its own hooks.

TransformerLens 3 and 4 cannot share an environment, so ``make test-all`` installs 3.9 into ``.tl3``
(``make tl3-deps``) and this test runs its check in a subprocess with ``.tl3`` first on the path.
Tiny random models from ``HookedTransformerConfig``: GPT-2-like (learned positions, LayerNorm, GELU)
and LLaMA-like (rotary, RMSNorm, gated SiLU MLP, 4 query heads over 2 key-value heads). The
reference: the model's own ``hook_pattern`` and ``hook_v`` from ``run_with_cache``, through
SPEC.md's formulas.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TL3 = ROOT / ".tl3"

CHECK = r'''
import json, math, warnings
warnings.simplefilter("ignore")
import torch
import transformer_lens
import sinkscope
from transformer_lens import HookedTransformer, HookedTransformerConfig

assert hasattr(transformer_lens, "HookedTransformer") and transformer_lens.__file__.startswith(TL3_DIR), transformer_lens.__file__
out = {}
for name, extra in (("gpt2-like", dict(act_fn="gelu", normalization_type="LN", positional_embedding_type="standard")),
                    ("llama-like", dict(act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
                                        gated_mlp=True, n_key_value_heads=2, rotary_dim=16))):
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=2, d_model=64, n_ctx=64, d_head=16, n_heads=4, d_vocab=200, seed=0, **extra)
    model = HookedTransformer(cfg).eval()
    ids = torch.randint(0, 200, (3, 24), generator=torch.Generator().manual_seed(1))
    table = sinkscope.measure("sinks", model, windows=ids, progress=False).table
    heads = table[table["layer"].notna() & table["head"].notna()]
    _, cache = model.run_with_cache(ids)
    p0_gap = ratio_gap = 0.0
    for layer in range(2):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]  # (B, H, T, S)
        mine = torch.tensor(heads[(heads.metric == "p0_mass") & (heads["layer"] == layer)].sort_values("head").value.to_numpy())
        p0_gap = max(p0_gap, float((mine - pattern[..., 1:, 0].mean((0, 2)).double()).abs().max()))
        norms = cache[f"blocks.{layer}.attn.hook_v"].norm(dim=-1).double()  # (B, S, Hkv)
        ratio = (norms[:, 0] / norms[:, 1:].quantile(0.5, dim=1)).mean(0)
        mine = torch.tensor(heads[(heads.metric == "value_norm_ratio") & (heads["layer"] == layer)].sort_values("head").value.to_numpy())
        ratio_gap = max(ratio_gap, float((mine - ratio).abs().max()))
    ablated = sinkscope.measure("heads", model, windows=ids, progress=False).table
    out[name] = {"p0": p0_gap, "ratio": ratio_gap, "n_value_heads": int(mine.numel()),
                 "metrics": sorted(table.metric.unique()), "heads_rows": int(len(ablated)),
                 "heads_finite": bool(ablated.value.dropna().map(math.isfinite).all())}
print(json.dumps(out))
'''


CONVERTED = r'''
import json, sys, tempfile, warnings
warnings.simplefilter("ignore")
import torch
import sinkscope
import transformer_lens.loading_from_pretrained as loading
from transformer_lens import HookedTransformer, HookedTransformerConfig
from tiny_models import VOCAB, build

PROCESSING = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
#: what TransformerLens's weight processing leaves as it is: everything read off the attention weights
INVARIANT = ("p0_mass", "sink_rate", "sink_alpha", "sink_head_share")


def gemma2():
    """A tiny Gemma 2 (sliding and global layers, logit soft-capping, pre and post norms) and TransformerLens's config
    for it, written as TransformerLens 3 writes google/gemma-2-2b's (it converts Gemma only from official names)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                           num_key_value_heads=2, head_dim=16, intermediate_size=128, sliding_window=8,
                                           query_pre_attn_scalar=16, max_position_embeddings=512)).eval()
    cfg = dict(d_model=64, d_head=16, n_heads=4, d_mlp=128, n_layers=3, n_ctx=512, eps=model.config.rms_norm_eps,
               d_vocab=VOCAB, act_fn="gelu_pytorch_tanh", normalization_type="RMS", rotary_base=10000.0,
               positional_embedding_type="rotary", use_attn_scale=True, n_key_value_heads=2, window_size=8,
               use_local_attn=True, attn_types=["local", "global", "local"], attn_scores_soft_cap=50.0,
               output_logits_soft_cap=30.0, gated_mlp=True, final_rms=True, use_normalization_before_and_after=True,
               original_architecture="Gemma2ForCausalLM", device="cpu", dtype=torch.float32, init_weights=False)
    return model, cfg


def converted(model, processed, cfg=None):
    """The HookedTransformer TransformerLens 3 builds from the same weights (its own config and weight converters)."""
    if cfg is not None:  # Gemma 2: the config written out, TransformerLens's own weight converter
        from transformer_lens.pretrained.weight_conversions.gemma import convert_gemma_weights

        cfg = HookedTransformerConfig(**cfg)
        hooked = HookedTransformer(cfg)
        hooked.load_and_process_state_dict(convert_gemma_weights(model, cfg), refactor_factored_attn_matrices=False,
                                           **{k: processed for k in PROCESSING})
        return hooked.eval()
    if model.config.model_type == "gpt2":
        model.config.n_ctx = model.config.n_positions  # TransformerLens 3 reads GPT-2's context as n_ctx
    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    cfg = loading.convert_hf_model_config(folder)
    cfg.update(model_name="tiny", init_weights=False, device="cpu", dtype=torch.float32, tokenizer_name=None)
    cfg = HookedTransformerConfig(**cfg)
    hooked = HookedTransformer(cfg)
    hooked.load_and_process_state_dict(loading.get_pretrained_state_dict(folder, cfg, hf_model=model),
                                       refactor_factored_attn_matrices=False, **{k: processed for k in PROCESSING})
    return hooked.eval()


def gaps(ours, theirs, metrics=None):
    keys = [c for c in ours.columns if c not in ("value", "se", "n")]
    both = ours.merge(theirs, on=keys, suffixes=("", "_tl"))
    both = both[both.metric.isin(metrics)] if metrics else both
    scale = both.value.abs().clip(lower=1.0)
    return {m: float(((g.value - g.value_tl).abs() / scale[g.index]).max()) for m, g in both.groupby("metric")}, len(both)


out = {}
ids = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1))
for family in sys.argv[1:]:
    model, cfg = gemma2() if family == "gemma2" else (build(family).eval(), None)
    hooked, folded = converted(model, False, cfg), converted(model, True, cfg)
    out[family] = {"plain": {}, "rows": 0, "metrics": []}
    for command in ("sinks", "heads", "inject"):  # attention records, head ablations (hook_z), value injection (hook_v)
        extra = {"eval_batch": 3} if command == "inject" else {}
        transformers_table = sinkscope.measure(command, model, windows=ids, progress=False, **extra).table
        plain, rows = gaps(transformers_table, sinkscope.measure(command, hooked, windows=ids, progress=False,
                                                                 **extra).table)
        out[family]["plain"].update({f"{command}:{m}": gap for m, gap in plain.items()})
        out[family]["rows"] += rows
        out[family]["metrics"] += sorted(transformers_table.metric.unique())
        if command == "sinks":
            out[family]["processed"], _ = gaps(transformers_table, sinkscope.measure(
                "sinks", folded, windows=ids, progress=False).table, INVARIANT)
print(json.dumps(out))
'''

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gpt_neox", "gemma2")


def _run(code: str, *args: str) -> dict:
    if not (TL3 / "transformer_lens").is_dir():
        pytest.skip("TransformerLens 3 is not installed in .tl3 (make tl3-deps)")
    path = os.pathsep.join([str(TL3), str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", f"TL3_DIR = {str(TL3)!r}\n" + code, *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": path}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a subprocess with TransformerLens 3 (make tl3-deps)
def test_transformers_and_transformer_lens_give_the_same_numbers_on_the_same_weights():
    """Issue 57, item 4: every metric of sinks, heads (head ablations through hook_z) and inject (value injection
    through hook_v) that both paths make agrees within 1e-5 (relative above 1) with the weights as they are; with
    TransformerLens's weight processing on, the metrics read off the attention weights still do. TransformerLens 3
    converts Gemma only from its official hub names, so Gemma 2's config is written out as TransformerLens writes
    google/gemma-2-2b's (sliding and global layers, soft-capping, pre and post norms) and its own converter moves
    the weights."""
    results = _run(CONVERTED, *FAMILIES)
    for family, got in results.items():
        assert {"sinks:p0_mass", "sinks:sink_rate", "sinks:value_norm_ratio"} <= set(got["plain"]), (family, got)
        assert any(k.startswith("heads:") for k in got["plain"]) and any(k.startswith("inject:") for k in got["plain"])
        assert max(got["plain"].values()) < 1e-5, (family, got["plain"])
        assert set(got["processed"]) == {"p0_mass", "sink_rate", "sink_alpha", "sink_head_share"} & set(got["metrics"])
        assert max(got["processed"].values()) < 1e-5, (family, got["processed"])


@pytest.mark.slow  # a subprocess with TransformerLens 3 (make tl3-deps)
def test_hooked_transformer_numbers_are_its_own_pattern_and_values():
    results = _run(CHECK)
    for name, got in results.items():
        assert got["p0"] < 1e-6 and got["ratio"] < 1e-5, (name, got)
        assert {"p0_mass", "sink_rate", "value_norm_ratio"} <= set(got["metrics"]), (name, got)
        assert got["heads_rows"] > 0 and got["heads_finite"], (name, got)
    assert results["llama-like"]["n_value_heads"] == 2  # per key-value head under grouped-query attention


@pytest.mark.slow  # a subprocess with TransformerLens 3 (make tl3-deps)
def test_the_loader_builds_the_model_the_transformer_lens_way_and_records_it(tiny_llama_dir, tmp_path):
    """``sinks MODEL --loader transformer-lens``: TransformerLens's processing (from_pretrained's defaults) leaves
    every attention-weight metric of the model as it is; the manifest names the loader, its options and version."""
    import pandas as pd

    if not (TL3 / "transformer_lens").is_dir():
        pytest.skip("TransformerLens 3 is not installed in .tl3 (make tl3-deps)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TL3), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    common = [sys.executable, "-m", "sinkscope", "sinks", str(tiny_llama_dir), "--seq-len", "32", "--n-seqs", "4",
              "--no-figures", "--no-progress"]
    for name, extra in (("plain", []), ("lens", ["--loader", "transformer-lens", "--loader-option", "fold_value_biases=false"])):
        done = subprocess.run([*common, *extra, "--out", str(tmp_path / name)], capture_output=True, text=True, env=env,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert "Building a HookedTransformer with TransformerLens (fold_ln=True" in done.stderr
    manifest = json.loads((tmp_path / "lens" / "manifest.json").read_text())
    assert manifest["options"]["loader"] == "transformer-lens"
    assert manifest["options"]["loader_option"] == ["fold_value_biases=false"]
    assert manifest["versions"]["transformer-lens"].startswith("3.")
    plain, lens = (pd.read_csv(tmp_path / name / "results.csv") for name in ("plain", "lens"))
    both = plain.merge(lens, on=["metric", "layer", "head"], suffixes=("", "_tl"))
    both = both[both.metric.isin(["p0_mass", "sink_rate", "sink_alpha", "sink_head_share"])]
    assert len(both) > 0 and (both.value - both.value_tl).abs().max() < 1e-5
