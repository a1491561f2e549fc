"""The toy superposition task (SPEC.md; seed 000 appendix "Construction"): the data generator,
the fast forward against the explicit definition, the oracle's advantage, and the CLI's outputs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.toy import VARIANTS, ToyData, ToyOptions, _module, run_toy, summarise, train_cell


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


def test_cli_writes_table_and_figure(tmp_path):
    import torch

    out = tmp_path / "toy"
    threads = torch.get_num_threads()
    result = CliRunner().invoke(app, ["toy", "--loads", "1,2", "--seeds", "0", "--steps", "5", "--batch-size", "8",
                                      "--threads", "2" if threads == 1 else "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == threads  # restored: later work in this process repeats bit for bit
    rows = pd.read_csv(out / "toy.csv")
    assert len(rows) == 2 * 2 * 4 and set(rows.variant) == set(VARIANTS)
    summary = pd.read_csv(out / "toy_summary.csv")
    assert {"error", "se", "headroom_closed"} <= set(summary.columns)
    assert (out / "toy.png").is_file() and "channel-blind" in (out / "toy.md").read_text()
    bad = CliRunner().invoke(app, ["toy", "--variants", "baseline,sinklogit", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "unknown toy variant" in bad.output
