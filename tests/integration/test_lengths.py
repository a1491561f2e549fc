"""Sinks across context lengths (issue 18): one multi-length run, the leak-model fit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import sinkscope
from sinkscope.stats import leak as leak_mod
from sinkscope.errors import SinkscopeError
from sinkscope.commands.spec import parse_seq_len
from tiny_models import build
from repo_paths import REPO

LENGTHS = (8, 16, 32)


@pytest.fixture(scope="module")
def multi(tiny_llama_dir, text_file):
    return sinkscope.measure("sinks", str(tiny_llama_dir), text_file=str(text_file), seq_len=list(LENGTHS), n_seqs=4)


def test_parse_seq_len():
    assert parse_seq_len("512") == 512
    assert parse_seq_len("2048,128, 512") == (128, 512, 2048)
    assert parse_seq_len(None) is None
    with pytest.raises(SinkscopeError, match="comma-separated"):
        parse_seq_len("128,x")


def test_one_multi_length_run_equals_separate_runs_at_each_length(multi, tiny_llama_dir):
    table = multi.table
    assert "seq_len" in table.columns and set(table["seq_len"].dropna().astype(int)) == set(LENGTHS)
    assert multi.tokens.shape == (4, max(LENGTHS))  # the windows are drawn at the longest length
    assert multi.manifest["windows"]["seq_lens"] == list(LENGTHS)
    for n in LENGTHS:
        # a separate run on the prefixes of the same windows (what "same documents" means)
        alone = sinkscope.measure("sinks", str(tiny_llama_dir), windows=multi.tokens[:, :n]).table
        part = table[(table["seq_len"] == n) & (table["probe"] != "leak_fit")].drop(columns="seq_len")
        part = part.reset_index(drop=True)
        pd.testing.assert_frame_equal(part[["probe", "metric", "layer", "head", "n"]],
                                      alone[["probe", "metric", "layer", "head", "n"]])
        np.testing.assert_allclose(part["value"], alone["value"], rtol=1e-6, atol=1e-7)


def test_windows_of_each_length_are_prefixes_of_the_same_documents(tiny_llama_dir, text_file):
    """The longest length's windows are the ones a single run at that length draws."""
    longest = sinkscope.measure("sinks", str(tiny_llama_dir), text_file=str(text_file), seq_len=32, n_seqs=4)
    multi = sinkscope.measure("p0_mass", str(tiny_llama_dir), text_file=str(text_file), seq_len=[8, 32], n_seqs=4)
    np.testing.assert_array_equal(multi.tokens, longest.tokens)


def test_single_length_table_has_no_seq_len_column(tiny_llama_dir, text_file):
    one = sinkscope.measure("p0_mass", str(tiny_llama_dir), text_file=str(text_file), seq_len=[16], n_seqs=2)
    assert "seq_len" not in one.table.columns and one.manifest["windows"]["seq_len"] == 16
    assert one.manifest["options"]["seq_len"] == 16


def test_several_lengths_refuse_resume_and_given_windows(tiny_llama_dir):
    with pytest.raises(SinkscopeError, match="resume"):
        sinkscope.measure("sinks", str(tiny_llama_dir), seq_len=[8, 16], resume=True, out="x")
    model = build("llama")
    with pytest.raises(SinkscopeError, match="own length"):
        sinkscope.measure("sinks", model, windows=np.zeros((2, 16), dtype=np.int64), seq_len=[8, 16])


# ---- the leak model -----------------------------------------------------------------------------


def synthetic_p0(delta: float, seq_len: int, n_keys_noise: float = 0.0, seed: int = 0) -> float:
    """p0 from explicit softmax rows: key 0's logit is Delta above the other keys' (plus noise)."""
    rng = np.random.default_rng(seed)
    p0 = []
    for i in range(1, seq_len):
        logits = np.concatenate([[delta], rng.normal(0.0, n_keys_noise, size=i)])  # keys 0..i
        w = np.exp(logits - logits.max())
        p0.append(w[0] / w.sum())
    return float(np.mean(p0))


@pytest.mark.parametrize("delta", [-1.0, 0.0, 2.5, 6.0, 11.0])
def test_leak_fit_recovers_a_known_gap(delta):
    measured = synthetic_p0(delta, 64)
    assert leak_mod.fit_delta([measured], 64)[0] == pytest.approx(delta, abs=1e-6)
    # and predicts the longer lengths exactly
    for n in (256, 1024):
        assert leak_mod.p0_under_gap([delta], n)[0] == pytest.approx(synthetic_p0(delta, n), abs=1e-9)


def test_leak_formula_matches_seed_001():
    gap = np.log(32767 * 0.95 / 0.05)
    assert leak_mod.leak(gap, 32768) == pytest.approx(0.05)
    assert leak_mod.leak(gap, 131072) == pytest.approx(0.174, abs=1e-3)


def test_leak_rows_recover_delta_per_head_from_a_table():
    """leak_rows on p0 rows built from known gaps: Delta per head, zero prediction error."""
    from sinkscope.store.results import Row

    deltas = {(0, 0): 1.0, (0, 1): 4.0, (1, 0): 8.0, (1, 1): -0.5}
    rows = [Row("p0_mass", "p0_mass", l, h, synthetic_p0(d, n), 10, (("seq_len", n),))
            for n in (16, 64, 128) for (l, h), d in deltas.items()]
    out = {(r.metric, r.layer, r.head, dict(r.conditions)["seq_len"]): r.value for r in leak_mod.leak_rows(rows)}
    for (l, h), d in deltas.items():
        assert out[("leak_delta", l, h, 16)] == pytest.approx(d, abs=1e-6)
        for n in (16, 64, 128):  # a fixed gap: every length implies the same one
            assert out[("leak_gap", l, h, n)] == pytest.approx(d, abs=1e-6)
        for n in (64, 128):
            assert abs(out[("leak_p0_error", l, h, n)]) < 1e-9
    assert out[("leak_delta", 0, None, 16)] == pytest.approx(2.5, abs=1e-6)


def test_multi_length_run_has_the_leak_fit(multi):
    t = multi.table
    fit = t[t.probe == "leak_fit"]
    assert set(fit.metric) == {"leak_delta", "leak_p0_predicted", "leak_p0_error", "leak", "leak_gap", "leak_delta_dp0",
                               "leak_delta_ill_conditioned"}
    gap = fit[(fit.metric == "leak_gap") & fit["head"].notna()]
    assert set(gap["seq_len"].astype(int)) == set(LENGTHS)
    shortest = gap[gap.seq_len == min(LENGTHS)].set_index(["layer", "head"])["value"]
    delta = fit[(fit.metric == "leak_delta") & fit["head"].notna()].set_index(["layer", "head"])["value"]
    pd.testing.assert_series_equal(shortest, delta)
    assert set(fit[fit.metric == "leak_delta"]["seq_len"].astype(int)) == {min(LENGTHS)}
    assert set(fit[fit.metric == "leak_p0_error"]["seq_len"].astype(int)) == set(LENGTHS[1:])
    # the fitted Delta reproduces the measured p0 at the shortest length
    p0 = t[(t.metric == "p0_mass") & (t.seq_len == min(LENGTHS)) & t["head"].notna()].set_index(["layer", "head"])
    d = fit[(fit.metric == "leak_delta") & fit["head"].notna()].set_index(["layer", "head"])["value"]
    back = leak_mod.p0_under_gap(d.to_numpy(), min(LENGTHS))
    np.testing.assert_allclose(back, p0.loc[d.index, "value"].to_numpy(), atol=1e-9)
    assert "leak_fit" in multi.manifest["probes"]


# ---- the report and the CLI --------------------------------------------------------------------


def test_report_overlays_the_lengths_and_draws_metrics_against_length(multi, tmp_path):
    multi.save(tmp_path / "run")
    page = (tmp_path / "run" / "report.html").read_text()
    figs = {p.name for p in (tmp_path / "run" / "figures").iterdir()}
    assert "overlay_p0_mass.png" in figs  # one line per length against layer
    assert "length_p0_mass_run0.png" in figs and "length_leak_delta_run0.png" in figs
    assert "length_leak_gap_run0.png" in figs
    assert 'id="probe-lengths"' in page and "seq-len 8" in page and "seq-len 32" in page
    assert "differ in seq-len" not in page
    from sinkscope.report import build_report

    assert build_report([tmp_path / "run"]) == tmp_path / "run" / "report.html"  # its own page, not a comparison


def test_cli_takes_comma_separated_lengths(tiny_llama_dir, text_file, tmp_path):
    from typer.testing import CliRunner

    from sinkscope.cli import app

    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len",
                                      "16,8", "--n-seqs", "2", "--out", str(out), "--no-figures", "--no-progress"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    assert sorted(table["seq_len"].unique()) == [8, 16]
    bad = CliRunner().invoke(app, ["sinks", str(tiny_llama_dir), "--seq-len", "8,x"])
    assert bad.exit_code == 1 and "comma-separated" in bad.output


# ---- sliding vs full layers ------------------------------------------------------------------------


def _table_value(table, metric, layer=None, head=None, **conditions):
    rows = table[table.metric == metric]
    rows = rows[rows.layer.isna()] if layer is None else rows[rows.layer == layer]
    rows = rows[rows["head"].isna()] if head is None else rows[rows["head"] == head]
    for key, value in conditions.items():
        rows = rows[rows[key] == value]
    if "layer_type" in rows.columns and "layer_type" not in conditions:
        rows = rows[rows["layer_type"].isna()]
    assert len(rows) == 1, (metric, layer, head, conditions, len(rows))
    return float(rows["value"].iloc[0])


@pytest.mark.parametrize("attention", ["fused", "explicit"])
@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_split_by_layer_type_equals_explicit_computation(family, attention):
    import torch

    from tiny_models import random_ids

    model = build(family)
    ids = random_ids(batch=2, length=24)
    T, W = ids.shape[1], model.config.sliding_window
    table = sinkscope.measure("sinks", model, windows=ids.numpy(), attention=attention).table
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions  # per layer (B, H, T, T): a_ij
    per_layer = {}
    for layer, a in enumerate(attentions):
        w = (a / a.sum(-1, keepdim=True)).double()  # w_ij over real keys (gpt-oss drops its sink column)
        p0 = w[..., 0][:, :, 1:]  # (B, H, T-1): queries i >= 1
        sliding = model.config.layer_types[layer] == "sliding_attention"
        per_layer[layer] = p0.mean((0, 2)).mean().item()
        for head in range(p0.shape[1]):
            assert _table_value(table, "p0_mass", layer, head) == pytest.approx(p0[:, head].mean().item(), abs=1e-5)
            if sliding:  # queries 1 .. W-1 see key 0; W .. T-1 do not
                assert (p0[:, :, W - 1:] == 0).all()
                in_reach = p0[:, head, :W - 1].mean().item()
                assert _table_value(table, "p0_mass_in_reach", layer, head) == pytest.approx(in_reach, abs=1e-5)
                assert _table_value(table, "p0_out_of_reach", layer, head) == pytest.approx((T - W) / (T - 1))
        if not sliding:
            assert not ((table.metric == "p0_mass_in_reach") & (table.layer == layer)).any()
    sliding_layers = [l for l, kind in enumerate(model.config.layer_types) if kind == "sliding_attention"]
    full_layers = [l for l in per_layer if l not in sliding_layers]
    assert _table_value(table, "p0_mass", layer_type="sliding") == pytest.approx(
        np.mean([per_layer[l] for l in sliding_layers]), abs=1e-5)
    assert _table_value(table, "p0_mass", layer_type="full") == pytest.approx(
        np.mean([per_layer[l] for l in full_layers]), abs=1e-5)
    # every metric of the table has its split (massive activations excepted: not means)
    split = set(table[table["layer_type"].notna()].metric)
    assert {"p0_mass", "sink_alpha", "phantom_mass", "value_norm_ratio"} <= split
    assert not any(m.startswith("massive_activation") for m in split)


def test_models_without_sliding_layers_get_no_split(multi):
    assert "layer_type" not in multi.table.columns
    assert not (multi.table.metric == "p0_out_of_reach").any()


def test_report_has_the_layer_type_table(tmp_path):
    from tiny_models import random_ids

    result = sinkscope.measure("sinks", build("gpt_oss"), windows=random_ids(batch=2, length=24).numpy())
    result.save(tmp_path / "run")
    page = (tmp_path / "run" / "report.html").read_text()
    assert 'id="probe-layer_types"' in page and "p0_mass_in_reach" in page and "sliding layers" in page


# ---- eviction on windowed layers ------------------------------------------------------------------


def _hand_eviction(model, ids):
    """Per (layer, head): explicit loops over queries, deleting the leaving key and renormalising."""
    import torch

    values, handles = {}, []
    cfg = model.config
    Hkv, D = cfg.num_key_value_heads, cfg.head_dim
    for i, layer in enumerate(model.model.layers):
        handles.append(layer.self_attn.v_proj.register_forward_hook(
            lambda _m, _i, out, i=i: values.__setitem__(i, out.view(out.shape[0], out.shape[1], Hkv, D))))
    with torch.no_grad():
        attentions = model(ids, output_attentions=True, use_cache=False).attentions
    for h in handles:
        h.remove()
    W, (B, T) = cfg.sliding_window, ids.shape
    out = {}
    for layer, a in enumerate(attentions):
        if cfg.layer_types[layer] != "sliding_attention":
            continue
        a, v = a.double().numpy(), values[layer].double().numpy()  # (B, H, T, T), (B, T, Hkv, D)
        H = a.shape[1]
        for head in range(H):
            kv = head // (H // Hkv)
            mass, shift, rel, anchor = [], [], [], []
            for b in range(B):
                for i in range(W - 1, T - 1):  # full window, and a next query that no longer sees e
                    e = i - W + 1
                    row = a[b, head, i, :i + 1]  # a_ij; the phantom holds 1 - sum
                    o = row @ v[b, :i + 1, kv]
                    kept = np.append(np.where(np.arange(i + 1) == e, 0.0, row), 1.0 - row.sum())
                    kept = kept / kept.sum()  # renormalised, phantom included
                    moved = np.linalg.norm(kept[:-1] @ v[b, :i + 1, kv] - o)
                    mass.append(row[e]); shift.append(moved); rel.append(moved / np.linalg.norm(o))
                    if e == 0:
                        anchor.append(moved / np.linalg.norm(o))
            out[(layer, head)] = {"eviction_mass": np.mean(mass), "eviction_shift": np.mean(shift),
                                  "eviction_shift_rel": np.mean(rel), "eviction_anchor_shift_rel": np.mean(anchor)}
    return out


@pytest.mark.parametrize("attention", ["fused", "explicit"])
def test_eviction_probe_equals_a_hand_computation_on_tiny_gpt_oss(attention):
    from tiny_models import random_ids

    model = build("gpt_oss")
    ids = random_ids(batch=2, length=20)
    table = sinkscope.measure("eviction", model, windows=ids.numpy(), attention=attention).table
    expected = _hand_eviction(model, ids)
    assert expected and set(table.dropna(subset=["head"]).layer.astype(int)) == {l for l, _ in expected}
    for (layer, head), metrics in expected.items():
        for metric, value in metrics.items():
            assert _table_value(table, metric, layer, head) == pytest.approx(value, rel=1e-4, abs=1e-6), metric
    n = table[(table.metric == "eviction_mass") & (table.layer == 0) & (table["head"] == 0)]["n"].item()
    assert n == 2 * (20 - 1 - (model.config.sliding_window - 1))  # every full window but the last query's


def test_eviction_probe_refuses_a_model_it_cannot_measure():
    """No sliding layers, or windows covering the whole sequence: one sentence, not an empty table."""
    from tiny_models import random_ids

    from sinkscope.errors import SinkscopeError

    with pytest.raises(SinkscopeError, match="no sliding-window layers"):
        sinkscope.measure("eviction", build("llama"), windows=random_ids(batch=1, length=12).numpy())
    with pytest.raises(SinkscopeError, match="covers the whole 8-token window"):
        sinkscope.measure("eviction", build("gemma3_text"), windows=random_ids(batch=1, length=8).numpy())


@pytest.mark.parametrize("variant", ["baseline", "sinklogit", "sinktoken"])
def test_eviction_and_layer_types_on_trainer_models_with_a_layer_pattern(variant):
    import torch

    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=3, n_head=4, n_embd=32, variant=variant,
                          layer_pattern="sliding,full", window=4)).eval()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1)).numpy()
    fused = sinkscope.measure(["eviction", "p0_mass"], model, windows=ids, attention="fused").table
    explicit = sinkscope.measure(["eviction", "p0_mass"], model, windows=ids, attention="explicit").table
    np.testing.assert_allclose(fused["value"], explicit["value"], rtol=1e-4, atol=1e-6)
    per_head = fused[(fused.probe == "eviction") & fused["head"].notna()]
    assert set(per_head.layer.astype(int)) == {0, 2}  # the sliding layers
    # the trainer's sink token stays visible: key 0 never leaves, so no anchor eviction
    has_anchor = (per_head.metric == "eviction_anchor_shift_rel").any()
    assert has_anchor == (variant != "sinktoken")
    assert set(fused["layer_type"].dropna()) == {"sliding", "full"}


@pytest.mark.parametrize("attention", ["fused", "explicit"])
@pytest.mark.parametrize("variant", ["baseline", "sinklogit", "sinktoken"])
def test_sink_rate_in_reach_on_trainer_models_with_a_layer_pattern(variant, attention):
    import torch

    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    torch.manual_seed(0)
    T, W = 16, 4
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=3, n_head=4, n_embd=32, variant=variant,
                          layer_pattern="sliding,full", window=W)).eval()
    ids = torch.randint(0, 64, (3, T), generator=torch.Generator().manual_seed(1)).numpy()
    table = sinkscope.measure("sink_rate", model, windows=ids, attention=attention).table
    table = table[table["layer_type"].isna()] if "layer_type" in table.columns else table
    heads = table[table["head"].notna()]
    for metric in ("sink_rate_in_reach", "sink_alpha_in_reach"):
        assert set(heads[heads.metric == metric].layer.astype(int)) == {0, 2}  # the sliding layers only
    for layer in (0, 2):
        for head in range(4):
            alpha = _table_value(table, "sink_alpha", layer, head)
            reach = _table_value(table, "sink_alpha_in_reach", layer, head)
            # queries t = 0 .. W-1 see key 0 and the other T - W give it 0, so alpha_0 = (W / T) alpha_0^reach;
            # the trainer's sink token stays visible to every query, so there both are the same mean
            expected = alpha if variant == "sinktoken" else alpha * T / W
            assert reach == pytest.approx(expected, rel=1e-5, abs=1e-7)
    model_row = _table_value(table, "sink_alpha_in_reach")
    assert model_row == pytest.approx(np.mean([_table_value(table, "sink_alpha_in_reach", l) for l in (0, 2)]))


def synthetic_share(delta: float, seq_len: int, window: int | None, phantom: bool) -> float:
    """Explicit softmax rows with a sliding window: key 0 (or a phantom) Delta above the rest."""
    shares = []
    for i in range(1, seq_len):
        visible = [j for j in range(i + 1) if window is None or i - j < window]
        logits = [delta if (j == 0 and not phantom) else 0.0 for j in visible] + ([delta] if phantom else [])
        w = np.exp(np.array(logits) - max(logits))
        w = w / w.sum()
        if phantom:
            shares.append(w[-1])
        else:  # key 0's share of the real-key mass, 0 when it is out of reach
            shares.append(w[0] if visible[0] == 0 else 0.0)
    return float(np.mean(shares))


@pytest.mark.parametrize("phantom", [False, True])
@pytest.mark.parametrize("window", [None, 8])
def test_leak_fit_recovers_a_known_gap_with_windows_and_phantoms(window, phantom):
    for delta in (0.5, 3.0, 7.0):
        measured = synthetic_share(delta, 24, window, phantom)
        fitted = leak_mod.fit_delta([measured], 24, window=window, phantom=phantom)[0]
        assert fitted == pytest.approx(delta, abs=1e-6)
        assert leak_mod.p0_under_gap([fitted], 64, window=window, phantom=phantom)[0] == pytest.approx(
            synthetic_share(delta, 64, window, phantom), abs=1e-9)
    if window is not None:  # a windowed sink stops leaking at n = W
        assert leak_mod.leak(3.0, 1000, window=window, phantom=phantom) == leak_mod.leak(3.0, window, phantom=phantom)


def test_multi_length_gpt_oss_fits_key_0_and_the_phantom_with_the_windows():
    from conftest import SAMPLE_TEXT, make_tokenizer

    model = build("gpt_oss")
    result = sinkscope.measure("sinks", model, make_tokenizer(), texts=[SAMPLE_TEXT * 12], seq_len=[8, 16, 24],
                               n_seqs=3)
    t = result.table
    assert {"leak_delta", "leak_phantom_delta", "leak_phantom_error"} <= set(t.metric)
    windows = result.manifest["model"]["layer_windows"]
    for measured, phantom, delta_name in (("p0_mass", False, "leak_delta"), ("phantom_mass", True, "leak_phantom_delta")):
        for layer in range(3):
            d = t[(t.metric == delta_name) & (t.layer == layer) & t["head"].notna()].sort_values("head")
            m = t[(t.metric == measured) & (t.layer == layer) & t["head"].notna() & (t.seq_len == 8)
                  & t["layer_type"].isna()].sort_values("head")
            back = leak_mod.p0_under_gap(d["value"].to_numpy(), 8, window=windows[layer], phantom=phantom)
            np.testing.assert_allclose(back, m["value"].to_numpy(), atol=1e-9)


def test_p0_error_is_not_reported_where_a_window_makes_it_zero_by_construction():
    """gpt-oss's sliding layers (W = 8) at lengths 8, 16, 24: every query that sees key 0 is in the shortest
    window, so the measured p0 at T is p0(8) * 7 / (T - 1) (checked on the measured rows) and so is the
    fixed-gap prediction; leak_p0_error has no rows there, the full layer keeps its own, the model mean is
    over the reported layers, the manifest names the layers and the reason. The phantom's error stays."""
    from conftest import SAMPLE_TEXT, make_tokenizer

    result = sinkscope.measure("sinks", build("gpt_oss"), make_tokenizer(), texts=[SAMPLE_TEXT * 12],
                               seq_len=[8, 16, 24], n_seqs=3)
    t = result.table
    t = t[t["layer_type"].isna()]
    heads = t[t["head"].notna()]
    for layer in (0, 2):  # sliding, W = 8 <= the shortest length: the error would be 0 by construction
        p0 = heads[(heads.metric == "p0_mass") & (heads.layer == layer)].pivot(index="head", columns="seq_len",
                                                                             values="value")
        for n in (16, 24):
            np.testing.assert_allclose(p0[n] * (n - 1), p0[8] * 7, rtol=1e-5, atol=1e-7)
    error = t[t.metric == "leak_p0_error"]
    assert set(error.layer.dropna().astype(int)) == {1}  # the full layer only
    for n in (16, 24):
        at = error[error.seq_len == n]
        model_row = at[at.layer.isna()].value.item()
        assert model_row == pytest.approx(at[(at.layer == 1) & at["head"].isna()].value.item())
    assert set(t[t.metric == "leak_phantom_error"].layer.dropna().astype(int)) == {0, 1, 2}
    assert set(t[t.metric == "leak_p0_predicted"].layer.dropna().astype(int)) == {0, 1, 2}
    note = result.manifest["probes"]["leak_fit"]["options"]["p0_error_not_reported"]
    assert note["layers"] == [0, 2] and "by construction" in note["reason"]


def _dp0_by_finite_difference(delta, seq_len, window, phantom, h=1e-4):
    """|dDelta/dp0| from explicit softmax rows: 1 / (central difference of the share in Delta)."""
    return 2 * h / (synthetic_share(delta + h, seq_len, window, phantom)
                    - synthetic_share(delta - h, seq_len, window, phantom))


@pytest.mark.parametrize("window, phantom", [(None, False), (8, False), (8, True)])
def test_the_fit_reports_its_conditioning(window, phantom):
    """leak_delta_dp0 = |dDelta/dp0| at the fitted gap equals the inverse slope of the explicit softmax share in
    Delta; a saturated sink (p0 = 1 - 3e-6 at 128 tokens, SmolLM2's head 18.8) is ~1/(1 - p0) and flagged, a
    mid-range one is not."""
    from sinkscope.store.results import Row

    deltas = {(0, 0): 0.5, (0, 1): 3.0, (0, 2): 7.0}
    measured, prefix = ("phantom_mass", "leak_phantom") if phantom else ("p0_mass", "leak")
    rows = [Row(measured, measured, l, h, synthetic_share(d, n, window, phantom), 10, (("seq_len", n),))
            for n in (24, 48) for (l, h), d in deltas.items()]
    out = {(r.metric, r.layer, r.head): r.value for r in leak_mod.leak_rows(rows, [window])
           if dict(r.conditions)["seq_len"] == 24}
    for (l, h), d in deltas.items():
        want = _dp0_by_finite_difference(d, 24, window, phantom)
        assert out[(f"{prefix}_delta_dp0", l, h)] == pytest.approx(want, rel=1e-6)
        assert out[(f"{prefix}_delta_ill_conditioned", l, h)] == float(want > 1e3)
    assert out[(f"{prefix}_delta_dp0", 0, None)] == pytest.approx(
        np.mean([out[(f"{prefix}_delta_dp0", 0, h)] for h in range(3)]))
    if window is None and not phantom:  # the saturated head of the brief
        p0 = 1 - 3e-6
        fit = {(r.metric, r.layer, r.head): r.value
               for r in leak_mod.leak_rows([Row("p0_mass", "p0_mass", 18, 8, p0, 16, (("seq_len", n),))
                                            for n in (128, 512)]) if dict(r.conditions)["seq_len"] == 128}
        delta = fit[("leak_delta", 18, 8)]
        want = _dp0_by_finite_difference(delta, 128, None, False, h=1e-3)
        assert fit[("leak_delta_dp0", 18, 8)] == pytest.approx(want, rel=1e-4)
        assert fit[("leak_delta_dp0", 18, 8)] == pytest.approx(1 / (1 - p0), rel=0.01)
        assert fit[("leak_delta_ill_conditioned", 18, 8)] == 1.0
        assert fit[("leak_delta_ill_conditioned", 18, None)] == 1.0


def test_spec_defines_every_leak_and_eviction_metric():
    """docs/SPEC.md has a section for the leak model and eviction naming every metric they write (issue 27)."""

    import sinkscope.probes.eviction  # noqa: F401  (registers the probe)
    from sinkscope.probes.base import PROBES

    spec = (REPO / "docs" / "SPEC.md").read_text(encoding="utf-8")
    assert "## Eviction and the fixed-gap leak model" in spec
    section = spec.split("## Eviction and the fixed-gap leak model", 1)[1]
    for metric in [*leak_mod.LEAK_METRICS, *PROBES["eviction"].metrics]:
        assert f"`{metric}" in section, metric
    for formula in ("a_ie (o_i - v_e) / (1 - a_ie)", "1 / (1 + (n - 1) e^{-Delta})", "m_i s_i"):
        assert formula in section, formula


def test_layer_windows_from_configs():
    from types import SimpleNamespace

    from sinkscope.capture.families import layer_windows

    def model(**config):
        return SimpleNamespace(config=SimpleNamespace(**config))

    assert layer_windows(build("gemma3_text"), 3) == [8, None, 8]
    assert layer_windows(build("llama"), 3) == [None] * 3
    assert layer_windows(model(sliding_window=4096), 2) == [4096, 4096]  # Mistral with a window
    assert layer_windows(model(sliding_window=4096, use_sliding_window=False), 2) == [None, None]  # Qwen2
    assert layer_windows(model(sliding_window=None), 2) == [None, None]  # Mistral without one
