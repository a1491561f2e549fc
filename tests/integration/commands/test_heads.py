"""``sinkscope heads`` (issue 13; SPEC.md "Implicit gate and head importance"; Fu et al. 2026).

Every number is checked against an independent computation: the reference side reads the
model's own eager weights (``output_attentions``) and, for Qwen3-Next, its output gate from a
hook on ``q_proj``, then applies SPEC.md's formulas in numpy. The fused path (kernel LSE) and the
explicit path agree to 1e-5 on every family; the trainer's importance and load-balancing loss
are the same function as the probe's; the two-stage ablation equals zeroing W_O's columns.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from conftest import free_port
from sinkscope.stats import gates
from sinkscope.capture import ModelSpec
from sinkscope.capture.families import get_submodule
from sinkscope.capture.record import AttentionRecord
from sinkscope.cli import app
from sinkscope.store.statefile import load_state, read_header
from sinkscope.probes import get_probe
from sinkscope.store.results import rows_to_frame
from sinkscope.forward.runner import run_probes
from tiny_models import PATHS, FAMILY_NAMES, build, random_ids
from repo_paths import REPO

runner = CliRunner()
TOL = 1e-5
CASES = [(f, "first") for f in FAMILY_NAMES] + [("gpt_oss", "phantom"), ("gpt_oss", "first+phantom")]


# ---- the reference: SPEC.md's formulas in numpy on the model's own eager weights ---------------------


def reference(model, ids: torch.Tensor, family: str, sink_set: str, below: float = 0.1) -> dict:
    """{metric: {(layer, head) | (layer, None) | (None, None): value}} for the head_importance probe."""
    spec = ModelSpec.from_model(model)
    first, phantom = sink_set in ("first", "first+phantom"), sink_set in ("phantom", "first+phantom")
    layers = get_submodule(model, PATHS[family].layers)
    gate_out, handles = {}, []
    if spec.has_output_gate:  # Qwen3-Next: q_proj emits [query, gate] per head; the head's G = mean sigmoid(gate)
        H, D = spec.n_heads, spec.head_dim
        for i in spec.attention_layers:
            def hook(_m, _i, out, i=i):
                B, T, _ = out.shape
                gate_out[i] = torch.sigmoid(out.view(B, T, H, 2 * D)[..., D:].double()).mean(-1).numpy()  # (B, T, H)
            handles.append(layers[i].self_attn.q_proj.register_forward_hook(hook))
    with torch.no_grad():
        out = model(ids, output_attentions=True, use_cache=False)
    for h in handles:
        h.remove()
    implicit, importance = {}, {}
    for layer, A in zip(spec.attention_layers, out.attentions):
        A = A.double().numpy()  # (B, H, T, S): a_ij, rows sum to 1 - phi_i
        G = 1.0 - first * A[..., 0] - phantom * (1.0 - A.sum(-1))  # (B, H, T): 1 - A_sink
        implicit[layer] = G[:, :, 1:].mean(axis=(0, 2))  # (H,): queries i >= 1, windows
        importance[layer] = gate_out[layer][:, 1:, :].mean(axis=(0, 1)) if spec.has_output_gate else implicit[layer]

    def cells(by_layer):
        table = {}
        for layer, heads in by_layer.items():
            table.update({(layer, h): float(v) for h, v in enumerate(heads)})
            table[(layer, None)] = float(np.mean(heads))
        table[(None, None)] = float(np.mean([table[(l, None)] for l in by_layer]))
        return table

    cv = {layer: np.std(v) / np.mean(v) for layer, v in importance.items()}  # population std (ddof 0)
    dormant = {layer: (v < below).astype(float) for layer, v in importance.items()}
    return {
        "implicit_gate": cells(implicit),
        "head_importance": cells(importance),
        "load_imbalance": {**{(l, None): float(c) for l, c in cv.items()}, (None, None): float(np.mean(list(cv.values())))},
        "dormant": cells(dormant),
    }


def probe_table(model, ids: torch.Tensor, mode: str, batch_size: int = 2, **params) -> pd.DataFrame:
    probe = get_probe("head_importance")(ModelSpec.from_model(model), **params)
    run_probes(model, ids.numpy(), [probe], batch_size=batch_size, progress=False, attention=mode)
    return rows_to_frame(probe.rows())


def as_cells(table: pd.DataFrame) -> dict:
    out: dict = {}
    for row in table.itertuples():
        key = (None if pd.isna(row.layer) else int(row.layer), None if pd.isna(row.head) else int(row.head))
        out.setdefault(row.metric, {})[key] = row.value
    return out


# ---- the two paths and the formula -----------------------------------------------------------------


@pytest.mark.parametrize("family,sink_set", CASES, ids=[f"{f}-{s}" for f, s in CASES])
def test_both_paths_equal_the_formula_on_eager_weights(family, sink_set):
    """Explicit weights and the fused form sigmoid(LSE_rest - LSE_sink) agree with each other to 1e-5
    and with SPEC.md's formula on the model's own eager weights, on every family."""
    model = build(family)
    ids = random_ids(3, 21, seed=3)  # longer than the sliding windows (8) of Gemma 3 and gpt-oss
    ref = reference(model, ids, family, sink_set)
    heads = sorted(v for (layer, head), v in ref["head_importance"].items() if head is not None)
    below = (heads[len(heads) // 2 - 1] + heads[len(heads) // 2]) / 2  # half the heads dormant, far from a tie
    assert heads[len(heads) // 2] - heads[len(heads) // 2 - 1] > 1e-5
    ref = reference(model, ids, family, sink_set, below=below)
    tables = {mode: probe_table(model, ids, mode, sink_set=sink_set, dormant_below=below)
              for mode in ("explicit", "fused")}
    explicit, fused = tables["explicit"], tables["fused"]
    pd.testing.assert_frame_equal(explicit.drop(columns="value"), fused.drop(columns="value"))
    assert np.abs(explicit["value"].to_numpy() - fused["value"].to_numpy()).max() <= TOL
    for table in (explicit, fused):
        got = as_cells(table)
        assert set(got) == set(ref)
        for metric, cells in ref.items():
            assert set(got[metric]) == set(cells), metric
            for key, expected in cells.items():
                assert abs(got[metric][key] - expected) <= TOL, (metric, key, got[metric][key], expected)
    assert 0 < ref["dormant"][(None, None)] < 1  # the threshold splits the heads


def test_first_plus_phantom_counts_both_on_gpt_oss():
    """G(first+phantom) = 1 - a_i0 - phi_i = G(first) + G(phantom) - 1, row by row and so in every mean."""
    model = build("gpt_oss")
    ids = random_ids(2, 20, seed=6)
    g = {s: as_cells(probe_table(model, ids, "fused", sink_set=s))["implicit_gate"]
         for s in ("first", "phantom", "first+phantom")}
    for key, both in g["first+phantom"].items():
        assert both == pytest.approx(g["first"][key] + g["phantom"][key] - 1.0, abs=1e-6), key
        assert both < min(g["first"][key], g["phantom"][key]) - 1e-3, key  # both sinks take mass


def _record(fused: bool, s: torch.Tensor, b: torch.Tensor | None) -> AttentionRecord:
    """A record whose logits are ``s`` (B, H, T, S, causal, -inf above the diagonal) with phantom ``b``:
    q = identity rows, k chosen so that scale * q_i . k_j = s_ij."""
    B, H, T, S = s.shape
    query = torch.eye(T).expand(B, H, T, T).contiguous()  # (B, H, T, D=T)
    key = s.clamp_min(-1e4).transpose(-1, -2).contiguous()  # (B, H, S, D=T): q_i . k_j = s_ij
    mask = torch.zeros(1, 1, T, S).masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))
    logits = s.masked_fill(torch.ones(T, S, dtype=torch.bool).triu(1), float("-inf"))  # (B, H, T, S)
    lse = torch.logsumexp(logits, -1)  # (B, H, T)
    if b is None:
        weights = torch.softmax(logits, -1)  # (B, H, T, S)
    else:
        full = torch.cat([b.view(1, H, 1, 1).expand(B, H, T, 1), logits], -1)  # (B, H, T, 1+S)
        weights = torch.softmax(full, -1)[..., 1:]  # (B, H, T, S): phantom dropped, rows sum to 1 - phi
    return AttentionRecord(layer=0, query=query, key=key, value=torch.randn(B, H, S, 2), scale=1.0, mask=mask,
                           weights=None if fused else weights, kernel_lse=lse if fused else None, sink_logits=b)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_a_head_with_all_its_mass_on_position_0_has_gate_0(fused):
    """Head 0 puts (numerically) all of every row on key 0, head 1 spreads: G = 0 and 0.5 exactly at
    the ends; the layer's CV of [0, x] is exactly 1 and head 0 is dormant."""
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 2, 6, 6, generator=g)  # (B, H, T, S)
    s[:, 0, :, 0] = 60.0  # head 0: key 0 dominates every row
    spec = ModelSpec("llama", 1, 2, 2, 6, 12, (0,), False, False)
    probe = get_probe("head_importance")(spec)
    probe.attention(0, _record(fused, s, None))
    table = as_cells(rows_to_frame(probe.rows()))
    assert table["implicit_gate"][(0, 0)] == pytest.approx(0.0, abs=1e-12)
    expected = (1 - torch.softmax(s[:, 1].masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -math.inf), -1)
                [..., 0])[:, 1:].mean()
    assert table["head_importance"][(0, 1)] == pytest.approx(float(expected), abs=1e-6)
    assert table["load_imbalance"][(0, None)] == pytest.approx(1.0, abs=1e-6)
    assert table["dormant"][(0, 0)] == 1.0 and table["dormant"][(0, 1)] == 0.0
    # the same with a phantom: a huge b_h on head 0 leaves G(phantom) = 0 there
    b = torch.tensor([60.0, -1.0])
    spec = ModelSpec("gpt_oss", 1, 2, 2, 6, 12, (0,), True, False)
    probe = get_probe("head_importance")(spec)
    probe.attention(0, _record(fused, torch.randn(2, 2, 6, 6, generator=g), b))
    assert as_cells(rows_to_frame(probe.rows()))["implicit_gate"][(0, 0)] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("sink_set", gates.FIXED_SINK_SETS)
def test_fused_form_equals_one_minus_sink_mass(sink_set):
    """gate_from_lse == gate_from_weights == the formula in numpy, with a phantom, a hidden key 0
    (past a sliding window: -inf) and rows dominated by key 0 (G near 0, where cancellation bites)."""
    g = torch.Generator().manual_seed(1)
    B, H, T = 2, 3, 9
    s = torch.randn(B, H, T, T, generator=g, dtype=torch.float64) * 3
    s[:, 0, :, 0] += 25.0  # head 0: almost all mass on key 0
    hidden = torch.ones(T, T, dtype=torch.bool).triu(1)
    hidden[6:, 0] = True  # queries 6.. no longer see key 0
    s = s.masked_fill(hidden, -math.inf)
    b = torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64)
    first, phantom = gates.sink_parts(sink_set)
    full = torch.cat([b.view(1, H, 1, 1).expand(B, H, T, 1), s], -1)  # (B, H, T, 1+S)
    a = torch.softmax(full, -1).numpy()  # (B, H, T, 1+S): [phantom, keys]
    expected = 1.0 - first * a[..., 1] - phantom * a[..., 0]  # (B, H, T)
    from_weights = gates.gate_from_weights(torch.from_numpy(a[..., 1:]), first=first, phantom=phantom)
    lse = torch.logsumexp(s, -1)  # (B, H, T)
    from_lse = gates.gate_from_lse(lse, first_logit=s[..., 0], sink_logit=b, first=first, phantom=phantom)
    np.testing.assert_allclose(from_weights.numpy(), expected, atol=1e-12)
    np.testing.assert_allclose(from_lse.numpy(), expected, atol=1e-12)  # exact in float64
    # in float32 (a kernel's LSE) the error near G = 0 is about one ulp of |LSE| (docstring)
    from_f32 = gates.gate_from_lse(lse.float(), first_logit=s[..., 0].float(), sink_logit=b.float(), first=first,
                                   phantom=phantom)
    ulp = np.spacing(np.abs(lse.float().numpy())).astype(np.float64)  # (B, H, T)
    assert np.all(np.abs(from_f32.double().numpy() - expected) <= 4 * ulp + 1e-7)
    assert expected[:, :, 6:].min() > 0 and (not first or expected[:, 0, 1:6].max() < 1e-5)


def test_load_imbalance_is_std_over_mean_and_differentiable():
    imp = torch.tensor([[1.0, 0.5, 0.25, 0.25], [0.3, 0.3, 0.3, 0.3]], dtype=torch.float64, requires_grad=True)
    cv = gates.load_imbalance(imp)
    x = imp.detach().numpy()
    np.testing.assert_allclose(cv.detach().numpy(), x.std(axis=1) / x.mean(axis=1), rtol=1e-12)
    assert cv[0].item() == pytest.approx(math.sqrt(0.375 / 4) / 0.5)  # population std; ddof=1 gives 0.707 and cv[1].item() == 0.0
    assert gates.load_balance_loss(imp).item() == pytest.approx(float((cv.detach() ** 2).mean()))
    assert torch.autograd.gradcheck(gates.load_balance_loss, (imp,))
    assert gates.load_imbalance(torch.zeros(2, 4)).tolist() == [0.0, 0.0]  # dead layer: 0, not NaN


# ---- cross-command and cross-tool consistency ----------------------------------------------------------


@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if f not in ("gpt_oss",)])
def test_vanilla_gate_equals_one_minus_p0_of_sinks(family):
    """G_i = 1 - w_i0 without a phantom; both averaged over i >= 1 and windows: every row of
    implicit_gate is 1 - the p0_mass row of the sinks probe on the same windows."""
    from sinkscope.commands.sinks import sinks_probes

    model = build(family)
    ids = random_ids(3, 21, seed=7)
    spec = ModelSpec.from_model(model)
    p0 = [p for p in sinks_probes(spec) if p.name == "p0_mass"]
    heads = get_probe("head_importance")(spec)
    run_probes(model, ids.numpy(), p0 + [heads], batch_size=2, progress=False)
    p0_cells = as_cells(rows_to_frame(p0[0].rows()))["p0_mass"]
    gate = as_cells(rows_to_frame(heads.rows()))["implicit_gate"]
    assert set(gate) == set(p0_cells)
    for key, value in p0_cells.items():
        assert gate[key] == pytest.approx(1.0 - value, abs=1e-6), key


def test_heads_and_sinks_commands_agree(tiny_llama_dir, text_file, tmp_path):
    """The CLI runs of both commands, same options: the same windows, and implicit_gate = 1 - p0_mass."""
    args = [str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "24", "--n-seqs", "5", "--no-progress",
            "--no-figures"]
    for command in ("sinks", "heads"):
        result = runner.invoke(app, [command, *args, "--out", str(tmp_path / command)])
        assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(np.load(tmp_path / "sinks" / "tokens.npy"), np.load(tmp_path / "heads" / "tokens.npy"))
    sinks = pd.read_csv(tmp_path / "sinks" / "results.csv")
    heads = pd.read_csv(tmp_path / "heads" / "results.csv")
    p0 = sinks[sinks.metric == "p0_mass"].reset_index(drop=True)
    gate = heads[heads.metric == "implicit_gate"].reset_index(drop=True)
    pd.testing.assert_frame_equal(p0[["layer", "head", "n"]], gate[["layer", "head", "n"]])
    np.testing.assert_allclose(gate["value"], 1.0 - p0["value"], atol=1e-6)
    manifest = json.loads((tmp_path / "heads" / "manifest.json").read_text())
    assert manifest["command"] == "heads"
    assert manifest["probes"]["head_importance"]["options"] == {"sink_set": "first", "dormant_below": 0.1, "clean_loss": False,
                                                                "gate": "implicit"}


TRAINER_CASES = [("baseline", "elementwise"), ("sinklogit", "elementwise"), ("offbyone", "elementwise"),
                 ("sinktoken", "elementwise"), ("routing-norm", "elementwise"), ("outgate", "elementwise"),
                 ("outgate", "headwise")]


@pytest.mark.parametrize("variant,mode", TRAINER_CASES, ids=[f"{v}-{m}" for v, m in TRAINER_CASES])
def test_trainer_importance_and_loss_are_the_probes(variant, mode):
    """The trainer's Imp (both attention paths) equals the probe's head_importance on the same windows,
    its load-balancing loss is the mean of the probe's per-layer CV squared."""
    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT, load_balance_loss

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=24, n_layer=2, n_head=4, n_embd=32, variant=variant,
                          outgate_mode=mode)).eval()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(4.0)  # sharper attention than at init
            if hasattr(block.attn, "sink_logit"):
                block.attn.sink_logit.copy_(torch.tensor([-1.0, 0.0, 1.0, 2.0]))
    ids = torch.randint(0, 40, (3, 20), generator=torch.Generator().manual_seed(4))
    table = as_cells(probe_table(model, ids, "fused", batch_size=2))
    probe_imp = torch.tensor([[table["head_importance"][(l, h)] for h in range(4)] for l in range(2)],
                             dtype=torch.float64)  # (L, H)
    for path in ("fused", "explicit"):
        with torch.no_grad():
            _, loss = model(ids, ids, attention=path, lb_lambda=1.0)
        with torch.no_grad():
            model(ids, attention=path, importance=True)
        trainer_imp = model.last_importance.double()
        torch.testing.assert_close(trainer_imp, probe_imp, atol=TOL, rtol=0)
        assert model.last_loss_terms["lb"].item() == pytest.approx(load_balance_loss(trainer_imp).item(), abs=1e-6)
    cv = [table["load_imbalance"][(l, None)] for l in range(2)]
    assert load_balance_loss(probe_imp).item() == pytest.approx(float(np.mean(np.square(cv))), abs=1e-9)
    gate = "output" if variant == "outgate" else "implicit"
    assert (table["head_importance"] == table["implicit_gate"]) == (gate == "implicit")


@pytest.fixture(scope="module")
def trigger_ckpt(tmp_path_factory):
    """A trigger-task checkpoint (one layer of 2 heads, 6 steps; evaluations at 0, 3 and 6)."""
    from sinkscope.train.loop import train
    from sinkscope.train.config import TrainOptions

    out = tmp_path_factory.mktemp("heads-ckpt") / "trigger"
    train(TrainOptions(out=str(out), task="trigger", task_options=["vocab=16"], steps=6, batch_size=8, warmup_steps=1,
                       eval_every=3, eval_windows=8, checkpoint_every=3,
                       overrides=["n_layer=2", "n_head=4", "n_embd=32", "block_size=20"], progress=False),
          log=lambda message: None)
    return out


@pytest.mark.slow  # trains
def test_trainer_log_cv_equals_heads_on_the_validation_windows(trigger_ckpt, tmp_path):
    """log.csv's last load imbalance (per layer and mean) is what `sinkscope heads` measures on the
    checkpoint's own 8 evaluation windows (its validation draw with seed 0 starts with them)."""
    import sinkscope
    from sinkscope.train.loop import read_log

    rows = [r for r in read_log(trigger_ckpt) if r["load_imbalance"]]
    assert [int(r["step"]) for r in rows] == [0, 3, 6]
    result = sinkscope.measure("heads", str(trigger_ckpt), n_seqs=8, seed=0)
    cells = as_cells(result.table)["load_imbalance"]
    last = rows[-1]
    assert float(last["load_imbalance"]) == pytest.approx(cells[(None, None)], abs=2e-6)
    for layer in range(2):
        assert float(last[f"load_imbalance_l{layer}"]) == pytest.approx(cells[(layer, None)], abs=2e-6)
    meta = json.loads((trigger_ckpt / "config.json").read_text())
    assert meta["load_imbalance"] == pytest.approx(float(last["load_imbalance"]), abs=1e-6)
    assert result.table["step"].iloc[0] == 6  # the checkpoint's conditions ride along

    from sinkscope.report import build_report

    page = build_report([trigger_ckpt], out=tmp_path / "training")
    assert (tmp_path / "training" / "figures" / "training_imbalance.png").is_file()
    assert "head load imbalance" in page.read_text()


# ---- ablation --------------------------------------------------------------------------------------


def _loss_with_heads_zeroed(model, ids: torch.Tensor, family: str, heads: dict[int, list[int]]) -> float:
    """Reference: zero the W_O columns reading the heads (no hook involved), mean next-token CE."""
    import copy

    model = copy.deepcopy(model)
    spec = ModelSpec.from_model(model)
    layers = get_submodule(model, PATHS[family].layers)
    D = spec.head_dim
    with torch.no_grad():
        for layer, hs in heads.items():
            out_proj = get_submodule(layers[layer], PATHS[family].out_proj)
            for h in hs:
                if PATHS[family].out_proj_conv1d:
                    out_proj.weight[h * D:(h + 1) * D, :] = 0  # GPT-2 Conv1D: weight (in, out)
                else:
                    out_proj.weight[:, h * D:(h + 1) * D] = 0
        logits = model(ids).logits  # (B, T, V)
    return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_ablation_equals_zeroing_the_output_projection(family):
    model = build(family)
    ids = random_ids(3, 16, seed=8)
    probe = get_probe("head_ablation")(ModelSpec.from_model(model), heads="2.1,0.3,0.0")
    assert probe.targets == {0: [0, 3], 2: [1]} and probe.passes() == (None, "ablated")
    run_probes(model, ids.numpy(), [probe], batch_size=2, progress=False)
    cells = {k: v[(None, None)] for k, v in as_cells(rows_to_frame(probe.rows())).items()}
    assert cells["loss_clean"] == pytest.approx(_loss_with_heads_zeroed(model, ids, family, {}), rel=1e-6)
    assert cells["loss_ablated"] == pytest.approx(_loss_with_heads_zeroed(model, ids, family, {0: [0, 3], 2: [1]}),
                                                  rel=1e-6)
    assert cells["loss_delta"] == pytest.approx(cells["loss_ablated"] - cells["loss_clean"], abs=1e-12)
    assert abs(cells["loss_delta"]) > 1e-4 and cells["ablated_heads"] == 3.0


def test_ablate_dormant_chooses_on_all_windows_then_ablates(tiny_llama_dir, text_file, tmp_path):
    """Stage one finds the dormant heads on every window (batch size does not matter), the manifest
    records them, stage two's loss change equals zeroing those heads' W_O columns."""
    args = [str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "20", "--n-seqs", "5", "--no-progress",
            "--no-figures", "--explore-windows", "0"]
    plain = runner.invoke(app, ["heads", *args, "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    imp = pd.read_csv(tmp_path / "plain" / "results.csv")
    imp = imp[(imp.metric == "head_importance") & imp["head"].notna()]
    below = float(imp["value"].median())
    expected = sorted((int(r.layer), int(r.head)) for r in imp.itertuples() if r.value < below)
    tables = []
    for batch in ("1", "3"):
        out = tmp_path / f"ablate-{batch}"
        result = runner.invoke(app, ["heads", *args, "--dormant-below", repr(below), "--ablate-dormant",
                                     "--batch-size", batch, "--out", str(out)])
        assert result.exit_code == 0, result.output
        manifest = json.loads((out / "manifest.json").read_text())
        heads = manifest["probes"]["head_ablation"]["options"]["heads"]
        assert [tuple(map(int, h.split("."))) for h in heads] == expected
        tables.append(pd.read_csv(out / "results.csv"))
    pd.testing.assert_frame_equal(tables[0].drop(columns="value"), tables[1].drop(columns="value"))
    np.testing.assert_allclose(tables[0]["value"], tables[1]["value"], rtol=1e-6, atol=1e-9)
    table = tables[0]
    dormant = table[(table.metric == "dormant") & table["head"].notna()]
    assert sorted((int(r.layer), int(r.head)) for r in dormant.itertuples() if r.value == 1.0) == expected
    model = build("llama")
    ids = torch.from_numpy(np.load(tmp_path / "ablate-1" / "tokens.npy"))
    by_layer: dict[int, list[int]] = {}
    for layer, head in expected:
        by_layer.setdefault(layer, []).append(head)
    delta = _loss_with_heads_zeroed(model, ids, "llama", by_layer) - _loss_with_heads_zeroed(model, ids, "llama", {})
    got = table[table.metric == "loss_delta"]["value"].item()
    assert got == pytest.approx(delta, abs=1e-6) and abs(got) > 1e-5
    assert table[table.metric == "ablated_heads"]["value"].item() == len(expected)


def test_a_run_killed_in_the_ablation_stage_resumes_there(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    """Ctrl-C during stage two keeps a checkpoint of both stages; --resume ends with the uninterrupted table."""
    from sinkscope.commands import get_command
    from sinkscope.errors import Interrupted
    from sinkscope.run.dispatch import measure_command as execute
    from sinkscope.probes.head_ablation import HeadAblation

    command = get_command("heads")
    options = dict(model=str(tiny_llama_dir), text_file=str(text_file), seq_len=16, n_seqs=6, batch_size=1,
                   dormant_below=0.88, ablate_dormant=True, progress=False, figures=False, checkpoint_seconds=0.0)
    whole = execute(command, command.options(**options, out=str(tmp_path / "whole")), log=lambda m: None)
    calls = {"n": 0}
    real = HeadAblation.loss

    def interrupting(self, layer, value):
        if self.pass_label == "ablated":
            calls["n"] += 1
            if calls["n"] == 4:
                raise KeyboardInterrupt
        return real(self, layer, value)

    monkeypatch.setattr(HeadAblation, "loss", interrupting)
    out = tmp_path / "killed"
    with pytest.raises(Interrupted):
        execute(command, command.options(**options, out=str(out)), log=lambda m: None)
    progress = tmp_path / ".killed.progress.safetensors"
    state = {**read_header(progress), **load_state(progress)}
    assert state["stage"] == 1 and state["next"] == 3 and len(state["done"]) == 1
    monkeypatch.setattr(HeadAblation, "loss", real)
    messages = []
    resumed = execute(command, command.options(**options, out=str(out), resume=True), log=messages.append)
    assert any("Resuming at window 3 of 6 (stage 2)" in m for m in messages)
    pd.testing.assert_frame_equal(resumed.table, whole.table)


def test_several_models_give_one_comparison(tiny_llama_dir, text_file, tmp_path, tokenizer):
    oss = tmp_path / "tiny-oss"
    build("gpt_oss").save_pretrained(oss)
    tokenizer.save_pretrained(oss)
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["heads", str(tiny_llama_dir), str(oss), "--text-file", str(text_file), "--seq-len",
                                 "16", "--n-seqs", "2", "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    first, second = out / tiny_llama_dir.name, out / "tiny-oss"  # one run folder per model, named after it
    assert result.stdout.strip().splitlines()[-1] == str(out / "report.html")  # the summary, then the page
    for folder, sink_set in ((first, "first"), (second, "phantom")):  # auto: what each model has
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["probes"]["head_importance"]["options"]["sink_set"] == sink_set
    page = (out / "report.html").read_text()
    assert "sinkscope comparison of 2 runs" in page and "(dashed: dormant below)" in page
    assert (out / "figures" / "overlay_load_imbalance.png").is_file()


def test_report_section_of_a_heads_run(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["heads", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "3", "--no-progress", "--dormant-below", "0.8794", "--ablate-dormant",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    page = (out / "report.html").read_text()
    assert 'data-probe="head_importance"' in page and 'data-probe="head_ablation"' in page
    n_dormant = int(table[(table.metric == "dormant") & table["head"].notna()]["value"].sum())
    assert f"Dormant heads — {n_dormant} of 12 heads have importance below 0.8794" in page
    delta = table[table.metric == "loss_delta"]["value"].item()
    assert f"({delta:+.4g})" in page
    assert "its figures are drawn once, under head_importance" in page  # no duplicate implicit_gate figures
    assert (out / "figures" / "heatmap_head_importance.png").is_file()
    assert not (out / "figures" / "heatmap_implicit_gate.png").exists()


# ---- mistakes ----------------------------------------------------------------------------------------


def test_mistakes_are_one_sentence(tiny_llama_dir, text_file, tmp_path):
    cases = [
        (["heads", str(tiny_llama_dir), "--sink-set", "phantom"], "needs a model with a learned phantom key"),  # config
        (["heads", str(tiny_llama_dir), "--sink-set", "sink"], "unknown --sink-set 'sink'"),
        (["heads", str(tiny_llama_dir), "--dormant-below", "1.5"], "--dormant-below must lie in [0, 1]"),
        (["measure", str(tiny_llama_dir), "--probe", "head_ablation", "--param", "head_ablation.heads=1-2"],
         "takes LAYER.HEAD pairs such as 3.1, not '1-2'"),
        (["measure", str(tiny_llama_dir), "--probe", "head_ablation", "--param", "head_ablation.heads=7.0",
          "--n-seqs", "1", "--seq-len", "8", "--text-file", str(text_file)],
         "the head 7.0 is not an attention head of this model"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*args, "--out", str(tmp_path / "x")] if "--out" not in args else args)
        assert result.exit_code == 1, (args, result.output)
        assert message in result.output and result.output.count("error:") == 1, (args, result.output)


@pytest.mark.slow  # loads the real SmolLM2 (a GGUF dequantised on first use)
def test_a_phantom_sink_set_on_the_embedded_default_is_one_sentence(text_file, tmp_path):
    """SmolLM2 has no learned phantom key; the GGUF's config.json is cached, so this is said after loading."""
    args = ["heads", "--sink-set", "first+phantom", "--text-file", str(text_file), "--seq-len", "8", "--n-seqs", "1",
            "--out", str(tmp_path / "x")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "needs a model with a learned phantom key" in result.output and result.output.count("error:") == 1


@pytest.mark.slow  # spawns Python (torchrun)
def test_two_process_ablation_run_equals_one_process(tiny_llama_dir, text_file, tmp_path):
    """Under torchrun the dormant set is chosen from the merged importance and sent to every process."""
    import os
    import subprocess
    import sys

    args = [str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16", "--n-seqs", "5", "--batch-size",
            "2", "--no-figures", "--no-progress", "--device", "cpu", "--dormant-below", "0.8414", "--ablate-dormant"]
    one = tmp_path / "one"
    assert runner.invoke(app, ["heads", *args, "--out", str(one)]).exit_code == 0
    two = tmp_path / "two"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "-m", "sinkscope", "heads", *args, "--out", str(two)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = pd.read_csv(one / "results.csv"), pd.read_csv(two / "results.csv")
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    np.testing.assert_allclose(a["value"], b["value"], rtol=1e-6, atol=1e-7)
    heads = [json.loads((f / "manifest.json").read_text())["probes"]["head_ablation"]["options"]["heads"]
             for f in (one, two)]
    assert heads[0] == heads[1] and 0 < len(heads[0]) < 12


# ---- Fu et al. 2026 §6.2's data-driven sink set (issue 27, fix 7) ------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt_oss", "gemma3_text"])
def test_the_data_driven_sink_set_equals_high_attention_and_low_value_norm_on_eager_weights(family):
    """``--sink-set data``: the sink keys of each window and head are those with Gu et al.'s alpha_j (mean
    a_ij over the queries i >= max(j, 1) that see j) above the attention threshold and a value norm below
    the ratio times the window's median; G_i = 1 - sum over them of a_ij, minus the phantom's mass where
    there is one. Reference: the model's eager weights (output_attentions) and its v_proj outputs (hooks),
    in numpy; both record paths must equal it, and the set must differ from key 0 alone."""
    model = build(family)
    spec = ModelSpec.from_model(model)
    ids = random_ids(3, 21, seed=5)
    above, ratio = 0.12, 1.1  # a random tiny model has no real sink: thresholds that pick a few keys
    layers = get_submodule(model, PATHS[family].layers)
    values, handles = {}, []
    for i in spec.attention_layers:
        handles.append(layers[i].self_attn.v_proj.register_forward_hook(
            lambda _m, _i, out, i=i: values.__setitem__(i, out.double().numpy())))
    with torch.no_grad():
        out = model(ids, output_attentions=True, use_cache=False)
    for h in handles:
        h.remove()
    implicit, n_keys, key0, empty, not_first = {}, {}, {}, {}, 0
    for layer, A in zip(spec.attention_layers, out.attentions):
        A = A.double().numpy()  # (B, H, T, S): a_ij, rows sum to 1 - phi_i
        B, H, T, S = A.shape
        v = values[layer].reshape(B, T, spec.n_kv_heads, -1)  # (B, S, Hkv, D)
        norms = np.linalg.norm(v, axis=-1).transpose(0, 2, 1).repeat(H // spec.n_kv_heads, axis=1)  # (B, H, S)
        window = getattr(model.config, "sliding_window", None)
        sliding = (getattr(model.config, "layer_types", None) or [None] * (layer + 1))[layer] == "sliding_attention"
        i, j = np.arange(T)[:, None], np.arange(S)[None, :]
        seen = (j <= i) & (i >= 1) & ((i - j < window) if sliding else True)  # (T, S)
        alpha = (A * seen).sum(2) / np.maximum(seen.sum(0), 1)  # (B, H, S)
        median = np.array([[np.sort(n)[(len(n) - 1) // 2] for n in heads] for heads in norms])  # torch's lower median
        enough = seen.sum(0) >= min(16, -(-seen.sum(0).max() // 2))  # 16 scoring queries (half the most at most)
        keys = (alpha > above) & enough & (norms < ratio * median[..., None])  # (B, H, S)
        not_first += int((keys & (j[0] > 0)).sum())
        G = 1.0 - (A * keys[:, :, None, :]).sum(-1) - spec.has_phantom * (1.0 - A.sum(-1))  # (B, H, T)
        implicit[layer] = G[:, :, 1:].mean(axis=(0, 2))
        n_keys[layer] = keys.sum(-1).mean(0)  # (H,)
        key0[layer], empty[layer] = keys[..., 0].mean(0), (~keys.any(-1)).mean(0)  # (H,) shares of windows
    assert not_first > 0  # the set is not just key 0
    for mode in ("explicit", "fused"):
        got = as_cells(probe_table(model, ids, mode, sink_set="data", sink_attention=above, sink_value_ratio=ratio))
        for metric, ref in (("implicit_gate", implicit), ("sink_keys", n_keys), ("sink_set_key0", key0),
                            ("sink_set_empty", empty)):
            for layer, heads in ref.items():
                for h, value in enumerate(heads):
                    assert abs(got[metric][(layer, h)] - value) <= TOL, (mode, metric, layer, h)


def test_heads_takes_the_data_driven_sink_set_and_its_thresholds_from_the_command_line(tiny_llama_dir, text_file,
                                                                                        tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["heads", str(tiny_llama_dir), "--sink-set", "data", "--sink-attention", "0.2",
                                 "--sink-value-ratio", "0.9", "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--out", str(out), "--no-figures", "--no-progress"])
    assert result.exit_code == 0, result.output
    options = json.loads((out / "manifest.json").read_text())["probes"]["head_importance"]["options"]
    assert (options["sink_set"], options["sink_attention"], options["sink_value_ratio"]) == ("data", 0.2, 0.9)
    table = pd.read_csv(out / "results.csv")
    assert (table.metric == "sink_keys").any()
