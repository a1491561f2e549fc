"""A trainer checkpoint is a first-class MODEL: `sinkscope sinks ckpt/` reads its native records."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from conftest import make_tokenizer
from sinkscope.cli import app
from sinkscope.models.resolve import resolve_source
from sinkscope.train.checkpoint import save_checkpoint
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT

PHANTOM = {"offbyone", "sinklogit", "sink+norm", "sink+proj"}


def _checkpoint(folder, variant: str):
    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=len(tokenizer), block_size=64, n_layer=2, n_head=2, n_embd=32, variant=variant)
    model = GPT(config)
    if variant in ("sinklogit", "sink+norm", "sink+proj"):
        with torch.no_grad():  # a trained-looking phantom logit
            for name, p in model.named_parameters():
                if "sink_logit" in name:
                    p.fill_(1.5)
    save_checkpoint(folder, model, None, step=0, train_state=None, tokenizer=tokenizer,
                    meta={"tier": "test", "seed": 0})
    return folder


@pytest.mark.parametrize("variant", ["baseline", "offbyone", "sinklogit", "sinktoken", "sink+proj", "outgate"])
def test_sinks_reads_a_trainer_checkpoint(variant, tmp_path, text_file):
    ckpt = _checkpoint(tmp_path / f"ckpt-{variant}", variant)
    assert resolve_source(str(ckpt)).kind == "checkpoint"
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["sinks", str(ckpt), "--text-file", str(text_file), "--seq-len", "24",
                                      "--n-seqs", "4", "--out", str(out), "--no-progress", "--no-figures"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    phantom = table[(table.metric == "phantom_mass") & table.layer.isna()]["value"].iloc[0]
    if variant in PHANTOM:
        assert phantom > 0.01
    else:
        assert phantom == 0.0
    assert ((table.metric == "sink_logit").any()) == (variant in PHANTOM)
    p0 = table[(table.metric == "p0_mass") & table["head"].notna()]
    assert len(p0) == 2 * 2 and p0.value.between(0, 1).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["source"]["kind"] == "checkpoint"
    assert manifest["model"]["config"]["variant"] == variant


def test_checkpoint_runs_carry_condition_columns_and_group_in_reports(tmp_path, text_file):
    """variant, seed, step and tier become columns; `report --group-by variant` averages per variant."""
    runs = []
    for variant, seed in [("baseline", 0), ("baseline", 1), ("sinklogit", 0)]:
        ckpt = _checkpoint(tmp_path / f"ckpt-{variant}-{seed}", variant)
        config = json.loads((ckpt / "config.json").read_text())
        config["seed"] = seed
        (ckpt / "config.json").write_text(json.dumps(config))
        out = tmp_path / f"run-{variant}-{seed}"
        result = CliRunner().invoke(app, ["sinks", str(ckpt), "--text-file", str(text_file), "--seq-len", "24",
                                          "--n-seqs", "4", "--seed", str(seed), "--out", str(out), "--no-progress",
                                          "--no-figures"])
        assert result.exit_code == 0, result.output
        table = pd.read_csv(out / "results.csv")
        assert list(table.columns) == ["probe", "metric", "layer", "head", "value", "n", "threshold", "variant", "seed",
                                       "step", "tier", "se"]
        assert set(table.variant) == {variant} and set(table.seed) == {seed} and set(table.tier) == {"test"}
        assert set(table.step) == {0}
        runs.append(out)
    from sinkscope.report.build import build_report, read_run
    from sinkscope.report.runs import group_runs

    grouped = group_runs([read_run(r) for r in runs], "variant")
    assert [g.label for g in grouped] == ["variant=baseline (mean of 2 runs)", "variant=sinklogit"]
    first, second = (pd.read_csv(r / "results.csv") for r in runs[:2])
    expected = (first["value"] + second["value"]) / 2
    np_mean = grouped[0].table["value"].to_numpy()
    assert np_mean == pytest.approx(expected.to_numpy(), rel=1e-8, abs=1e-12)  # CSV keeps 9 digits
    page = build_report(runs, out=tmp_path / "by-variant", group_by="variant")
    html = page.read_text()
    assert "variant=baseline (mean of 2 runs)" in html and "variant=sinklogit" in html
    result = CliRunner().invoke(app, ["report", *map(str, runs), "--group-by", "colour"])
    assert result.exit_code == 1 and "no condition 'colour'" in result.output
