"""`sinkscope stream`: reading through a bounded KV cache, against independent references.

References: the model's own dense forward (full; a window no smaller than the text), the
mask-based reading (one dense pass whose mask is the cache's), a hand computation of H2O's
choice from the model's eager attention weights, and StreamingLLM's own implementation of
positions within the cache (keys cached unrotated and rotated at their slot at attention time).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.forward.stream import rotary
from sinkscope.kvcache.policies import Policy, heavy_and_recent, keep_slots
from sinkscope.forward.stream.reader import (first_layer_keys, iter_chunks, layout_of, plain_nll, read_masked,
                                     read_stream)
from tiny_models import build, random_ids
from repo_paths import REPO

L = 40
TOL = 1e-5


def _setup(family: str, length: int = L, seed: int = 0):
    torch.set_grad_enabled(False)
    model = build(family)
    n_layers = getattr(model.config, "num_hidden_layers", None) or model.config.n_layer
    return model, random_ids(1, length, seed=seed), layout_of(model, n_layers, length)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gpt_oss", "gemma3_text"])
def test_full_and_a_window_as_long_as_the_text_equal_the_plain_forward(family):
    model, ids, layout = _setup(family)
    dense = plain_nll(model, ids)
    assert dense.shape == (L - 1,)
    for policy, chunk in ((Policy("full"), 7), (Policy("window", L), 5), (Policy("sinks", L, 4), 1)):
        streamed = read_stream(model, ids, policy, layout, chunk=chunk)
        assert torch.allclose(streamed, dense, atol=TOL), (family, policy)


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "gemma3_text"])
@pytest.mark.parametrize("chunk", [1, 4])
def test_streaming_equals_the_mask_based_reading(family, chunk):
    model, ids, layout = _setup(family)
    dense = plain_nll(model, ids)
    for policy in (Policy("window", 6), Policy("sinks", 6, 2), Policy("sinks", 9, 1)):
        streamed = read_stream(model, ids, policy, layout, chunk=chunk)
        masked = read_masked(model, ids, policy, layout, chunk=chunk)
        assert torch.allclose(streamed, masked, atol=TOL), (family, policy, chunk)
        assert (streamed - dense).abs().max() > 1e-3  # evicting changed the predictions: the test has teeth


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "gemma3_text"])
def test_the_chunk_is_only_a_speed_setting_for_window_and_sinks(family):
    """--cache N is an exact bound at any chunk (SPEC.md "A bounded cache of N keys (exact)"): per-token NLL
    at chunk 1 (token by token: N keys and the query itself) equals chunk 16 and 64, for both position
    conventions; ``--positions cache`` with sinks reads per-query copies of the sink keys."""
    model, ids, layout = _setup(family, length=36)
    with torch.no_grad():  # sharper attention than a tiny random model's, so that evictions matter
        for parameter in model.parameters():
            parameter.mul_(2.0)
    dense = plain_nll(model, ids)
    positions = ("original", "cache") if layout.inv_freq is not None else ("original",)
    for where in positions:
        for policy in (Policy("window", 6, 0, where), Policy("sinks", 6, 2, where), Policy("sinks", 5, 4, where)):
            one = read_stream(model, ids, policy, layout, chunk=1)
            assert (one - dense).abs().max() > 1e-2, (family, policy)  # the bound bites
            for chunk in (16, 64):
                assert torch.allclose(read_stream(model, ids, policy, layout, chunk=chunk), one, atol=TOL), \
                    (family, policy, chunk)
            if where == "original":
                assert torch.allclose(read_masked(model, ids, policy, layout, chunk=64), one, atol=TOL)


def test_each_query_of_a_chunk_sees_n_cached_keys_and_itself():
    """The mask of a chunk read after the cache filled: every query row shows exactly N + 1 keys."""
    from sinkscope.forward.stream.reader import _chunk_masks

    model, ids, layout = _setup("llama")
    for policy in (Policy("window", 6), Policy("sinks", 6, 2)):
        reads = iter_chunks(model, ids, policy, layout, chunk=16)
        next(reads)  # the first 16 tokens: the cache holds 6 of them now
        slots = [SimpleNamespace(orig=kept) for kept in next(reads).kept]  # after tokens 16..31
        mask = _chunk_masks(layout, slots, 32, 8, torch.float32, ids.device, policy)  # (1, 1, 8, 6 + 8)
        seen = (mask[0, 0] == 0).sum(-1)
        assert seen.tolist() == [7] * 8, policy


def test_the_cache_holds_what_each_policy_keeps():
    model, ids, layout = _setup("llama")
    for policy, expected in ((Policy("window", 6), list(range(34, 40))),
                             (Policy("sinks", 6, 2), [0, 1, 36, 37, 38, 39])):
        reads = list(iter_chunks(model, ids, policy, layout, chunk=4))
        assert [r.start for r in reads] == list(range(0, L, 4))
        for kept in reads[-1].kept:
            assert kept.shape == (2, 6) and all(k.tolist() == expected for k in kept)
    # a sliding-window layer keeps its own last W - 1 keys whatever the policy (gpt-oss: W = 8)
    model, ids, layout = _setup("gpt_oss")
    last = list(iter_chunks(model, ids, Policy("sinks", 6, 2), layout, chunk=4))[-1]
    assert last.kept[0][0].tolist() == list(range(L - 7, L)) and last.kept[1][0].tolist() == [0, 1, 36, 37, 38, 39]


def test_h2o_keeps_the_keys_a_hand_computation_picks():
    model, ids, layout = _setup("llama", length=12)
    policy = Policy("h2o", 4, recent=2)
    first = next(iter_chunks(model, ids, policy, layout, chunk=6))
    # by hand: the eager attention weights of the first six tokens, summed over queries and over the
    # query heads of each key-value head; the two heaviest of keys 0-3 plus the two most recent (4, 5)
    attentions = model(input_ids=ids[:, :6], output_attentions=True).attentions  # per layer (1, H, 6, 6)
    for layer, weights in enumerate(attentions):
        column = weights[0].sum(1).view(2, 2, 6).sum(1)  # (H_kv, 6)
        for head in range(2):
            heavy = torch.topk(column[head, :4], 2).indices.tolist()
            assert first.kept[layer][head].tolist() == sorted(heavy + [4, 5]), (layer, head)
    assert any(first.kept[0][0].tolist() != first.kept[0][1].tolist() or first.kept[layer][0].tolist() != [2, 3, 4, 5]
               for layer in range(3))  # not simply the most recent keys


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "qwen2"])
@pytest.mark.parametrize("policy", [Policy("h2o", 12, recent=4),
                                    Policy("sinks", 12, 2, "original", kv_bits=2, kv_group=4, kv_scheme="per-token",
                                           protect="top-p0:3")], ids=["h2o", "top-p0"])
def test_the_kernels_column_sums_choose_the_keys_the_materialised_weights_choose(family, policy, monkeypatch):
    """Issue 56, item 1: h2o and --protect top-p0 read each key's attention from the kernel call that makes the
    layer's output (``kernels.attention_with_received``); with the record's own sums of the materialised weights
    instead (the observer asks for no column), every chunk keeps the same keys and protects the same ones, and the
    per-token NLL agrees to float32 rounding (gpt-oss: learned sinks and sliding layers)."""
    from sinkscope.forward.stream import reader

    model, ids, layout = _setup(family)
    fused = list(iter_chunks(model, ids, policy, layout, chunk=4))
    built = reader._ColumnMass.__init__

    def materialised(self, layers, p0=False):
        built(self, layers, p0)
        self.record_columns = frozenset()  # no kernel columns: record.received_mass() sums the weights itself

    monkeypatch.setattr(reader._ColumnMass, "__init__", materialised)
    plain = list(iter_chunks(model, ids, policy, layout, chunk=4))
    assert len(fused) == len(plain)
    for a, b in zip(fused, plain):
        assert all(torch.equal(x, y) for x, y in zip(a.kept, b.kept))
        assert all(x is None and y is None or torch.equal(x, y) for x, y in zip(a.exact, b.exact))
        torch.testing.assert_close(a.nll, b.nll, atol=1e-5, rtol=1e-5)


def test_heavy_and_recent_breaks_ties_towards_the_earlier_key():
    scores = torch.tensor([[1.0, 3.0, 3.0, 0.5, 9.0, 9.0]])
    assert heavy_and_recent(scores, 3, 1).tolist() == [[1, 4, 5]]  # recent: 5; heavy: 4 (9), then 1 of the tied 1, 2
    assert heavy_and_recent(torch.tensor([[3.0, 3.0, 3.0, 0.0, 0.0, 0.0]]), 3, 1).tolist() == [[0, 1, 5]]
    assert keep_slots(Policy("window", 6), 5, 2, "cpu") is None


def _streamingllm_reference(model, ids, cache_size: int, n_sink: int, monkeypatch) -> torch.Tensor:
    """StreamingLLM's positions within the cache as its authors implement them: keys are cached before
    rotation and rotated at their slot (0 .. S - 1) at attention time; the query's position is the
    number of keys the cache holds. Token by token; after each token the cache keeps n_sink + recent."""
    import transformers.models.llama.modeling_llama as modeling
    from transformers import AttentionInterface, DynamicCache

    apply = modeling.apply_rotary_pos_emb
    rotary_emb = model.model.rotary_emb

    def rotate_query_only(q, k, cos, sin, unsqueeze_dim=1):
        return apply(q, k, cos, sin, unsqueeze_dim)[0], k

    def attend(module, query, key, value, attention_mask, **kwargs):
        cos, sin = rotary_emb(key, torch.arange(key.shape[-2]).unsqueeze(0))
        key = apply(key, key, cos, sin)[1]
        return modeling.eager_attention_forward(module, query, key, value, None, **kwargs)

    AttentionInterface.register("streamingllm_reference", attend)
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", rotate_query_only)
    model.set_attn_implementation("streamingllm_reference")
    try:
        cache, nll = DynamicCache(), []
        for i in range(ids.shape[1] - 1):
            held = cache.get_seq_length()
            logits = model(input_ids=ids[:, i:i + 1], position_ids=torch.tensor([[held]]), cache=cache,
                           use_cache=True).logits
            nll.append(torch.nn.functional.cross_entropy(logits[0, -1:].float(), ids[0, i + 1:i + 2]))
            for layer in cache.layers:
                S = layer.keys.shape[-2]
                if S > cache_size:
                    keep = torch.cat([torch.arange(n_sink), torch.arange(S - (cache_size - n_sink), S)])
                    layer.keys, layer.values = layer.keys[:, :, keep], layer.values[:, :, keep]
        return torch.stack(nll)
    finally:
        model.set_attn_implementation("eager")


def test_positions_in_the_cache_equal_streamingllms_own_rerotation(monkeypatch):
    model, ids, layout = _setup("llama", length=24)
    ours = read_stream(model, ids, Policy("sinks", 6, 2, positions="cache"), layout, chunk=1)
    original = read_stream(model, ids, Policy("sinks", 6, 2, positions="original"), layout, chunk=1)
    # a window keeps relative distances, so both conventions agree on it (RoPE is relative)
    both = [read_stream(model, ids, Policy("window", 6, positions=p), layout, chunk=3) for p in ("cache", "original")]
    assert torch.allclose(*both, atol=1e-5)
    reference = _streamingllm_reference(model, ids, 6, 2, monkeypatch)  # patches the model's rotary until the test ends
    assert torch.allclose(ours, reference, atol=1e-5)
    assert (ours - original).abs().max() > 1e-3  # the conventions differ once keys are evicted


def test_rerotation_is_checked_on_the_model_itself():
    model, ids, layout = _setup("gpt_neox")  # partial rotary (25% of a head)
    rotary.check_rerotation(model, first_layer_keys(model, layout, ids[:, :8]), layout.inv_freq)
    for family, words in (("gpt2", "no rotary"), ("gemma3_text", "different ones")):
        model, ids, layout = _setup(family)
        with pytest.raises(SinkscopeError, match=words):
            rotary.check_rerotation(model, first_layer_keys(model, layout, ids[:, :8]), layout.inv_freq,
                                    problem=layout.rotary_problem)


def test_a_learned_sink_model_streams_on_its_phantom_alone():
    model, ids, layout = _setup("gpt_oss")
    alone = Policy("window", 6)  # no sink tokens: the phantom is the only sink
    streamed = read_stream(model, ids, alone, layout, chunk=1)
    assert torch.isfinite(streamed).all()
    assert torch.allclose(streamed, read_masked(model, ids, alone, layout, chunk=1), atol=TOL)
    with_cache = read_stream(model, ids, Policy("window", 6, positions="cache"), layout, chunk=4)
    assert torch.isfinite(with_cache).all()


def _cli(args):
    result = CliRunner().invoke(app, ["stream", *args])
    return result


def test_the_command_writes_the_table_the_per_token_array_and_p0_beside(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = _cli([str(tiny_llama_dir), "--text-file", str(text_file), "--length", "48", "--n-seqs", "2",
                   "--cache", "8,16", "--sink-tokens", "0,2", "--positions", "cache,original", "--chunk", "8",
                   "--bucket", "16", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    manifest = json.loads((out / "manifest.json").read_text())
    conditions = manifest["probes"]["stream"]["options"]["conditions"]
    labels = [c["label"] for c in conditions]
    assert labels[0] == "full" and len(labels) == 1 + 2 * 2 * 3  # full; per positions and cache: window, sinks, h2o
    nll = np.load(out / "stream_nll.npy")
    assert nll.shape == (len(conditions), 2, 47) and np.isfinite(nll).all()
    tokens = np.load(out / "tokens.npy")
    assert tokens.shape == (2, 48)
    overall = table[(table.probe == "stream") & (table.metric == "stream_nll") & table.position_bucket.isna()]
    assert len(overall) == len(conditions)
    for c, condition in enumerate(conditions):
        row = overall[(overall.policy == condition["policy"]) & (overall.positions == condition["positions"])
                      & (overall.sink_tokens == condition["sink_tokens"])
                      & ((overall.cache == condition["cache"]) if condition["cache"] else overall.cache.isna())]
        assert len(row) == 1
        assert row.value.iloc[0] == pytest.approx(nll[c].mean(), rel=1e-6)
        per_window = nll[c].astype(np.float64).mean(1)
        assert row.se.iloc[0] == pytest.approx(per_window.std(ddof=1) / np.sqrt(2), rel=1e-5)
    buckets = table[(table.metric == "stream_nll") & (table.policy == "full") & table.position_bucket.notna()]
    assert sorted(buckets.position_bucket) == [0, 16, 32]
    assert (buckets.n == 2).all()  # the two documents (windows), the se's unit (SPEC.md "Tables")
    # the full reading is the model's own dense forward
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    with torch.no_grad():
        dense = plain_nll(model, torch.from_numpy(tokens[:1]))
    assert np.allclose(nll[0, 0], dense.numpy(), atol=1e-4)
    # p0 mass beside, on the first max(cache) = 16 tokens of the same windows
    assert ((table.probe == "p0_mass") & (table.metric == "p0_mass")).any()
    page = (out / "report.html").read_text()
    assert "log perplexity against position" in page and "perplexity against cache size" in page
    for stem in ("stream_log_ppl_position", "stream_ppl_cache"):
        for where in ("cache", "original"):
            assert (out / "figures" / f"{stem}_{where}.png").is_file()
    # the position figure draws the table's numbers: the sinks line of the cache-8 panel, cache positions
    from sinkscope.report import stream as stream_report

    rows = stream_report.points(table)
    rows = rows[(rows.positions == "cache") | (rows.policy == "full")]
    figure = stream_report.log_ppl_by_position(rows, "test")
    panel = figure.axes[0]
    drawn = {line.get_label(): line.get_ydata() for line in panel.get_lines()}
    expected = rows[(rows.policy == "sinks") & (rows.cache == 8) & rows.position_bucket.notna()].sort_values(
        "position_bucket").value.to_numpy()
    assert np.allclose(drawn["sinks (2 tokens)"], expected)
    assert np.allclose(drawn["full (dense)"], rows[(rows.policy == "full") & rows.position_bucket.notna()].sort_values(
        "position_bucket").value.to_numpy())


def test_the_options_are_checked_before_anything_loads(tmp_path):
    for args, words in ((["--mode", "mask", "--policy", "full,h2o"], "h2o"),
                        (["--mode", "mask", "--positions", "cache", "--policy", "window"], "original positions"),
                        (["--policy", "window,lru"], "unknown --policy 'lru'"),
                        (["--cache", "0"], "--cache takes whole numbers >= 1"),
                        (["--cache", "64,64"], "twice"),
                        (["--chunk", "0"], "--chunk must be at least 1"),
                        (["--h2o-recent", "1.5"], "(0, 1)"),
                        (["--mode", "mask", "--positions", "original", "--length", "9000", "--policy", "window"],
                         "4096")):
        result = _cli([*args, "--out", str(tmp_path / "x")])
        assert result.exit_code != 0 and words in result.output, (args, result.output)
        assert "Traceback" not in result.output


STREAM_ARGS = ["--length", "40", "--n-seqs", "3", "--cache", "8", "--sink-tokens", "2", "--positions",
               "cache,original", "--chunk", "8", "--bucket", "16", "--no-figures", "--no-progress", "--device", "cpu"]


def _same_run(a, b) -> None:
    ta, tb = pd.read_csv(a / "results.csv"), pd.read_csv(b / "results.csv")
    pd.testing.assert_frame_equal(ta.drop(columns=["value", "se"]), tb.drop(columns=["value", "se"]))
    np.testing.assert_allclose(ta["value"], tb["value"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.load(a / "stream_nll.npy"), np.load(b / "stream_nll.npy"), rtol=1e-6, atol=1e-6)


def test_an_interrupted_stream_resumes_to_the_uninterrupted_table(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    args = [str(tiny_llama_dir), "--text-file", str(text_file), *STREAM_ARGS, "--checkpoint-seconds", "0"]
    whole = tmp_path / "whole"
    assert _cli([*args, "--out", str(whole)]).exit_code == 0
    import sinkscope.forward.stream.windows as windows_mod

    calls = {"n": 0}
    real = windows_mod.read_stream
    n_conditions = len(json.loads((whole / "manifest.json").read_text())["probes"]["stream"]["options"]["conditions"])

    def interrupted(*a, **k):  # Ctrl-C in the second document
        calls["n"] += 1
        if calls["n"] == n_conditions + 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(windows_mod, "read_stream", interrupted)
    killed = tmp_path / "killed"
    result = _cli([*args, "--out", str(killed)])
    assert result.exit_code != 0 and "--resume" in result.output and not killed.exists()
    monkeypatch.setattr(windows_mod, "read_stream", real)
    resumed = _cli([*args, "--out", str(killed), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "Resuming at window 1 of 3" in resumed.output
    _same_run(whole, killed)


@pytest.mark.slow  # spawns Python
def test_two_processes_share_the_documents(tiny_llama_dir, text_file, tmp_path):
    import os
    import subprocess
    import sys

    from conftest import free_port

    args = [str(tiny_llama_dir), "--text-file", str(text_file), *STREAM_ARGS]
    one = tmp_path / "one"
    assert _cli([*args, "--out", str(one)]).exit_code == 0
    two = tmp_path / "two"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(free_port()), "-m", "sinkscope", "stream", *args, "--out", str(two)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _same_run(one, two)
    assert json.loads((two / "manifest.json").read_text())["processes"] == 2
