"""`sinkscope selectivity`: every gate number equals SPEC.md's formula on materialised weights and gates.

The reference side never uses sinkscope's records or the model's attention code: it reads the
trainer's q, k, v (the ``c_attn`` output) and output-gate pre-activations (``c_gate``) with
forward hooks, rebuilds the weights, the gates and every statistic in float64 numpy from the
parameters (SPEC.md "Probes on gated models", "Trainer variants"), and compares each row of the
table, on both record paths (explicit weights; fused kernel with the gate's value columns).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from conftest import free_port
from sinkscope.capture import hooks as hp, ModelSpec
from sinkscope.cli import app
from sinkscope.commands.selectivity import SELECTIVITY, SelectivityOptions
from sinkscope.commands import make_probes
from sinkscope.probes import Probe, intervenes, register_probe
from sinkscope.probes.token_share import TokenSums
from sinkscope.store.results import MetricInfo, Row, rows_to_frame
from sinkscope.forward.runner import run_probes
from sinkscope.models.trainer_config import SINK_LOGIT_RANGE, GPTConfig
from sinkscope.train.model import GPT
from checkpoints import trainer_checkpoint
from repo_paths import REPO

VALUE_GATED = ["normgate", "projgate", "sink+norm", "sink+proj", "routing-norm"]
VOCAB, L, H, C = 24, 2, 2, 16
D = C // H
TOL = 1e-5
MIN_COUNT = 8

runner = CliRunner()


def make(variant: str, seed: int = 0, **fields) -> GPT:
    """A tiny trainer model with its gates moved off their init so they spread over (0, 1)."""
    torch.manual_seed(seed)
    config = dict(vocab_size=VOCAB, block_size=64, n_layer=L, n_head=H, n_embd=C, variant=variant)
    model = GPT(GPTConfig(**{**config, **fields})).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for block in model.transformer.h:
            attn = block.attn
            attn.c_attn.weight.mul_(4.0)  # sharper attention, larger values
            if hasattr(attn, "gate_tau"):
                attn.gate_tau.copy_(0.45 + 0.1 * torch.randn(H, generator=g))
            if hasattr(attn, "gate_w"):
                attn.gate_w.copy_(torch.randn(H, D, generator=g))
                attn.gate_b.copy_(0.5 * torch.randn(H, generator=g))
            if hasattr(attn, "sink_logit"):
                attn.sink_logit.copy_(torch.randn(H, generator=g))
            if hasattr(attn, "c_gate"):
                attn.c_gate.weight.copy_(torch.randn(attn.c_gate.weight.shape, generator=g))
    return model


def windows(n: int = 5, length: int = 20, seed: int = 3, vocab: int = VOCAB) -> np.ndarray:
    return torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed)).numpy()


def measured(model, ids: np.ndarray, attention: str = "fused", batch_size: int = 2, min_count: int = MIN_COUNT,
             extra: list | None = None) -> pd.DataFrame:
    """The table the selectivity command's probes give on ``ids``."""
    spec = model.model_spec()
    probes = make_probes(SELECTIVITY, SelectivityOptions(min_count=min_count), spec) + (extra or [])
    run_probes(model, ids, probes, batch_size=batch_size, progress=False, attention=attention)
    return rows_to_frame(r for p in probes for r in p.rows())


# ---- the reference: weights and gates in numpy -------------------------------------------------------


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _median(x, axis):
    return np.median(x, axis=axis)


def reference(model: GPT, ids: np.ndarray, min_count: int = MIN_COUNT) -> dict[str, dict]:
    """{metric: {(layer, head) | (layer, None) | (None, None) | ("token", id): value}} in float64."""
    cfg, variant = model.config, model.config.variant_spec
    captured: dict[int, dict] = {}
    handles = []
    for layer, block in enumerate(model.transformer.h):
        handles.append(block.attn.c_attn.register_forward_hook(
            lambda _m, _i, out, layer=layer: captured.setdefault(layer, {}).__setitem__("qkv", out.double().numpy())))
        if hasattr(block.attn, "c_gate"):
            handles.append(block.attn.c_gate.register_forward_hook(
                lambda _m, _i, out, layer=layer: captured[layer].__setitem__("gate", out.double().numpy())))
    with torch.no_grad():
        model(torch.from_numpy(ids), attention="explicit")
    for handle in handles:
        handle.remove()

    B, T = ids.shape
    per_head: dict[str, dict[int, np.ndarray]] = {}
    token_values: dict[int, np.ndarray] = {}  # layer -> (H, B*T) gate values, token order = ids.ravel()
    for layer, block in enumerate(model.transformer.h):
        attn = block.attn
        qkv = captured[layer]["qkv"]  # (B, T, 3C)
        q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, H, D).transpose(0, 2, 1, 3) for i in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)  # (B, H, T, S)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        visible = j <= i
        if cfg.layer_window(layer) is not None:
            visible &= (i - j) < cfg.layer_window(layer)
        norms = np.linalg.norm(v, axis=-1)  # (B, H, S)
        rows = {}
        if variant.value_gate is not None:
            if variant.value_gate == "norm":
                z = cfg.norm_gate_beta * (norms / math.sqrt(D) - attn.gate_tau.detach().double().numpy()[None, :, None])
            else:
                z = np.einsum("bhsd,hd->bhs", v, attn.gate_w.detach().double().numpy()) \
                    + attn.gate_b.detach().double().numpy()[None, :, None]
            g = _sigmoid(z)  # (B, H, S)
            if variant.routing:
                s = s + np.log(g)[:, :, None, :]
            s = np.where(visible, s, -np.inf)
            w = np.exp(s - s.max(-1, keepdims=True))
            w = w / w.sum(-1, keepdims=True)  # (B, H, T, S): real keys only (the phantom is excluded)
            m = (w * g[:, :, None, :]).sum(-1)  # (B, H, T)
            sel = np.sqrt((w * (g[:, :, None, :] - m[..., None]) ** 2).sum(-1))  # (B, H, T)
            rows["gate_selectivity"] = sel[:, :, 1:].mean(axis=(0, 2))
            rows["gate_mean"] = m[:, :, 1:].mean(axis=(0, 2))
            rows["read_gate_mean"] = g.mean(axis=(0, 2))
            rows["read_gate_below_half"] = (g < 0.5).mean(axis=(0, 2))
            rows["value_norm_ratio"] = (norms[:, :, 0] / _median(norms[:, :, 1:], axis=-1)).mean(0)
            if not variant.routing:
                read = g * norms  # ||g_j v_j||
                rows["gated_value_norm_ratio"] = (read[:, :, 0] / _median(read[:, :, 1:], axis=-1)).mean(0)
            token_values[layer] = g.transpose(1, 0, 2).reshape(H, B * T)
        if variant.output_gate:
            o = _sigmoid(captured[layer]["gate"])  # (B, T, H*D) or (B, T, H)
            o = o.reshape(B, T, H, -1)  # (B, T, H, D|1)
            rows["out_gate_mean"] = o.mean(axis=(0, 1, 3))
            rows["out_gate_first"] = o[:, 0].mean(axis=(0, 2))
            rows["out_gate_rest"] = o[:, 1:].mean(axis=(0, 1, 3))
            rows["out_gate_sparsity"] = (o < 0.1).mean(axis=(0, 1, 3))
        for metric, values in rows.items():
            per_head.setdefault(metric, {})[layer] = values

    table: dict[str, dict] = {}
    for metric, by_layer in per_head.items():
        cells = {(l, h): float(v) for l, heads in by_layer.items() for h, v in enumerate(heads)}
        cells.update({(l, None): float(np.mean(heads)) for l, heads in by_layer.items()})
        cells[(None, None)] = float(np.mean([np.mean(heads) for heads in by_layer.values()]))
        table[metric] = cells
    if token_values:
        tokens = ids.ravel()
        counts = np.bincount(tokens, minlength=VOCAB)
        for metric, suffix, keep in (("token_share", "", np.ones(B * T, bool)),
                                     ("token_share_frequent", "_frequent",
                                      counts[tokens] >= min_count)):
            cells, pooled = {}, np.zeros(2)
            # the chance level from the kept positions alone: K distinct tokens among them, N of them
            N_kept, K_kept = int(keep.sum()), len(np.unique(tokens[keep]))
            chance = (K_kept - 1) / (N_kept - 1) if N_kept > 1 else np.nan
            for layer, g in token_values.items():
                layer_sums = np.zeros(2)
                for h in range(H):
                    x, t = g[h][keep], tokens[keep]
                    if not keep.any():
                        cells[(layer, h)] = np.nan
                        continue
                    grand = x.mean()
                    total = ((x - grand) ** 2).sum()
                    between = sum((t == u).sum() * (x[t == u].mean() - grand) ** 2 for u in np.unique(t))
                    cells[(layer, h)] = between / total
                    layer_sums += (between, total)
                cells[(layer, None)] = layer_sums[0] / layer_sums[1] if keep.any() else np.nan
                pooled += layer_sums
            cells[(None, None)] = pooled[0] / pooled[1] if keep.any() else np.nan
            table[metric] = cells
            table[f"token_share_chance{suffix}"] = {key: chance for key in cells}
            table[f"token_share_excess{suffix}"] = {key: (share - chance) / (1 - chance) for key, share in cells.items()}
        stacked = np.stack(list(token_values.values()))  # (L, H, B*T)
        table["token_gate"] = {("token", int(u)): float(stacked[:, :, tokens == u].mean()) for u in np.unique(tokens)}
    return table


def produced(frame: pd.DataFrame) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for row in frame.itertuples():
        if row.metric == "token_gate":
            key = ("token", int(row.token_id))
        else:
            key = (None if pd.isna(row.layer) else int(row.layer), None if pd.isna(row.head) else int(row.head))
        out.setdefault(row.metric, {})[key] = row.value
    return out


def assert_equal_to_reference(frame: pd.DataFrame, expected: dict[str, dict], tol: float = TOL) -> None:
    got = produced(frame)
    assert set(got) == set(expected), set(got) ^ set(expected)
    for metric, cells in expected.items():
        assert set(got[metric]) == set(cells), metric
        for key, value in cells.items():
            if np.isnan(value):  # e.g. no token reaches min_count: both sides say so
                assert np.isnan(got[metric][key]), (metric, key, got[metric][key])
                continue
            assert abs(got[metric][key] - value) <= tol, (metric, key, got[metric][key], value)


# ---- every number equals the formula ---------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["explicit", "fused"])
@pytest.mark.parametrize("variant", VALUE_GATED)
def test_value_gate_numbers_equal_the_formulas(variant, attention):
    model = make(variant)
    ids = windows()
    assert_equal_to_reference(measured(model, ids, attention), reference(model, ids))


@pytest.mark.parametrize("attention", ["explicit", "fused"])
@pytest.mark.parametrize("mode", ["elementwise", "headwise"])
def test_output_gate_numbers_equal_the_formulas(mode, attention):
    model = make("outgate", outgate_mode=mode)
    ids = windows()
    frame = measured(model, ids, attention)
    assert_equal_to_reference(frame, reference(model, ids))
    first = frame[(frame.metric == "out_gate_first") & frame["head"].notna()]
    assert (first["n"] == 5).all()  # the windows, whatever the gate's shape (SPEC.md "Tables")


def test_sliding_layers_and_phantom_on_the_fused_path():
    """gpt-oss's pattern (sliding, full) with a learned phantom: the fused record's mask and LSE."""
    model = make("sink+norm", layer_pattern="sliding,full", window=5)
    ids = windows(8, 24)
    for attention in ("explicit", "fused"):
        assert_equal_to_reference(measured(model, ids, attention), reference(model, ids))


def test_fused_and_explicit_tables_agree_and_the_fused_path_keeps_logits():
    model = make("sink+proj")
    ids = windows(6, 24)
    fused, explicit = measured(model, ids, "fused"), measured(model, ids, "explicit")
    pd.testing.assert_frame_equal(fused.drop(columns="value"), explicit.drop(columns="value"))
    np.testing.assert_allclose(fused["value"].to_numpy(), explicit["value"].to_numpy(), rtol=0, atol=1e-6)
    from collect import Collect

    sink = Collect(hp.ATTN)
    sink.record_columns = frozenset({"value_gate"})
    with torch.no_grad():
        plain, _ = model(torch.from_numpy(ids))
        recorded, _ = model(torch.from_numpy(ids), hooks=sink)
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=0)
    record = sink.records[0]
    assert record.is_fused and record.mask is None and record.gate_columns.shape == (6, H, 24, 2)


# ---- the cases of the issue -----------------------------------------------------------------------------


@register_probe("test_constant_norm_values", metrics={"unused": MetricInfo("unused", "", "", "test")})
class ConstantNormValues(Probe):
    """Replaces every value of window b by c_b e_0, so a norm gate is one value per window (and head)."""

    def setup(self) -> None:
        pass

    @intervenes(hp.ATTN_V)
    def values(self, layer, v):  # (B, S, H, D)
        out = torch.zeros_like(v)  # (B, S, H, D)
        out[..., 0] = torch.linspace(0.2, 0.7, v.shape[0], dtype=v.dtype).view(-1, 1, 1) * math.sqrt(v.shape[-1])
        return out

    def rows(self) -> list[Row]:
        return []


@pytest.mark.parametrize("attention", ["explicit", "fused"])
def test_a_gate_constant_within_every_row_has_selectivity_exactly_zero(attention):
    # projection gate with w_h = 0: g = sigmoid(c_h), one value per head
    model = make("sink+proj")
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.gate_w.zero_()
    frame = measured(model, windows(), attention)
    sel = frame[frame.metric == "gate_selectivity"]
    assert len(sel) == L * H + L + 1 and (sel["value"] == 0.0).all()
    assert frame[frame.metric == "token_share"]["value"].isna().all()  # no variance to explain
    # norm gate on values of one norm per window: constant within rows, different across windows
    model = make("normgate")
    frame = measured(model, windows(), attention, extra=[ConstantNormValues(model.model_spec())])
    sel = frame[frame.metric == "gate_selectivity"]
    assert (sel["value"] == 0.0).all()
    read = frame[(frame.metric == "read_gate_below_half") & frame.layer.isna()]["value"].item()
    assert 0.0 < read < 1.0  # the gate itself varies (across windows), only not within a row


@pytest.mark.parametrize("attention", ["explicit", "fused"])
def test_a_gate_of_the_token_id_alone_has_token_share_one(attention):
    """One layer, no position embedding: v_j, hence g_j, is a function of the token at j."""
    model = make("normgate", n_layer=1)
    with torch.no_grad():
        model.transformer.wpe.weight.zero_()
    frame = measured(model, windows(8, 24), attention)
    for names in (("token_share", "token_share_frequent"),  # a share of 1 is 1 above chance too
                  ("token_share_excess", "token_share_excess_frequent")):
        shares = frame[frame.metric.isin(names)]
        assert len(shares) == 2 * (H + 1 + 1)
        np.testing.assert_allclose(shares["value"].to_numpy(), 1.0, rtol=0, atol=1e-9)
    selectivity = frame[(frame.metric == "gate_selectivity") & frame.layer.isna()]["value"].item()
    assert selectivity > 0.01  # the gate does vary across the reads


def test_a_gate_independent_of_the_token_has_a_share_near_zero():
    """Every token embedded alike: the gate is a function of the position, and the tokens are iid.

    For K distinct tokens among N gate values assigned at random, between SS / total SS has mean
    (K - 1) / (N - 1) and is close to Beta((K - 1)/2, (N - K)/2); we require every head, layer
    and model share to lie below the mean plus 4 standard deviations of that law.
    """
    model = make("normgate")
    with torch.no_grad():
        model.transformer.wte.weight.copy_(model.transformer.wte.weight[:1].expand(VOCAB, C).clone())
    ids = windows(16, 32, seed=7, vocab=16)
    frame = measured(model, ids, "fused")
    N, K = ids.size, len(np.unique(ids))
    a, b = (K - 1) / 2, (N - K) / 2
    mean, sd = a / (a + b), math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
    bound = mean + 4 * sd  # 0.029 + 4 * 0.0105 = 0.071 at N = 512, K = 16
    shares = frame[frame.metric == "token_share"]["value"]
    assert len(shares) == L * H + L + 1 and (shares < bound).all(), (shares.max(), bound)
    assert frame[(frame.metric == "gate_selectivity") & frame.layer.isna()]["value"].item() > 0.01


def test_the_chance_level_is_the_mean_share_of_shuffled_gates_and_the_excess_subtracts_it():
    """Issue 27 (5): token_share_chance is the share a token-blind gate gets at this N and K.

    Independent of the probe: the gate values of one head are read with a forward hook, shuffled
    over the positions 2,000 times (token counts kept) and the between/total SS of each shuffle
    computed in numpy; the mean of those shares is the chance level (exactly, in expectation), so
    the reported chance must lie within 4 standard errors of it; the excess is
    (share - chance) / (1 - chance). For [n>=K], K and N count only the positions of kept tokens.
    """
    model = make("normgate", n_layer=1)
    ids = windows(6, 20, seed=11, vocab=12)  # N = 120, K = 12: chance 0.092, far from 0
    frame = measured(model, ids, "fused", min_count=MIN_COUNT)
    captured = {}
    handle = model.transformer.h[0].attn.c_attn.register_forward_hook(
        lambda _m, _i, out: captured.__setitem__("qkv", out.double().numpy()))
    with torch.no_grad():
        model(torch.from_numpy(ids), attention="explicit")
    handle.remove()
    B, T = ids.shape
    v = captured["qkv"][..., 2 * C:].reshape(B, T, H, D)  # (B, T, H, D)
    tau = model.transformer.h[0].attn.gate_tau.detach().double().numpy()
    g = _sigmoid(model.config.norm_gate_beta * (np.linalg.norm(v, axis=-1) / math.sqrt(D) - tau))  # (B, T, H)
    tokens = ids.ravel()

    def share(x, t):
        grand = x.mean()
        between = sum((t == u).sum() * (x[t == u].mean() - grand) ** 2 for u in np.unique(t))
        return between / ((x - grand) ** 2).sum()

    rng = np.random.default_rng(0)
    counts = np.bincount(tokens)
    for suffix, keep in (("", np.ones_like(tokens, bool)), ("_frequent", counts[tokens] >= MIN_COUNT)):
        x, t = g[..., 0].ravel()[keep], tokens[keep]
        assert 1 < len(np.unique(t)) < len(t)
        shuffled = np.array([share(rng.permutation(x), t) for _ in range(2000)])
        row = frame[(frame.metric == f"token_share_chance{suffix}") & (frame.layer == 0) & (frame["head"] == 0)]
        chance = row["value"].item()
        assert abs(chance - shuffled.mean()) < 4 * shuffled.std() / math.sqrt(len(shuffled)), (chance, shuffled.mean())
        assert chance == pytest.approx((len(np.unique(t)) - 1) / (len(t) - 1), abs=1e-12)
        for layer, head in ((0, 0), (0, None), (None, None)):
            where = (frame.layer == layer if layer is not None else frame.layer.isna()) & \
                    (frame["head"] == head if head is not None else frame["head"].isna())
            s_ = frame[where & (frame.metric == ("token_share" if not suffix else f"token_share{suffix}"))]["value"].item()
            c_ = frame[where & (frame.metric == f"token_share_chance{suffix}")]["value"].item()
            e_ = frame[where & (frame.metric == f"token_share_excess{suffix}")]["value"].item()
            assert c_ == pytest.approx(chance, abs=1e-12)  # every head sees the same K and N
            assert e_ == pytest.approx((s_ - c_) / (1 - c_), abs=1e-12)
        assert frame[(frame.metric == "token_share") & (frame.layer == 0) & (frame["head"] == 0)]["value"].item() \
            == pytest.approx(share(g[..., 0].ravel(), tokens), abs=TOL)


def test_selectivity_measures_enough_tokens_by_default_for_a_small_chance_level():
    """Issue 27 (5): the default sample of `selectivity` is 256 windows (32,768 tokens at ctx 128)."""
    assert SelectivityOptions().n_seqs == 256


# ---- streaming: batch size, merging, resuming --------------------------------------------------------------


def test_results_do_not_depend_on_the_batch_size():
    model = make("sink+norm")
    ids = windows(6, 20)
    one, four = measured(model, ids, batch_size=1), measured(model, ids, batch_size=4)
    pd.testing.assert_frame_equal(one.drop(columns="value"), four.drop(columns="value"))
    np.testing.assert_allclose(one["value"].to_numpy(), four["value"].to_numpy(), rtol=1e-6, atol=1e-7)  # float32 kernels


@pytest.mark.parametrize("variant", ["normgate", "outgate"])
def test_merged_shares_and_resumed_state_give_the_one_pass_table(variant):
    """Probes over windows [0:3] merged with [3:7] (data parallel), and a state_dict round trip
    followed by the rest of the windows (resume), both equal one pass over [0:7]."""
    model = make(variant)
    ids = windows(7, 20, seed=5)
    spec = model.model_spec()

    def probes_over(part, probes=None):
        probes = probes or make_probes(SELECTIVITY, SelectivityOptions(min_count=MIN_COUNT), spec)
        run_probes(model, part, probes, batch_size=2, progress=False)
        return probes

    def table(probes):
        return rows_to_frame(r for p in probes for r in p.rows())

    one = table(probes_over(ids))
    first, second = probes_over(ids[:3]), probes_over(ids[3:])
    for a, b in zip(first, second):
        a.merge(b)
    merged = table(first)
    pd.testing.assert_frame_equal(one.drop(columns="value"), merged.drop(columns="value"))
    np.testing.assert_allclose(merged["value"].to_numpy(), one["value"].to_numpy(), rtol=1e-6, atol=1e-7)  # batches differ: float32 kernels
    resumed = make_probes(SELECTIVITY, SelectivityOptions(min_count=MIN_COUNT), spec)
    for fresh, part in zip(resumed, probes_over(ids[:4])):
        fresh.load_state_dict(part.state_dict())
    again = table(probes_over(ids[4:], resumed))
    np.testing.assert_allclose(again["value"].to_numpy(), one["value"].to_numpy(), rtol=1e-6, atol=1e-7)  # batches differ: float32 kernels


def test_token_sums_merge_across_vocabulary_widths_and_keep_no_list_of_values():
    """Without a known vocabulary the arrays grow to the largest id; shares of any width merge."""
    gen = torch.Generator().manual_seed(0)
    ids_a, ids_b = torch.randint(0, 5, (2, 6), generator=gen), torch.randint(0, 9, (3, 6), generator=gen)
    g_a, g_b = torch.rand(2, 3, 6, generator=gen), torch.rand(3, 3, 6, generator=gen)
    a, b, whole = TokenSums(1, 3), TokenSums(1, 3), TokenSums(1, 3)
    a.add(0, ids_a, g_a)
    b.add(0, ids_b, g_b)
    whole.add(0, ids_a, g_a)
    whole.add(0, ids_b, g_b)
    assert a.width() == int(ids_a.max()) + 1 and whole.width() == int(ids_b.max()) + 1
    a.merge(b)
    for mine, theirs in zip(a.arrays(0), whole.arrays(0)):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-12)
    state = a.state_dict()
    assert set(state) == {"sums", "squares", "counts", "seen"} and state["sums"].shape == (1, 3, 9)
    restored = TokenSums(1, 3)
    restored.load_state_dict(state)
    for mine, theirs in zip(restored.arrays(0), whole.arrays(0)):
        np.testing.assert_array_equal(mine, theirs)


# ---- memory ---------------------------------------------------------------------------------------------


def test_the_fused_path_keeps_memory_linear_in_the_sequence_length():
    """The largest tensor any op creates grows 2x when T doubles on the fused path (4x on the explicit)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel())
            return out

    largest = {}
    for attention in ("fused", "explicit"):
        for T in (256, 512):
            torch.manual_seed(0)
            model = GPT(GPTConfig(vocab_size=VOCAB, block_size=512, n_layer=1, n_head=2, n_embd=16,
                                  variant="sink+proj")).eval()
            probes = make_probes(SELECTIVITY, SelectivityOptions(), model.model_spec())
            with Largest() as mode:
                run_probes(model, windows(2, T), probes, batch_size=2, progress=False, attention=attention)
            largest[attention, T] = mode.numel
    assert largest["fused", 512] <= 2 * largest["fused", 256]
    assert largest["fused", 512] < 2 * 2 * 512 * 512 / 8  # far below one (B, H, T, S) tensor
    assert largest["explicit", 512] >= 4 * largest["explicit", 256] * 0.99  # the reference is quadratic


# ---- the command ----------------------------------------------------------------------------------------


_checkpoint = trainer_checkpoint


def test_two_checkpoints_give_one_comparison_report(tmp_path, text_file, tokenizer):
    normgate = _checkpoint(tmp_path / "normgate-s0", "normgate", tokenizer)
    sinkproj = _checkpoint(tmp_path / "sink+proj-s0", "sink+proj", tokenizer)
    out = tmp_path / "gates"
    result = runner.invoke(app, ["selectivity", str(normgate), str(sinkproj), "--text-file", str(text_file),
                                 "--seq-len", "32", "--n-seqs", "4", "--min-count", "3", "--out", str(out),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith(str(out / "report.html"))
    for name, variant in (("normgate-s0", "normgate"), ("sink+proj-s0", "sink+proj")):
        table = pd.read_csv(out / name / "results.csv")
        assert set(table.variant) == {variant}
        assert {"gate_selectivity", "gate_mean", "token_share", "token_share_frequent", "token_gate", "read_gate_mean",
                "gated_value_norm_ratio"} <= set(table.metric)
        tokens = table[table.metric == "token_gate"]
        assert tokens["token_id"].notna().all() and tokens["token"].notna().all()
        assert json.loads((out / name / "manifest.json").read_text())["command"] == "selectivity"
    html = (out / "report.html").read_text()
    assert "normgate-s0" in html and "sink+proj-s0" in html and 'class="tokens"' in html
    for figure in ("runs_gate_selectivity", "bars_token_share", "heatmap_gate_selectivity_run1",
                   "overlay_gate_mean"):
        assert (out / "figures" / f"{figure}.png").is_file(), figure
    # grouping keeps the per-token rows apart (they differ in token_id, not in the run's conditions)
    from sinkscope.report.build import read_run
    from sinkscope.report.runs import group_runs

    n_tokens = (pd.read_csv(out / "normgate-s0" / "results.csv").metric == "token_gate").sum()
    grouped = group_runs([read_run(out / "normgate-s0")], "variant")[0]
    assert (grouped.table.metric == "token_gate").sum() == n_tokens > 1


def test_an_output_gated_checkpoint_says_selectivity_is_undefined(tmp_path, text_file, tokenizer):
    ckpt = _checkpoint(tmp_path / "outgate", "outgate", tokenizer, outgate_mode="headwise")
    out = tmp_path / "run"
    result = runner.invoke(app, ["selectivity", str(ckpt), "--text-file", str(text_file), "--seq-len", "24",
                                 "--n-seqs", "3", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    assert set(table.probe) == {"output_gate"}
    assert "within-row selectivity" in (out / "report.html").read_text()


def test_bad_input_is_one_sentence(tmp_path, text_file, tokenizer):
    gated = _checkpoint(tmp_path / "normgate", "normgate", tokenizer)
    plain = _checkpoint(tmp_path / "baseline", "baseline", tokenizer)
    common = ["--text-file", str(text_file), "--seq-len", "24", "--n-seqs", "2", "--no-progress"]
    cases = [
        ([str(plain)], ["has no gate", "normgate", "Qwen3-Next"]),
        ([str(gated), str(plain)], ["no gate while the other models do", str(plain)]),
    ]
    bare = _checkpoint(tmp_path / "no-tokenizer", "sink+norm", tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / name).unlink(missing_ok=True)
    cases.append(([str(bare)], ["has no tokenizer", "copy in the tokenizer"]))
    for models, phrases in cases:
        result = runner.invoke(app, ["selectivity", *models, *common, "--out", str(tmp_path / "never")])
        assert result.exit_code == 1, result.output
        assert result.output.count("error:") == 1 and len(result.output.strip().splitlines()) == 1, result.output
        for phrase in phrases:
            assert phrase in result.output, (phrase, result.output)
        assert not (tmp_path / "never").exists()
    one = runner.invoke(app, ["selectivity", str(gated), *common, "--group-by", "variant"])
    assert one.exit_code == 1 and "several" in one.output


def test_qwen3_next_output_gates_equal_the_q_proj_gate(tmp_path):
    """Qwen3-Next's output gate (the second half of q_proj per head), on both capture paths."""
    from tiny_models import build, random_ids

    model = build("qwen3_next")
    ids = random_ids(3, 16, seed=2)
    gates = {}
    handles = [model.model.layers[l].self_attn.q_proj.register_forward_hook(
        lambda _m, _i, out, l=l: gates.__setitem__(l, out.detach().double()))
        for l in (1, 2)]
    with torch.no_grad():
        model(ids)
    for handle in handles:
        handle.remove()
    spec = ModelSpec.from_model(model)
    assert spec.has_output_gate and not spec.has_value_gate
    assert [name for name, _ in SELECTIVITY.probes(SelectivityOptions(), spec)] == ["output_gate"]
    for attention in ("explicit", "fused"):
        probes = make_probes(SELECTIVITY, SelectivityOptions(), spec)
        run_probes(model, ids.numpy(), probes, batch_size=2, progress=False, attention=attention)
        got = produced(rows_to_frame(r for p in probes for r in p.rows()))
        for layer, out in gates.items():
            B, T, _ = out.shape
            o = torch.sigmoid(out.view(B, T, 4, 32)[..., 16:]).numpy()  # (B, T, H, D)
            for h in range(4):
                expected = {"out_gate_mean": o[:, :, h].mean(), "out_gate_first": o[:, 0, h].mean(),
                            "out_gate_rest": o[:, 1:, h].mean(), "out_gate_sparsity": (o[:, :, h] < 0.1).mean()}
                for metric, value in expected.items():
                    assert abs(got[metric][(layer, h)] - value) <= TOL, (attention, metric, layer, h)
        assert (0, 0) not in got["out_gate_mean"]  # the linear-attention layer has no softmax attention


def test_a_phantom_that_takes_almost_all_the_mass_leaves_the_real_key_moments_exact():
    """b_h far above the clamp (15): the phantom holds ~all of each row, w_ij still sums to 1."""
    model = make("sink+norm")
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.sink_logit.fill_(SINK_LOGIT_RANGE[1] + 5.0)  # clamped in the forward pass
    ids = windows(3, 16)
    assert_equal_to_reference(measured(model, ids, "fused"), reference(model, ids))


def test_several_models_resume_keeps_the_finished_runs(tmp_path, text_file, tokenizer):
    models = [str(_checkpoint(tmp_path / v, v, tokenizer)) for v in ("normgate", "routing-norm")]
    common = ["--text-file", str(text_file), "--seq-len", "24", "--n-seqs", "3", "--no-progress", "--no-figures",
              "--out", str(tmp_path / "cmp")]
    first = runner.invoke(app, ["selectivity", *models, *common])
    assert first.exit_code == 0, first.output
    kept = (tmp_path / "cmp" / "normgate" / "results.csv").read_bytes()
    again = runner.invoke(app, ["selectivity", *models, *common])
    assert again.exit_code == 1 and "--overwrite" in again.output  # the first run folder is refused, nothing ran
    import shutil

    shutil.rmtree(tmp_path / "cmp" / "routing-norm")  # as if killed before the second model was written
    resumed = runner.invoke(app, ["selectivity", *models, *common, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "Keeping the finished run" in resumed.output
    assert (tmp_path / "cmp" / "normgate" / "results.csv").read_bytes() == kept
    table = pd.read_csv(tmp_path / "cmp" / "routing-norm" / "results.csv")
    assert set(table.variant) == {"routing-norm"} and "gated_value_norm_ratio" not in set(table.metric)


@pytest.mark.slow  # spawns Python (torchrun)
def test_data_parallel_runs_of_several_models_equal_one_process(tmp_path, text_file, tokenizer):
    """torchrun with 2 processes: the token sums and every mean merge into the one-process tables."""
    import os
    import subprocess
    import sys

    models = [str(_checkpoint(tmp_path / v, v, tokenizer)) for v in ("sink+norm", "outgate")]
    common = ["--text-file", str(text_file), "--seq-len", "24", "--n-seqs", "7", "--batch-size", "2",
              "--min-count", "3", "--no-progress", "--no-figures", "--device", "cpu"]
    one = tmp_path / "one"
    assert runner.invoke(app, ["selectivity", *models, *common, "--out", str(one)]).exit_code == 0
    two = tmp_path / "two"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), "-m", "sinkscope", "selectivity", *models, *common, "--out", str(two)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("sink+norm", "outgate"):
        a, b = pd.read_csv(one / name / "results.csv"), pd.read_csv(two / name / "results.csv")
        pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
        np.testing.assert_allclose(a["value"].to_numpy(), b["value"].to_numpy(), rtol=1e-6, atol=1e-7)
        assert json.loads((two / name / "manifest.json").read_text())["processes"] == 2


def test_a_comparison_across_tiers_draws_one_line_per_variant():
    """Wang 2026 Fig. 1d: the model value by tier (in size order), one line per variant, layer range as bars."""
    from pathlib import Path

    from sinkscope.report import figures
    from sinkscope.report.generic import _across_runs
    from sinkscope.report.runs import RunData

    def run(variant, tier, value):
        rows = [Row("gate_selectivity", "gate_selectivity", 0, None, value - 0.01, 1),
                Row("gate_selectivity", "gate_selectivity", 1, None, value + 0.01, 1),
                Row("gate_selectivity", "gate_selectivity", None, None, value, 2)]
        manifest = {"conditions": {"variant": variant, "tier": tier, "seed": 0}}
        return RunData(Path(f"{variant}-{tier}"), f"{variant}-{tier}", manifest, rows_to_frame(rows))

    runs = [run("normgate", "50M", 0.17), run("normgate", "10M", 0.054), run("sink+proj", "10M", 0.05),
            run("sink+proj", "50M", 0.217), run("sink+proj", "124M", 0.228)]
    points, axis = _across_runs(runs, "gate_selectivity")
    assert axis == "tier" and list(dict.fromkeys(points["x"])) == ["10M", "50M", "124M"]
    fig = figures.model_value_plot(points, "gate_selectivity", x_label=axis)
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    np.testing.assert_allclose(lines["normgate"].get_ydata(), [0.054, 0.17])
    np.testing.assert_allclose(lines["sink+proj"].get_xdata(), [0, 1, 2])
    np.testing.assert_allclose(lines["sink+proj"].get_ydata(), [0.05, 0.217, 0.228])
    one_tier, axis = _across_runs(runs[1:3], "gate_selectivity")
    assert axis == "run" and list(one_tier["x"]) == ["normgate-10M", "sink+proj-10M"]


def test_token_share_bars_are_the_layer_rows():
    from sinkscope.report import figures

    a = rows_to_frame([Row("token_share", "token_share", 0, None, 0.8, 4), Row("token_share", "token_share", 1, None,
                                                                              0.5, 4),
                       Row("token_share", "token_share", 0, 0, 0.9, 2)])
    b = rows_to_frame([Row("token_share", "token_share", 1, None, 0.3, 4)])
    fig = figures.per_layer_bars({"a": a, "b": b}, "token_share")
    bars = fig.axes[0].containers
    assert [round(r.get_height(), 6) for r in bars[0]] == [0.8, 0.5] and [r.get_height() for r in bars[1]] == [0.3]
    assert bars[1][0].get_x() > bars[0][1].get_x()  # run b's bar sits beside run a's at layer 1


def test_a_rolled_back_batch_leaves_the_token_sums_as_they_were():
    """Out-of-memory retries restore the snapshot taken before the batch (TokenSums shares its arrays)."""
    model = make("normgate")
    spec = model.model_spec()
    probes = make_probes(SELECTIVITY, SelectivityOptions(min_count=2), spec)
    run_probes(model, windows(2, 16), probes, batch_size=2, progress=False)
    before = rows_to_frame(r for p in probes for r in p.rows())
    saved = [p.snapshot() for p in probes]
    run_probes(model, windows(3, 16, seed=9), probes, batch_size=2, progress=False)  # the batch to undo
    for probe, state in zip(probes, saved):
        probe.restore(state)
    pd.testing.assert_frame_equal(rows_to_frame(r for p in probes for r in p.rows()), before)
