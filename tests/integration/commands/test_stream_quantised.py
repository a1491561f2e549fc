"""`sinkscope stream --kv-bits`: a quantised key-value cache (SPEC.md "Quantised KV caches").

References: the model's own dense forward (16 bits), and the quantiser applied by hand to the
unquantised cache. The first layer's keys and values depend on the tokens and positions only, so
its quantised cache must equal ``kv_quant`` applied to the 16-bit reading's first layer, slot by
slot; protected tokens (the document's first N) come before anything is quantised, so every
layer holds them bit for bit as the 16-bit reading does.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from sinkscope.kvcache.policies import Policy
from sinkscope.cli import app
from sinkscope.kvcache.quant import KVQuant, quantize_keys, quantize_values
from sinkscope.forward.stream.reader import iter_chunks, layout_of, plain_nll, read_stream
from tiny_models import build, random_ids

L = 40


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _setup(family: str = "llama"):
    model = build(family)
    return model, random_ids(1, L, seed=0), layout_of(model, model.config.num_hidden_layers, L)


def _last(model, ids, policy, layout, chunk):
    reads = list(iter_chunks(model, ids, policy, layout, chunk=chunk))
    return reads[-1], torch.cat([r.nll for r in reads])


def test_16_bits_is_the_unquantised_reading_and_fewer_bits_change_it():
    model, ids, layout = _setup()
    dense = plain_nll(model, ids)
    assert torch.allclose(read_stream(model, ids, Policy("full", kv_bits=16), layout, chunk=8), dense, atol=1e-5)
    eight = read_stream(model, ids, Policy("full", kv_bits=8, kv_group=16), layout, chunk=8)
    two = read_stream(model, ids, Policy("full", kv_bits=2, kv_group=16), layout, chunk=8)
    assert not torch.equal(eight, dense) and (eight - dense).abs().max() < (two - dense).abs().max()


@pytest.mark.parametrize("scheme", ["kivi", "kivi-grouped", "per-token"])
@pytest.mark.parametrize("positions", ["original", "cache"])
def test_the_first_layers_cache_is_the_quantiser_applied_to_the_unquantised_one(scheme, positions):
    model, ids, layout = _setup()
    group, protect = 16, 0
    policy = Policy("window", 30, 0, positions)
    exact_read, _ = _last(model, ids, policy, layout, chunk=8)
    quant = Policy("window", 30, 0, positions, kv_bits=4, kv_group=group, kv_scheme=scheme, protect_sinks=protect)
    read, _ = _last(model, ids, quant, layout, chunk=8)
    assert torch.equal(read.kept[0], exact_read.kept[0])
    setting = KVQuant(4, group, scheme)
    reference, store = exact_read.cache.layers[0], read.cache.layers[0]
    exact = read.exact[0][0]  # (S,): the slots whose key is held in full precision
    value_exact = read.value_exact[0][0]  # (S,): the slots whose value is
    kept = read.kept[0][0]  # (S,): their document positions
    # the 40 tokens were cut to the 30 newest after the last chunk; kivi quantises whole groups of 16 keys in reading
    # order as they fill (tokens 0..15 and 16..31; 32..39 wait), per-token every token after its chunk
    expected_exact = kept >= 32 if scheme != "per-token" else torch.zeros_like(kept, dtype=torch.bool)
    assert torch.equal(exact, expected_exact)
    # kivi keeps the values of the 16 most recent tokens (24..39) exact; the others quantise a value with its key
    assert torch.equal(value_exact, kept >= 24 if scheme == "kivi" else expected_exact)
    quantised = (~exact).nonzero().squeeze(1)
    values_quantised = (~value_exact).nonzero().squeeze(1)
    assert torch.equal(store.values[:, :, value_exact], reference.values[:, :, value_exact])
    want_values = quantize_values(reference.values[:, :, values_quantised], setting)
    assert torch.allclose(store.values[:, :, values_quantised], want_values, atol=1e-6)
    if positions == "original" and scheme == "per-token":  # per token: each slot on its own
        want_keys = quantize_keys(reference.keys[:, :, quantised], setting)
        assert torch.allclose(store.keys[:, :, quantised], want_keys, atol=1e-6)
    if positions == "original" and scheme != "per-token":  # per channel over each group of 16 tokens (positions 16..31 whole)
        whole = ((kept >= 16) & (kept < 32)).nonzero().squeeze(1)
        want_keys = quantize_keys(reference.keys[:, :, whole], setting)
        assert torch.allclose(store.keys[:, :, whole], want_keys, atol=1e-5)
    assert not torch.allclose(store.keys[:, :, quantised], reference.keys[:, :, quantised], atol=1e-4)


@pytest.mark.parametrize("positions", ["original", "cache"])
def test_protected_tokens_are_held_bit_for_bit(positions):
    model, ids, layout = _setup()
    policy = Policy("sinks", 16, 4, positions)
    plain, _ = _last(model, ids, policy, layout, chunk=8)
    quant = Policy("sinks", 16, 4, positions, kv_bits=2, kv_group=8, kv_scheme="per-token", protect_sinks=4)
    read, nll = _last(model, ids, quant, layout, chunk=8)
    assert torch.isfinite(nll).all()
    for layer, (a, b) in enumerate(zip(plain.cache.layers, read.cache.layers)):
        assert torch.equal(read.kept[layer][0, :4], torch.arange(4))
        assert read.exact[layer][:, :4].all() and not read.exact[layer][:, 4:].any()
        assert torch.equal(b.keys[:, :, :4], a.keys[:, :, :4]), layer
        assert torch.equal(b.values[:, :, :4], a.values[:, :, :4]), layer
        assert not torch.equal(b.values[:, :, 4:], a.values[:, :, 4:])


def test_h2o_and_a_learned_sink_model_read_a_quantised_cache():
    model, ids, layout = _setup("gpt_oss")
    for policy in (Policy("h2o", 12, 0, "original", 6, kv_bits=4, kv_group=8),
                   Policy("window", 12, 0, "cache", kv_bits=2, kv_group=8, kv_scheme="per-token")):
        nll = read_stream(model, ids, policy, layout, chunk=4)
        assert nll.shape == (L - 1,) and torch.isfinite(nll).all()


def test_the_command_writes_the_quantisation_columns(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["stream", str(tiny_llama_dir), "--text-file", str(text_file), "--length", "40",
                                      "--n-seqs", "2", "--cache", "16", "--sink-tokens", "0", "--policy", "full,window",
                                      "--positions", "original", "--chunk", "8", "--kv-bits", "16,4",
                                      "--kv-group", "8", "--kv-scheme", "kivi", "--protect-sinks", "0,4",
                                      "--protect", "top-p0:2", "--out", str(out), "--no-progress", "--no-figures"])
    assert result.exit_code == 0, result.output
    conditions = json.loads((out / "manifest.json").read_text())["probes"]["stream"]["options"]["conditions"]
    assert len(conditions) == 2 * (1 + 3)  # full and window 16, each at 16 bits and at 4 bits x 3 protections
    assert [c["label"] for c in conditions[1:4]] == ["full, 4-bit kivi g8", "full, 4-bit kivi g8, first 4 exact",
                                                     "full, 4-bit kivi g8, top-p0:2 exact"]
    table = pd.read_csv(out / "results.csv")
    overall = table[(table.metric == "stream_nll") & table.position_bucket.isna()]
    assert {"kv_bits", "kv_group", "kv_scheme", "protect_sinks", "protect"} <= set(table.columns)
    assert sorted(overall.kv_bits.unique()) == [4, 16] and len(overall) == 8
    assert set(overall.protect.dropna()) == {"top-p0:2"}
    p0 = table[table.metric == "stream_p0_mass"]  # the sink metric through each condition's cache
    assert len(p0) == 8 and p0.value.between(0, 1).all()
    assert (p0.n == 2).all() and (overall.n == 2).all()  # the documents, the se's unit (SPEC.md "Tables")
    assert len(p0[(p0.policy == "full") & (p0.kv_bits == 16)]) == 1
    assert overall[overall.kv_bits == 16].kv_scheme.isna().all()
    nll = np.load(out / "stream_nll.npy")
    full16, full4 = nll[0], nll[1]
    assert not np.array_equal(full16, full4)
    refused = CliRunner().invoke(app, ["stream", "--mode", "mask", "--positions", "original", "--policy", "window",
                                       "--kv-bits", "4", "--out", str(tmp_path / "x")])
    assert refused.exit_code != 0 and "--kv-bits" in refused.output and "Traceback" not in refused.output
    for args, words in ((["--kv-bits", "5"], "--kv-bits takes"), (["--kv-scheme", "nf4"], "--kv-scheme"),
                        (["--kv-group", "1"], "--kv-group"), (["--protect", "top:3"], "--protect takes")):
        bad = CliRunner().invoke(app, ["stream", *args, "--out", str(tmp_path / "y")])
        assert bad.exit_code != 0 and words in bad.output and "Traceback" not in bad.output, bad.output


def test_top_p0_holds_the_keys_a_hand_computation_picks():
    """After the first chunk, top-p0:N holds, per layer and key-value head, the N keys with the most attention:
    the eager weights of the chunk's queries summed over queries and the query heads of each key-value head."""
    model, ids, layout = _setup()
    policy = Policy("full", kv_bits=4, kv_group=8, kv_scheme="per-token", protect="top-p0:2")
    first = next(iter_chunks(model, ids, policy, layout, chunk=6))
    attentions = model(input_ids=ids[:, :6], output_attentions=True).attentions  # per layer (1, H, 6, 6)
    for layer, weights in enumerate(attentions):
        column = weights[0].sum(1).view(2, 2, 6).sum(1)  # (H_kv, 6)
        for head in range(2):
            heavy = sorted(torch.topk(column[head], 2).indices.tolist())
            assert first.exact[layer][head].nonzero().squeeze(1).tolist() == heavy, (layer, head)


@pytest.mark.parametrize("rule", ["top-p0:3", "random:3"])
def test_a_protection_rule_holds_n_keys_exact_on_every_layer_and_head(rule):
    model, ids, layout = _setup()
    plain = list(iter_chunks(model, ids, Policy("window", 24, 0, "original"), layout, chunk=8))
    policy = Policy("window", 24, 0, "original", kv_bits=2, kv_group=8, kv_scheme="per-token", protect=rule)
    reads = list(iter_chunks(model, ids, policy, layout, chunk=8))
    for read in reads:
        for exact in read.exact:
            assert (exact.sum(1) == 3).all()  # per key-value head: N held, everything else quantised
    last, reference = reads[-1], plain[-1].cache.layers[0]
    for head in range(2):  # the first layer's held keys are the unquantised reading's, bit for bit
        held = last.exact[0][head]
        assert torch.equal(last.cache.layers[0].keys[:, head, held], reference.keys[:, head, held])
    if rule.startswith("random"):  # the control keeps what it drew while it stays cached, and draws the same again
        for before, after in zip(reads, reads[1:]):
            for layer in range(len(before.exact)):
                for head in range(2):
                    was = before.kept[layer][head][before.exact[layer][head]]
                    still = was[torch.isin(was, after.kept[layer][head])]
                    now = after.kept[layer][head][after.exact[layer][head]]
                    assert torch.isin(still, now).all()
        again = torch.cat([r.nll for r in iter_chunks(model, ids, policy, layout, chunk=8)])
        assert torch.equal(again, torch.cat([r.nll for r in reads]))


def test_top_p0_reads_through_sink_copies_and_h2o():
    model, ids, layout = _setup()
    for policy in (Policy("sinks", 12, 2, "cache", kv_bits=4, kv_group=8, kv_scheme="per-token", protect="top-p0:2"),
                   Policy("h2o", 12, 0, "original", 6, kv_bits=4, kv_group=8, protect="random:2")):
        nll = read_stream(model, ids, policy, layout, chunk=4)
        assert nll.shape == (L - 1,) and torch.isfinite(nll).all()


def test_transformers_backend_serves_only_what_it_computes_as_ours_and_says_why():
    from sinkscope.errors import SinkscopeError
    from sinkscope.kvcache.quant import transformers_serves, transformers_why_not
    from sinkscope.forward.stream import hf_quant

    served = Policy("full", kv_bits=4, kv_group=8, kv_scheme="per-token")
    assert transformers_serves(served)
    for policy, words in ((Policy("window", 8, kv_bits=4, kv_scheme="per-token"), "bounded cache"),
                          (Policy("full", kv_bits=4, kv_scheme="kivi"), "kivi"),
                          (Policy("full", kv_bits=8, kv_scheme="per-token"), "8 bits"),
                          (Policy("full", kv_bits=2, kv_scheme="per-token", protect_sinks=4), "protected")):
        assert not transformers_serves(policy) and words in transformers_why_not(policy)
    model, ids, layout = _setup()
    with pytest.raises(SinkscopeError, match="not a multiple"):  # the tiny model's head dimension is 16
        hf_quant.read_quantised_cache(model, ids, Policy("full", kv_bits=4, kv_group=6, kv_scheme="per-token"),
                                      layout.cache_kwarg, chunk=8)


@pytest.mark.slow  # optimum-quanto builds its CPU kernels on first use (about a minute); make test-all installs it
@pytest.mark.parametrize("bits", [4, 2])
def test_transformers_quantised_cache_agrees_with_ours_where_both_serve(bits):
    """transformers' QuantizedCache (quanto, residual 1: each chunk flushed after its pass) against sinkscope's
    per-token quantiser on the full cache: the same grid, so the same NLL up to float32 re-quantisation."""
    pytest.importorskip("optimum.quanto")
    from sinkscope.kvcache.quant import transformers_serves

    model, ids, layout = _setup()
    ours = Policy("full", kv_bits=bits, kv_group=8, kv_scheme="per-token")
    theirs = Policy("full", kv_bits=bits, kv_group=8, kv_scheme="per-token", kv_backend="transformers")
    assert transformers_serves(ours) and not transformers_serves(Policy("window", 8, kv_bits=bits, kv_scheme="per-token"))
    mine = read_stream(model, ids, ours, layout, chunk=8)
    transformers_nll = read_stream(model, ids, theirs, layout, chunk=8)
    dense = plain_nll(model, ids)
    gap = (mine - dense).abs().max()
    assert gap > 1e-4  # the quantisation shows
    assert torch.allclose(transformers_nll, mine, atol=max(1e-5, 1e-2 * float(gap))), (transformers_nll - mine).abs().max()


@pytest.mark.slow  # optimum-quanto, as above
def test_the_run_says_which_backend_read_each_condition(tiny_llama_dir, text_file, tmp_path):
    pytest.importorskip("optimum.quanto")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["stream", str(tiny_llama_dir), "--text-file", str(text_file), "--length", "32",
                                      "--cache", "16", "--sink-tokens", "0", "--policy", "full,window", "--positions",
                                      "original", "--chunk", "8", "--kv-bits", "4", "--kv-group", "8", "--kv-scheme",
                                      "per-token", "--kv-backend", "transformers", "--out", str(out), "--no-progress",
                                      "--no-figures"])
    assert result.exit_code == 0, result.output
    assert "transformers' QuantizedCache (quanto) reads 1 condition(s)" in result.output
    assert "a bounded cache" in result.output
    conditions = json.loads((out / "manifest.json").read_text())["probes"]["stream"]["options"]["conditions"]
    assert [c["kv_backend"] for c in conditions] == ["transformers", "sinkscope"]  # full, window 16 (4 bits only)
    table = pd.read_csv(out / "results.csv")
    assert set(table.kv_backend.dropna()) == {"sinkscope", "transformers"}
    # the transformers-read condition went through its QuantizedCache, which exposes no per-slot precision
    assert table[table.metric == "stream_quantised_share"].kv_backend.tolist() == ["sinkscope"]


def test_p0_mass_through_the_cache_is_the_eager_weight_on_position_0():
    """The position-0 share read through the cache: with every earlier key visible it is the model's own eager
    weight on key 0 averaged over layers, heads and queries 1 .. L - 1; a window counts only the queries that
    still see position 0 (1 .. C, which read as densely); the copies of --positions cache count for it too."""
    from sinkscope.forward.stream.reader import read_stream_p0

    model, ids, layout = _setup()
    eager = torch.stack(model(input_ids=ids, output_attentions=True).attentions)[:, 0, :, :, 0]  # (layers, H, L): a_i0
    n_layers, H = eager.shape[:2]
    reading = read_stream_p0(model, ids, Policy("full"), layout, chunk=8)
    total, count = reading.p0_sum, reading.p0_count
    assert count == n_layers * H * (L - 1)
    assert total / count == pytest.approx(float(eager[:, :, 1:].double().mean()), rel=1e-4)
    reading = read_stream_p0(model, ids, Policy("window", 6, 0, "original"), layout, chunk=8)
    total, count = reading.p0_sum, reading.p0_count
    assert count == n_layers * H * 6
    assert total / count == pytest.approx(float(eager[:, :, 1:7].double().mean()), rel=1e-4)
    reading = read_stream_p0(model, ids, Policy("sinks", 12, 2, "cache", kv_bits=2, kv_group=8), layout, chunk=8)
    total, count = reading.p0_sum, reading.p0_count
    assert count == n_layers * H * (L - 1) and 0 < total / count < 1


def test_a_kivi_cache_too_small_for_one_group_is_named():
    from sinkscope.forward.stream.windows import residual_only

    small = Policy("sinks", 64, 4, "cache", kv_bits=2, kv_group=64)
    conditions = [small, Policy("sinks", 256, 4, "cache", kv_bits=2, kv_group=64),
                  Policy("sinks", 64, 4, "cache", kv_bits=2, kv_group=64, kv_scheme="per-token"),
                  Policy("full", kv_bits=2, kv_group=64), Policy("window", 64)]
    assert residual_only(conditions) == [small]
    # and it is so: after the cache fills, the 60 recent keys of sinks 4+60 stay exact under kivi g64
    model, ids, layout = _setup()
    last = list(iter_chunks(model, ids, Policy("sinks", 12, 2, "original", kv_bits=2, kv_group=16), layout, chunk=4))[-1]
    assert last.exact[0][:, 2:].all()


_NOTHING = [Policy("window", 16, 0, "original", kv_bits=2, kv_group=64),        # group 64, cache 16 (issue 62)
            Policy("full", kv_bits=2, kv_group=64),                              # 40 tokens: no block of 64
            Policy("window", 8, 0, "original", kv_bits=2, kv_group=4, kv_scheme="per-token", protect="top-p0:8"),
            Policy("sinks", 8, 2, "original", kv_bits=2, kv_group=4, kv_scheme="per-token", protect_sinks=1000),
            Policy("full", kv_bits=2, kv_group=8, protect_sinks=34)]            # 6 quantisable keys < 8, values recent
_SOME = [Policy("window", 16, 0, "original", kv_bits=2, kv_group=16),            # a cache of exactly one block
         Policy("sinks", 12, 2, "original", kv_bits=2, kv_group=16),             # keys exact, the sinks' values not
         Policy("window", 8, 0, "original", kv_bits=2, kv_group=4, kv_scheme="per-token", protect="top-p0:7")]


@pytest.mark.parametrize("policy", _NOTHING + _SOME, ids=lambda p: p.label)
def test_a_condition_named_as_quantising_nothing_reads_as_16_bits(policy):
    """``kvcache.unquantised`` names exactly the conditions the reader leaves unquantised: their reading is
    the 16-bit one (bit-identical, or, under ``--protect top-p0``, whose layers run the kernel that also sums each
    key's attention, ``kernels.attention_with_received``, equal to float32 rounding), and the near misses' is not."""
    from dataclasses import replace

    from sinkscope.kvcache.unquantised import why_nothing_quantised

    model, ids, layout = _setup()
    quantised = read_stream(model, ids, policy, layout, chunk=4)
    exact = read_stream(model, ids, replace(policy, kv_bits=16, protect="", protect_sinks=0), layout, chunk=4)
    named = why_nothing_quantised(policy, L) is not None
    assert named == (policy in _NOTHING)
    if policy.protect.startswith("top-p0"):  # another kernel: the same numbers to rounding, or clearly not
        same = torch.allclose(quantised, exact, rtol=1e-5, atol=1e-6)
        assert same == named and (same or (quantised - exact).abs().max() > 1e-3)
    else:
        assert torch.equal(quantised, exact) == named
    from sinkscope.forward.stream.reader import read_stream_p0

    reading = read_stream_p0(model, ids, policy, layout, chunk=4)  # the measured share says the same
    assert torch.equal(reading.nll, quantised)
    assert (reading.quantised == 0) == named and reading.held > 0


def _chunk_ends(chunk: int) -> list[int]:
    return [min(t, L) for t in range(chunk, L + chunk, chunk)]


@pytest.mark.parametrize("chunk", [8, 4, 3])
def test_the_quantised_share_counts_what_the_rule_quantises(chunk):
    """``stream_quantised_share``'s counts against the rule worked out by hand on a full cache of t tokens after
    each chunk (SPEC.md "Quantised KV caches"): per-token with the first P exact quantises max(0, t - P) keys and as many
    values; kivi with R = g quantises the keys of whole blocks, t - (t mod R), and every value but the R newest,
    max(0, t - R). Every layer and key-value head holds the same slots, so the share is the per-slot ratio."""
    from sinkscope.forward.stream.reader import read_stream_p0

    model, ids, layout = _setup()
    slots = model.config.num_hidden_layers * model.config.num_key_value_heads
    ends = _chunk_ends(chunk)
    P, R = 5, 8
    for policy, quantised in ((Policy("full", kv_bits=2, kv_group=4, kv_scheme="per-token", protect_sinks=P),
                               [2 * max(0, t - P) for t in ends]),
                              (Policy("full", kv_bits=2, kv_group=R, kv_scheme="kivi"),
                               [t - t % R + max(0, t - R) for t in ends])):
        reading = read_stream_p0(model, ids, policy, layout, chunk=chunk)
        assert reading.held == slots * sum(2 * t for t in ends)
        assert reading.quantised == slots * sum(quantised), policy.label


def test_a_quantised_run_reads_four_documents_by_default_and_reports_the_share(tiny_llama_dir, text_file, tmp_path):
    """--kv-bits without --n-seqs reads 4 documents (a standard error on every quantised row); --n-seqs 1 is
    honoured with a note on the last-bit noise; each quantised condition has a stream_quantised_share row."""
    common = ["stream", str(tiny_llama_dir), "--text-file", str(text_file), "--length", "24", "--policy", "full",
              "--chunk", "8", "--kv-bits", "16,2", "--kv-group", "8", "--no-progress", "--no-figures"]
    result = CliRunner().invoke(app, [*common, "--out", str(tmp_path / "four")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "four" / "manifest.json").read_text())["options"]["n_seqs"] == 4
    table = pd.read_csv(tmp_path / "four" / "results.csv")
    ppl = table[(table.metric == "stream_ppl") & table.position_bucket.isna()]
    assert (ppl.n == 4).all() and ppl.se.notna().all()
    share = table[table.metric == "stream_quantised_share"]
    assert len(share) == 1 and share.kv_bits.tolist() == [2] and 0 < share.value.iloc[0] < 1 and share.n.iloc[0] == 4
    assert "one document gives" not in result.output
    one = CliRunner().invoke(app, [*common, "--n-seqs", "1", "--out", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    assert "one document gives the quantised rows no standard error" in one.output and "--n-seqs 4" in one.output
    plain = CliRunner().invoke(app, [*common[:-6], "--no-progress", "--no-figures", "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    assert json.loads((tmp_path / "plain" / "manifest.json").read_text())["options"]["n_seqs"] == 1


def test_the_run_prints_one_line_per_condition_that_quantises_nothing(tiny_llama_dir, text_file, tmp_path):
    """group 64, cache 16 (the issue's case): window 16 and sinks 4+12 at 2 bits hold every key and value exact
    over 40 tokens; one line each, keys and values, instead of the note that speaks of keys only. (A protection
    that covers the whole cache is refused before reading: ``commands/stream.py``.)"""
    result = CliRunner().invoke(app, ["stream", str(tiny_llama_dir), "--text-file", str(text_file), "--length", "40",
                                      "--cache", "16", "--sink-tokens", "4", "--policy", "window,sinks", "--positions",
                                      "original", "--chunk", "8", "--kv-bits", "16,2", "--kv-group", "64",
                                      "--out", str(tmp_path / "run"), "--no-progress", "--no-figures"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "quantises nothing" in line]
    assert len(lines) == 2, result.output
    assert all("2-bit kivi g64" in line and "16-bit" in line and "value" in line for line in lines)
    assert "never reach the residual length" not in result.output  # the keys-only note is not said as well


@pytest.mark.slow  # draws the report's figures
def test_the_report_names_each_conditions_share_of_the_cache_quantised(tiny_llama_dir, text_file, tmp_path):
    """The stream table's quantisation cell carries stream_quantised_share: a condition that quantises nothing
    (group 64 over 40 tokens of window 16) says so, the others give their share."""
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["stream", str(tiny_llama_dir), "--text-file", str(text_file), "--length", "40",
                                      "--n-seqs", "2", "--cache", "16", "--sink-tokens", "0", "--policy", "full,window",
                                      "--positions", "original", "--chunk", "8", "--kv-bits", "16,2", "--kv-group",
                                      "64,8", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    share = table[table.metric == "stream_quantised_share"].set_index(["policy", "kv_group"]).value
    assert share[("window", 64)] == 0 and share[("full", 64)] == 0 and 0 < share[("window", 8)] < 1
    page = (out / "report.html").read_text()
    assert "2-bit kivi g64; quantises nothing (rows = 16-bit)" in page
    assert f"2-bit kivi g8; {100 * share[('window', 8)]:.0f}% of the cache quantised" in page
