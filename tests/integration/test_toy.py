"""The toy superposition task (SPEC.md; Wang 2026 appendix "Construction"): the data generator,
the fast forward against the explicit definition, the oracle's advantage, and the CLI's outputs."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.lab.toy import (VARIANTS, ToyData, ToyOptions, ToyStackData, _initial, _module, _stack, bag_readout,
                           bce_grad, hash_seed, read_weights, sample_stack, summarise, torch_threads,
                           train_all, train_cell, train_group)


def gens(items: int, keys: int):
    return torch.Generator().manual_seed(items), torch.Generator().manual_seed(keys)


def test_relevant_probability_and_targets():
    data = ToyData(256, 0)
    batch = data.sample(2000, *gens(1, 2), "blind")
    assert batch.relevant.float().mean().item() == pytest.approx(0.15, abs=0.005)  # 128,000 items
    assert bool((batch.ids[batch.relevant] < 16).all()) and bool((batch.ids[~batch.relevant] >= 16).all())
    # every relevant feature appears about equally often, irrelevant ones cover the rest
    counts = torch.bincount(batch.ids[batch.relevant], minlength=16).float()
    assert counts.min() / counts.max() > 0.8
    expected = torch.stack([((batch.ids == r) & batch.relevant).any(dim=1) for r in range(16)], dim=1).float()
    assert torch.equal(batch.targets, expected)


@pytest.mark.parametrize("n", [32, 64])
def test_dictionary_is_orthonormal_up_to_d(n):
    dictionary = ToyData(n + 0, 3).dictionary.double()  # (N, 64)
    assert torch.allclose(dictionary @ dictionary.T, torch.eye(n, dtype=torch.float64), atol=1e-5)


def test_dictionary_in_superposition_has_unit_rows_and_interference():
    dictionary = ToyData(512, 3).dictionary.double()  # load 8
    assert torch.allclose(dictionary.norm(dim=1), torch.ones(512, dtype=torch.float64), atol=1e-5)
    off = (dictionary @ dictionary.T - torch.eye(512, dtype=torch.float64)).abs()
    assert off.max() > 0.2  # features interfere


def test_channel_blind_keys_carry_no_content():
    data = ToyData(256, 0)
    # the tags come from the keys' stream alone: other items, same tags
    a = data.sample(64, *gens(1, 9), "blind")
    b = data.sample(64, *gens(2, 9), "blind")
    assert not torch.equal(a.ids, b.ids) and torch.equal(a.tags, b.tags)
    assert torch.equal(data.keys(a), data.tag_bank[a.tags])
    # and nothing in them tells a relevant item from an irrelevant one, nor which feature it is
    big = data.sample(4000, *gens(3, 4), "blind")
    keys = data.keys(big)  # (n, T, d)
    diff = keys[big.relevant].mean(0) - keys[~big.relevant].mean(0)  # (d,)
    assert diff.norm().item() < 0.02  # a content-carrying key would differ by ~1 along the features
    rel_dirs = data.dictionary[:16]  # (16, d)
    assert (keys[big.relevant] @ rel_dirs.T).mean(0).abs().max().item() < 0.01
    # routing-visible keys are the items themselves
    visible = data.sample(8, *gens(1, 9), "visible")
    assert torch.equal(data.keys(visible), data.dictionary[visible.ids])


@pytest.mark.parametrize("condition", ["blind", "visible"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_fast_forward_matches_the_explicit_definition(variant, condition):
    torch.manual_seed(0)
    data = ToyData(128, 1)
    batch = data.sample(16, *gens(5, 6), condition)
    model = _module(variant, 64, 16, 8.0)
    with torch.no_grad():
        model.tau.fill_(0.1) if model.tau is not None else None
        fast = model(data, batch)
        slow = model.reference(data.values(batch), data.keys(batch), batch.relevant)
    assert torch.allclose(fast, slow, atol=1e-5)


def stack_and_models(condition: str, load: int, n_seeds: int = 2, n: int = 16):
    """A stack with random weights (tau 0.1), its slices as ToyModels, the data and one batch per seed."""
    torch.manual_seed(0)
    datas = [ToyData(64 * load, seed) for seed in range(n_seeds)]
    gens_ = [gens(5 + seed, 9 + seed) for seed in range(n_seeds)]
    batches = [data.sample(n, *gen, condition) for data, gen in zip(datas, gens_)]
    models = [[_module(v, 64, 16, 8.0) for v in VARIANTS] for _ in range(n_seeds)]
    for row in models:
        with torch.no_grad():
            row[VARIANTS.index("normgate")].tau.fill_(0.1)
    stack = _stack(VARIANTS, n_seeds, 64, 16, 8.0)
    stack.load_models(models)
    batch = sample_stack(datas, n, [gens(5 + seed, 9 + seed) for seed in range(n_seeds)], condition)
    return stack, models, datas, batches, batch


@pytest.mark.parametrize("condition", ["blind", "visible"])
def test_sample_stack_is_each_seeds_sample(condition):
    _, _, _, batches, batch = stack_and_models(condition, 2, n_seeds=3)
    for s, alone in enumerate(batches):
        assert torch.equal(batch.ids[s], alone.ids) and torch.equal(batch.relevant[s], alone.relevant)
        assert torch.equal(batch.targets[s], alone.targets)
        assert (batch.tags is None) == (alone.tags is None)
        assert alone.tags is None or torch.equal(batch.tags[s], alone.tags)


@pytest.mark.parametrize("condition", ["blind", "visible"])
@pytest.mark.parametrize("load", [1, 4])
def test_stack_slices_are_their_own_models(condition, load):
    """Each (seed, variant) slice of the stacked forward is its own ToyModel (fast path and explicit
    definition), and, the loss being the sum of the slices' losses, so is each slice's gradient."""
    stack, models, datas, batches, batch = stack_and_models(condition, load)
    logits = stack(ToyStackData.of(datas), batch)  # (S, V, n, R)
    targets = batch.targets.unsqueeze(1).expand_as(logits)
    F.binary_cross_entropy_with_logits(logits, targets, reduction="none").mean(dim=(2, 3)).sum().backward()
    for s, row in enumerate(models):
        for v, model in enumerate(row):
            data, alone = datas[s], batches[s]
            fast = model(data, alone)
            assert torch.allclose(logits[s, v], fast, atol=1e-5)
            with torch.no_grad():
                slow = model.reference(data.values(alone), data.keys(alone), alone.relevant)
            assert torch.allclose(logits[s, v], slow, atol=1e-5)
            F.binary_cross_entropy_with_logits(fast, alone.targets).backward()
            pairs = [(stack.q.grad[s, v], model.q.grad), (stack.w_k.grad[s, v], model.w_k.weight.grad),
                     (stack.w_v.grad[s, v], model.w_v.weight.grad),
                     (stack.readout_w.grad[s, v], model.readout.weight.grad),
                     (stack.readout_b.grad[s, v], model.readout.bias.grad)]
            if model.tau is not None:
                pairs.append((stack.tau.grad[s], model.tau.grad))
            for mine, theirs in pairs:
                assert torch.allclose(mine, theirs, atol=1e-6, rtol=1e-4)
            back = stack.model(s, v)  # and a slice comes back out as the same model
            assert torch.allclose(back(data, alone), fast, atol=1e-6)


def test_read_weights_and_bag_readout_gradients():
    g = torch.Generator().manual_seed(0)
    S, V, n, T, N, d, R = 2, 4, 3, 5, 7, 4, 3
    s = torch.randn(S, V, n, T, generator=g, dtype=torch.float64, requires_grad=True)
    gate = torch.rand(S, n, T, generator=g, dtype=torch.float64, requires_grad=True)
    mask = (torch.rand(S, n, T, generator=g) < 0.5).double()
    torch.autograd.gradcheck(lambda s, gate: read_weights(s, (1,), gate, 2, mask, 3), (s, gate))
    with torch.no_grad():  # the definition, column by column
        a = read_weights(s, (1,), gate, 2, mask, 3)
        with_phantom = torch.softmax(torch.cat([s[:, 1], torch.zeros(S, n, 1, dtype=torch.float64)], -1), -1)[..., :-1]
        expected = torch.stack([torch.softmax(s[:, 0], -1), with_phantom, torch.softmax(s[:, 2], -1) * gate,
                                torch.softmax(s[:, 3], -1) * mask], dim=1)
        assert torch.allclose(a, expected, atol=1e-12)
    weights = torch.rand(S, V, n, T, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, N, (S, n, T), generator=g)
    dictionary = torch.randn(S, N, d, generator=g, dtype=torch.float64)
    m = torch.randn(S, V, R, d, generator=g, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda w, m: bag_readout(w, ids, dictionary, m), (weights, m))
    x = dictionary[torch.arange(S).view(S, 1, 1), ids]  # (S, n, T, d)
    expected = torch.einsum("svnt,sntd,svrd->svnr", weights, x, m)
    assert torch.allclose(bag_readout(weights, ids, dictionary, m), expected, atol=1e-12)


def test_bce_grad_is_the_summed_mean_losses_gradient():
    logits = torch.randn(2, 3, 5, 4, requires_grad=True)
    targets = (torch.rand(2, 1, 5, 4) < 0.5).float()
    loss = F.binary_cross_entropy_with_logits(logits, targets.expand_as(logits), reduction="none")
    loss.mean(dim=(2, 3)).sum().backward()  # each model's mean, summed
    assert torch.allclose(bce_grad(logits.detach(), targets), logits.grad, atol=1e-7)


def train_alone(options, condition, load, seed, variant):
    """One variant trained by itself, as before the stacked module: its own ToyModel and Adam on
    the cell's batches; its row."""
    with torch_threads(1):
        return _train_alone(options, condition, load, seed, variant)


def _train_alone(options, condition, load, seed, variant):
    data = ToyData(load * 64, seed)
    model = _module(variant, 64, 16, 8.0)
    model.load_state_dict(_initial(options, seed).state_dict(), strict=False)
    optim = torch.optim.Adam(model.parameters(), lr=options.lr)
    cell = f"{condition}-{load}-{seed}"
    items, keys = (torch.Generator().manual_seed(hash_seed(k, cell)) for k in ("items", "keys"))
    for _ in range(options.steps):
        batch = data.sample(options.batch_size, items, keys, condition)
        loss = F.binary_cross_entropy_with_logits(model(data, batch), batch.targets)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
    items, keys = (torch.Generator().manual_seed(hash_seed(k, cell)) for k in ("eval-items", "eval-keys"))
    batch = data.sample(options.eval_seqs, items, keys, condition)
    with torch.no_grad():
        logits = model(data, batch)
    return {"condition": condition, "load": load, "variant": variant, "seed": seed,
            "error": float(F.binary_cross_entropy_with_logits(logits, batch.targets)),
            "label_error": float(((logits > 0).float() != batch.targets).float().mean())}


@pytest.mark.slow  # trains
@pytest.mark.parametrize("condition,load", [("blind", 2), ("visible", 1)])
def test_batched_training_gives_each_variant_alone(condition, load):
    options = ToyOptions(steps=20, batch_size=64, eval_seqs=256)
    rows = train_cell(options, condition, load, 1)
    for row in rows:
        alone = train_alone(options, condition, load, 1, row["variant"])
        keys = ("condition", "load", "variant", "seed")
        assert {k: row[k] for k in keys} == {k: alone[k] for k in keys}
        assert row["error"] == pytest.approx(alone["error"], abs=1e-6)
        assert row["label_error"] == pytest.approx(alone["label_error"], abs=1e-6)
    # and the seeds of one group train together as they would apart
    assert train_group(options, condition, load, (0, 1))[4:] == rows


@pytest.mark.slow  # spawns Python (a process pool), trains
def test_worker_processes_do_not_change_rows():
    options = ToyOptions(steps=5, batch_size=16, eval_seqs=64, loads=(1, 2), conditions=("blind",), seeds=(0,))
    assert train_all(replace(options, jobs=2)) == train_all(replace(options, jobs=1))


def test_offbyone_phantom_and_oracle_mask_by_hand():
    data = ToyData(128, 1)
    batch = data.sample(4, *gens(5, 6), "visible")
    values, keys = data.values(batch), data.keys(batch)
    torch.manual_seed(0)
    model = _module("offbyone", 64, 16, 8.0)
    with torch.no_grad():
        s = model.w_k(keys) @ model.q / 8.0  # (n, T)
        a = torch.exp(s) / (1.0 + torch.exp(s).sum(1, keepdim=True))  # the phantom's exp(0) = 1
        expected = model.readout(torch.einsum("nt,ntd->nd", a, model.w_v(values)))
        assert torch.allclose(model(data, batch), expected, atol=1e-5)
        oracle = _module("oracle", 64, 16, 8.0)
        oracle.load_state_dict(model.state_dict())
        masked = values * batch.relevant.unsqueeze(-1)
        base = _module("baseline", 64, 16, 8.0)
        base.load_state_dict(model.state_dict())
        assert torch.allclose(oracle(data, batch), base.reference(masked, keys, batch.relevant), atol=1e-5)


@pytest.mark.slow  # trains
def test_oracle_is_at_least_as_good_as_the_baseline():
    options = ToyOptions(steps=300, batch_size=64, eval_seqs=1024, variants=("baseline", "oracle"), threads=1)
    rows = {r["variant"]: r["error"] for r in train_cell(options, "blind", 4, 0)}
    assert rows["oracle"] < rows["baseline"]


def test_summary_headroom_closed():
    rows = pd.DataFrame([{"condition": "blind", "load": 2, "variant": v, "seed": s, "error": e + 0.01 * s,
                          "label_error": 0.1} for s in (0, 1) for v, e in
                         (("baseline", 0.5), ("normgate", 0.45), ("oracle", 0.3), ("offbyone", 0.55))])
    summary = summarise(rows).set_index("variant")
    assert summary.loc["normgate", "headroom_closed"] == pytest.approx(0.25)
    assert summary.loc["offbyone", "headroom_closed"] == pytest.approx(-0.25)
    assert summary.loc["oracle", "headroom_closed"] == pytest.approx(1.0)
    assert summary.loc["baseline", "se"] == pytest.approx(0.005)
    same = rows.assign(error=0.5)
    assert math.isnan(summarise(same).headroom_closed.iloc[0])  # no headroom: undefined


@pytest.mark.slow  # trains
def test_cli_writes_table_and_figure(tmp_path):
    import torch

    out = tmp_path / "toy"
    threads = torch.get_num_threads()
    result = CliRunner().invoke(app, ["toy", "--loads", "1,2", "--seeds", "0", "--steps", "5", "--batch-size", "8",
                                      "--threads", "2" if threads == 1 else "1", "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == threads  # restored: later work in this process repeats bit for bit
    rows = pd.read_csv(out / "toy.csv")
    assert len(rows) == 2 * 2 * 4 and set(rows.variant) == set(VARIANTS)
    summary = pd.read_csv(out / "toy_summary.csv")
    assert {"error", "se", "headroom_closed"} <= set(summary.columns)
    assert (out / "toy.png").is_file() and "channel-blind" in (out / "toy.md").read_text()
    bad = CliRunner().invoke(app, ["toy", "--variants", "baseline,sinklogit", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "unknown toy variant" in bad.output
    bad = CliRunner().invoke(app, ["toy", "--jobs", "0", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "--jobs must be a positive integer" in bad.output
