"""Every recipe in recipes/ runs on a tiny model (the trigger recipe: tests/e2e/test_recipe_steps.py);
`sinkscope run` takes several recipes and names each run folder after its recipe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.store.results import is_run_folder
from repo_paths import REPO

PROBES = REPO / "recipes"
#: the small setting for the pretrained-model recipes
SMALL = ["seq_len=16", "n_seqs=2", "figures=false", "progress=false"]
#: every recipe, and the test that runs it
COVERED = {"sinks-smollm2.toml": "test_sinks_recipes_together_named_by_recipe",
           "sinks-smollm2-bos.toml": "test_sinks_recipes_together_named_by_recipe",
           "inject-smollm2.toml": "test_inject_recipe",
           "heads-trigger-lb.toml": "test_heads_trigger_recipe",
           "trigger-baseline-vs-sinklogit.toml": "test_recipe_steps.py::test_bundled_trigger_recipe_trains_probes_and_compares",
           "sweep-trigger.toml": "test_sweep_trigger_recipe",
           "sweep-text-tiny.toml": "test_sweep_text_recipe",
           "toy-superposition.toml": "test_toy_recipe",
           "gu-inputs.toml": "test_gu_inputs_recipe",
           "sink-audit.toml": "test_sink_audit_recipe",
           "streaming-pretraining.toml": "test_streaming_pretraining_recipe"}


def sets(items):
    return [a for item in items for a in ("--set", item)]


def test_every_recipe_is_covered():
    assert sorted(p.name for p in PROBES.glob("*.toml")) == sorted(COVERED)
    readme = (PROBES / "README.md").read_text()
    for name in COVERED:
        assert f"`{name}`" in readme


def test_sinks_recipes_together_named_by_recipe(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["run", str(PROBES / "sinks-smollm2.toml"), str(PROBES / "sinks-smollm2-bos.toml"),
                                      "--model", str(tiny_llama_dir), *sets([*SMALL, f"text_file={text_file}"])])
    assert result.exit_code == 0, result.output
    folders = [Path(line) for line in result.stdout.strip().splitlines()[-2:]]
    assert "-sinks-smollm2-" in folders[0].name and "-sinks-smollm2-bos-" in folders[1].name
    assert tiny_llama_dir.name in folders[0].name and folders[0].parent.name == "reports"
    for folder in folders:
        assert is_run_folder(tmp_path / folder)
    plain, bos = (np.load(tmp_path / f / "tokens.npy") for f in folders)
    assert plain.shape == bos.shape == (2, 16)
    assert not np.array_equal(plain[:, 0], bos[:, 0])  # the second prepends BOS
    table = pd.read_csv(tmp_path / folders[0] / "results.csv")
    assert {"p0_mass", "sink_rate", "value_norm_ratio"} <= set(table.metric)


def test_inject_recipe(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "inject"
    result = CliRunner().invoke(app, ["run", str(PROBES / "inject-smollm2.toml"), "--model", str(tiny_llama_dir),
                                      *sets([*SMALL, "eval_batch=2", f"text_file={text_file}", f"out={out}"])])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    assert {"structured", "same-context", "gaussian"} <= set(table["junk"].dropna())


@pytest.mark.slow  # trains
def test_heads_trigger_recipe(tmp_path):
    root = tmp_path / "heads"
    small = [f"vars.root={root}", "train.steps=4", "train.batch_size=8", "train.progress=false",
             "train.overrides=['n_layer=1', 'n_head=2', 'n_embd=16', 'block_size=12']",
             "train.task_options=['vocab=16']", "n_seqs=4", "heads.figures=false", "heads.progress=false"]
    result = CliRunner().invoke(app, ["run", str(PROBES / "heads-trigger-lb.toml"), *sets(small)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(root / "compare" / "report.html")
    for name in ("heads-baseline", "heads-lb"):
        assert is_run_folder(root / name)


@pytest.mark.slow  # trains
def test_sweep_trigger_recipe(tmp_path):
    out = tmp_path / "sweep"
    small = ["steps=4", "batch_size=8", "eval_windows=8", "task_options=['vocab=16']",
             "overrides=['n_layer=1', 'n_head=2', 'n_embd=16', 'block_size=12']", "n_seqs=4", "report=false",
             "variants=['baseline', 'sinklogit', 'normgate', 'sink+norm']", "seeds=[0, 1]", f"out={out}"]
    result = CliRunner().invoke(app, ["run", str(PROBES / "sweep-trigger.toml"), *sets(small)])
    assert result.exit_code == 0, result.output
    t2 = pd.read_csv(out / "table2.csv")
    assert list(t2.gate) == ["norm gate"] and (t2.n == 2).all()
    assert len(pd.read_csv(out / "losses.csv")) == 8


@pytest.mark.slow  # trains
def test_sweep_text_recipe(text_file, tmp_path):
    out = tmp_path / "sweep"
    small = ["steps=4", "batch_size=4", "eval_windows=4", f"text_file={text_file}", "tokenizer=bpe300",
             "windows=random", "overrides=['n_layer=1', 'n_head=2', 'n_embd=16', 'block_size=16']", "n_seqs=2",
             "report=false", "variants=['baseline', 'sinklogit']", "seeds=[0, 1]", f"out={out}"]
    result = CliRunner().invoke(app, ["run", str(PROBES / "sweep-text-tiny.toml"), *sets(small)])
    assert result.exit_code == 0, result.output
    losses = pd.read_csv(out / "losses.csv")
    assert len(losses) == 4 and losses.fingerprint.nunique() == 1
    t1 = pd.read_csv(out / "table1.csv")
    assert list(t1.variant) == ["sinklogit"] and t1.n.iloc[0] == 2


@pytest.mark.slow  # spawns Python (a process pool)
def test_toy_recipe(tmp_path):
    out = tmp_path / "toy"
    small = ["steps=3", "batch_size=8", "loads=[1, 2]", "seeds=[0]", "eval_seqs=16", "threads=1", f"out={out}"]
    result = CliRunner().invoke(app, ["run", str(PROBES / "toy-superposition.toml"), *sets(small)])
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(out / "toy.csv")) == 2 * 2 * 4 and (out / "toy.png").is_file()


@pytest.mark.slow  # three measuring runs and a comparison page: ~8 s
def test_gu_inputs_recipe(tiny_llama_dir, tmp_path):
    root = tmp_path / "gu"
    result = CliRunner().invoke(app, ["run", str(PROBES / "gu-inputs.toml"), "--model", str(tiny_llama_dir),
                                      *sets(["seq_len=16", "n_seqs=2", "sinks.figures=false", "progress=false",
                                             f"vars.root={root}"])])
    assert result.exit_code == 0, result.output
    assert (root / "compare" / "report.html").is_file()
    repeated = np.load(root / "repeated" / "tokens.npy")
    assert (repeated[:, 1:] == repeated[:, 1:2]).all()  # BOS (the tiny tokenizer adds none) then one id
    for name in ("text", "random", "repeated"):
        table = pd.read_csv(root / name / "results.csv")
        assert "sink_rate" in set(table.metric)


def test_sink_audit_recipe(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "audit"
    result = CliRunner().invoke(app, ["run", str(PROBES / "sink-audit.toml"), "--model", str(tiny_llama_dir),
                                      *sets([*SMALL, f"text_file={text_file}", f"out={out}"])])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    assert {"p0_mass", "sink_head_share"} <= set(table.metric) and (table[table.metric == "sink_rate"].first_query == 1).all()


@pytest.mark.slow  # trains three models
def test_streaming_pretraining_recipe(tmp_path):
    """Three trainer variants at a micro tier, each streamed with 0, 1, 2 and 4 kept tokens, one page."""
    import json

    root = tmp_path / "sp"
    small = ["train.tier=micro", "train.steps=5", "length=64", "n_seqs=3", "stream.figures=false", "progress=false",
             f"vars.root={root}"]
    result = CliRunner().invoke(app, ["run", str(PROBES / "streaming-pretraining.toml"), *sets(small)])
    assert result.exit_code == 0, result.output
    page = (root / "compare" / "report.html").read_text()
    for label in ("vanilla", "zero-sink softmax", "learnable sink token"):
        assert label in page
    for name in ("vanilla", "zero-sink", "sink-token"):
        run = root / f"stream-{name}"
        conditions = json.loads((run / "manifest.json").read_text())["probes"]["stream"]["options"]["conditions"]
        assert [c["label"] for c in conditions][:5] == ["full", "window 32 (original positions)",
                                                         "sinks 1+31 (original positions)",
                                                         "sinks 2+30 (original positions)",
                                                         "sinks 4+28 (original positions)"]
        nll = np.load(run / "stream_nll.npy")
        assert nll.shape == (9, 3, 63) and np.isfinite(nll).all()
    token = np.load(root / "stream-sink-token" / "stream_nll.npy")
    assert not np.allclose(token[1], token[2])  # window 32 evicts the learned token, sinks 1+31 keeps it
