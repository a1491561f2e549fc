"""Every sinks probe equals SPEC.md's formula on explicit eager attention weights.

The reference side never uses sinkscope's capture: it reads ``output_attentions`` of the model's
eager attention, value vectors from forward hooks on the projections, and residual states from
forward hooks on the decoder layers, then applies the formulas of SPEC.md with numpy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from sinkscope.capture import ModelSpec
from sinkscope.capture.families import get_submodule
from sinkscope.commands.sinks import sinks_probes
from sinkscope.store.results import rows_to_frame
from sinkscope.forward.runner import run_probes
from tiny_models import PATHS, FAMILY_NAMES, build, random_ids

EPS = 0.3
TOL = 1e-5


def _value_hook(family: str, layer_module, spec: ModelSpec, store: dict, index: int):
    """Forward hook storing the layer's values (B, T, Hkv, D), read from the projections."""
    D, H, Hkv = spec.head_dim, spec.n_heads, spec.n_kv_heads
    if family == "gpt2":
        def hook(_m, _i, out):
            B, T, _ = out.shape
            store[index] = out[..., 2 * H * D:].reshape(B, T, H, D)
        return layer_module.attn.c_attn.register_forward_hook(hook)
    if family == "gpt_neox":
        def hook(_m, _i, out):
            B, T, _ = out.shape
            store[index] = out.view(B, T, H, 3 * D)[..., 2 * D:]
        return layer_module.attention.query_key_value.register_forward_hook(hook)

    def hook(_m, _i, out):
        B, T, _ = out.shape
        store[index] = out.view(B, T, Hkv, D)
    return layer_module.self_attn.v_proj.register_forward_hook(hook)


def reference_tables(model, ids: torch.Tensor, family: str) -> dict[str, dict]:
    """{metric: {(layer, head) or (layer, None) or (None, None): value}} from the formulas."""
    spec = ModelSpec.from_model(model)
    layers = get_submodule(model, PATHS[family].layers)
    values, hidden, handles = {}, {}, []
    for i in spec.attention_layers:
        handles.append(_value_hook(family, layers[i], spec, values, i))
    for i, module in enumerate(layers):
        handles.append(module.register_forward_hook(
            lambda _m, _i, out, i=i: hidden.__setitem__(i, out[0] if isinstance(out, tuple) else out)))
    with torch.no_grad():
        out = model(ids, output_attentions=True, use_cache=False)
    for h in handles:
        h.remove()
    attentions = dict(zip(spec.attention_layers, [a.double().numpy() for a in out.attentions]))

    per_head: dict[str, dict[int, np.ndarray]] = {m: {} for m in
                                                   ["p0_mass", "sink_rate", "sink_alpha", "phantom_mass",
                                                    "value_norm_ratio", "sink_logit", "p0_mass_in_reach",
                                                    "p0_out_of_reach", "sink_rate_in_reach", "sink_alpha_in_reach"]}
    types = getattr(model.config, "layer_types", None)
    window = getattr(model.config, "sliding_window", None)
    for layer, A in attentions.items():  # A: (B, H, T, S) = a_ij
        row_sum = A.sum(-1)  # (B, H, T)
        w0 = A[..., 0] / row_sum  # w_i0
        per_head["p0_mass"][layer] = w0[:, :, 1:].mean(axis=(0, 2))
        if window and types and "sliding" in types[layer]:  # queries i = 1 .. W-1 see key 0, i >= W do not
            reach = np.arange(1, w0.shape[-1]) < window  # (T-1,)
            per_head["p0_mass_in_reach"][layer] = w0[:, :, 1:][:, :, reach].mean(axis=(0, 2))
            per_head["p0_out_of_reach"][layer] = np.full(w0.shape[1], (~reach).mean())
            alpha_reach = A[..., 0][:, :, :window].mean(-1)  # (B, H): queries t = 0 .. W-1 see key 0
            per_head["sink_alpha_in_reach"][layer] = alpha_reach.mean(0)
            per_head["sink_rate_in_reach"][layer] = (alpha_reach > EPS).mean(0)
        alpha = A[..., 0].mean(-1)  # (B, H): mean over t >= 0 of a_t0
        per_head["sink_alpha"][layer] = alpha.mean(0)
        per_head["sink_rate"][layer] = (alpha > EPS).mean(0)
        per_head["phantom_mass"][layer] = (1 - row_sum)[:, :, 1:].mean(axis=(0, 2))
        norms = np.linalg.norm(values[layer].double().numpy(), axis=-1)  # (B, T, Hkv)
        per_head["value_norm_ratio"][layer] = (norms[:, 0, :] / np.median(norms[:, 1:, :], axis=1)).mean(0)
        if family == "gpt_oss":
            per_head["sink_logit"][layer] = layers[layer].self_attn.sinks.detach().double().numpy()

    table: dict[str, dict] = {}
    for metric, by_layer in per_head.items():
        if not by_layer:
            continue
        cells = {}
        for layer, heads in by_layer.items():
            for h, v in enumerate(heads):
                cells[(layer, h)] = float(v)
            cells[(layer, None)] = float(np.mean(heads))
        cells[(None, None)] = float(np.mean([cells[(l, None)] for l in by_layer]))
        table[metric] = cells
    p0 = per_head["p0_mass"]  # SPEC.md "Share of sink heads": heads with p0 mass above 0.5
    table["sink_head_share"] = {(layer, None): float((heads > 0.5).mean()) for layer, heads in p0.items()}
    table["sink_head_share"][(None, None)] = float(np.mean(np.concatenate(list(p0.values())) > 0.5))
    if spec.attention_layers:
        late = [l for l in spec.attention_layers if l >= 2]
        if late:
            table["sink_rate_from_layer"] = {(None, None): float(np.mean([per_head["sink_rate"][l].mean()
                                                                          for l in late]))}

    act, ratio, chan, pos = {}, {}, {}, {}
    for layer, hs in hidden.items():
        mag = hs.abs().double().numpy()  # (B, T, C)
        B, T, C = mag.shape
        flat = mag.reshape(B, -1)
        top = flat.max()
        b = int(np.argmax(flat.max(axis=1)))
        idx = int(np.argmax(flat[b]))
        act[(layer, None)] = float(top)
        ratio[(layer, None)] = float(top / np.median(flat, axis=1).mean())
        pos[(layer, None)], chan[(layer, None)] = float(idx // C), float(idx % C)
    largest = max(hidden, key=lambda layer: (act[(layer, None)], -layer))  # the first layer holding the max
    act[(None, None)] = max(act.values())
    ratio[(None, None)] = max(ratio.values())
    chan[(None, None)], pos[(None, None)] = chan[(largest, None)], pos[(largest, None)]
    table.update(massive_activation=act, massive_activation_ratio=ratio, massive_activation_channel=chan,
                 massive_activation_position=pos, massive_activation_layer={(None, None): float(largest)})
    return table


def sinkscope_table(model, ids: torch.Tensor, batch_size: int) -> pd.DataFrame:
    spec = ModelSpec.from_model(model)
    probes = sinks_probes(spec)
    run_probes(model, ids.numpy(), probes, batch_size=batch_size, progress=False)
    return rows_to_frame(r for p in probes for r in p.rows())


def _key(row) -> tuple:
    layer = None if pd.isna(row.layer) else int(row.layer)
    head = None if pd.isna(row.head) else int(row.head)
    return layer, head


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_probes_equal_spec_formulas_on_eager_weights(family):
    model = build(family)
    ids = random_ids(3, 25, seed=1)  # 24 keys after position 0: an even-count median
    reference = reference_tables(model, ids, family)
    ours = sinkscope_table(model, ids, batch_size=2)
    assert model.config._attn_implementation == "eager"

    produced = {m: {_key(r): r.value for r in g.itertuples()} for m, g in ours.groupby("metric")}
    assert set(produced) == set(reference), (set(produced) ^ set(reference))
    for metric, cells in reference.items():
        assert set(produced[metric]) == set(cells), metric
        for key, expected in cells.items():
            got = produced[metric][key]
            assert abs(got - expected) <= TOL * max(1.0, abs(expected)), (metric, key, got, expected)
    # Without a phantom the phantom mass is zero by construction; with one it is substantial.
    phantom = produced["phantom_mass"][(None, None)]
    assert (phantom > 0.05) if family == "gpt_oss" else (phantom == 0.0)
    assert ("sink_logit" in produced) == (family == "gpt_oss")


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "gpt2"])
def test_results_do_not_depend_on_batch_size(family):
    model = build(family)
    ids = random_ids(6, 20, seed=2)
    one = sinkscope_table(model, ids, batch_size=1)
    four = sinkscope_table(model, ids, batch_size=4)
    pd.testing.assert_frame_equal(one.drop(columns="value"), four.drop(columns="value"))
    np.testing.assert_allclose(one["value"].to_numpy(), four["value"].to_numpy(), rtol=1e-6, atol=1e-7)


def test_n_counts_the_windows_behind_each_number():
    model = build("llama")
    ids = random_ids(3, 10)
    table = sinkscope_table(model, ids, batch_size=2)
    p0 = table[table.metric == "p0_mass"]
    assert (p0["n"] == 3).all()  # the windows on every row, the unit of se (SPEC.md "Tables"), not 3 x 9 queries
    model_row = p0[p0["layer"].isna()].iloc[0]
    assert model_row["n"] == 3 and model_row["se"] > 0  # not summed over heads and layers, which share the windows
    vnr = table[(table.metric == "value_norm_ratio") & table["head"].notna()]
    assert sorted(vnr["head"].unique().tolist()) == [0, 1]  # value (KV) heads under GQA


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_fused_capture_gives_the_explicit_tables(family):
    """The fused path (kernel LSE, no weights) reproduces the explicit reference within 1e-5."""
    model = build(family)
    ids = random_ids(3, 25, seed=4)
    spec = ModelSpec.from_model(model)
    tables = {}
    for mode in ("explicit", "fused"):
        probes = sinks_probes(spec)
        run_probes(model, ids.numpy(), probes, batch_size=2, progress=False, attention=mode)
        tables[mode] = rows_to_frame(r for p in probes for r in p.rows())
    explicit, fused = tables["explicit"], tables["fused"]
    pd.testing.assert_frame_equal(explicit.drop(columns=["value", "se"]), fused.drop(columns=["value", "se"]))
    np.testing.assert_allclose(fused["value"].to_numpy(), explicit["value"].to_numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused["se"].to_numpy(), explicit["se"].to_numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_fused_capture_leaves_logits_unchanged(family):
    from collect import Collect
    from sinkscope.capture import capture

    model = build(family)
    ids = random_ids(2, 24)
    with torch.no_grad():
        reference = model(ids).logits
        with capture(model, Collect(), mode="fused"):
            fused = model(ids).logits
    torch.testing.assert_close(fused, reference, atol=1e-6, rtol=0)


def test_exact_median_matches_numpy_with_ties():
    from sinkscope.probes.stats import median

    rng = np.random.default_rng(0)
    for shape in [(3, 10), (2, 7), (4, 1000), (1, 6)]:
        x = torch.from_numpy(rng.integers(0, 5, size=shape).astype(np.float32))  # many ties
        np.testing.assert_allclose(median(x).numpy(), np.median(x.numpy(), axis=-1))
        y = torch.randn(*shape)
        np.testing.assert_allclose(median(y).numpy(), np.median(y.numpy(), axis=-1), rtol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_merging_shares_equals_one_pass(family):
    """Probes over windows [0:3] merged with probes over [3:7] give the one-pass table."""
    model = build(family)
    ids = random_ids(7, 20, seed=5).numpy()
    spec = ModelSpec.from_model(model)

    def probes_over(part):
        probes = sinks_probes(spec)
        run_probes(model, part, probes, batch_size=2, progress=False)
        return probes

    whole = probes_over(ids)
    first, second = probes_over(ids[:3]), probes_over(ids[3:])
    for a, b in zip(first, second):
        a.merge(b)
    one = rows_to_frame(r for p in whole for r in p.rows())
    merged = rows_to_frame(r for p in first for r in p.rows())
    pd.testing.assert_frame_equal(one.drop(columns="value"), merged.drop(columns="value"))
    np.testing.assert_allclose(merged["value"].to_numpy(), one["value"].to_numpy(), rtol=1e-6, atol=1e-7)
    # state_dict / load_state_dict round trip restores the accumulators exactly
    fresh = sinks_probes(spec)
    for f, w in zip(fresh, whole):
        f.load_state_dict(w.state_dict())
    again = rows_to_frame(r for p in fresh for r in p.rows())
    pd.testing.assert_frame_equal(again, one)
