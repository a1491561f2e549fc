"""A trainer checkpoint is a first-class MODEL: `sinkscope sinks ckpt/` reads its native records."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from conftest import make_tokenizer
from sinkscope.cli import app
from sinkscope.sources import resolve_source
from sinkscope.train.checkpoint import save_checkpoint
from sinkscope.train.model import GPT, GPTConfig

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
