"""``sinkscope sinks`` end to end through typer's CliRunner on a tiny saved model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from repo_paths import REPO

runner = CliRunner()


def _sinks(*args: str):
    return runner.invoke(app, ["sinks", *args, "--no-progress"])


def test_no_arguments_shows_help():
    result = runner.invoke(app, [])
    assert "sinks" in result.output and "Usage" in result.output


def test_sinks_help_has_examples():
    result = runner.invoke(app, ["sinks", "--help"])
    assert result.exit_code == 0
    assert "Examples" in result.output and "--bos" in result.output


def test_sinks_end_to_end_on_a_saved_model(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "32", "--n-seqs", "5",
                    "--batch-size", "2", "--seed", "3", "--sink-layer-start", "1", "--out", str(out))
    assert result.exit_code == 0, result.output
    for name in ["results.csv", "results.parquet", "manifest.json", "tokens.npy",
                 "figures/heatmap_p0_mass.png", "figures/heatmap_p0_mass.svg", "figures/layers_p0_mass.png"]:
        assert (out / name).is_file(), name

    table = pd.read_csv(out / "results.csv")
    assert list(table.columns) == ["probe", "metric", "layer", "head", "value", "n", "threshold", "layer_start", "se"]
    metrics = set(table.metric)
    assert table.loc[table.metric == "sink_rate_from_layer", "layer_start"].tolist() == [1]  # a column, not a name
    assert {"p0_mass", "sink_rate", "sink_rate_from_layer", "phantom_mass", "value_norm_ratio",
            "massive_activation"} <= metrics
    model_rows = table[table.layer.isna()]
    assert model_rows["head"].isna().all() and set(model_rows.metric) >= {"p0_mass", "sink_rate"}
    parquet = pd.read_parquet(out / "results.parquet")
    np.testing.assert_allclose(parquet["value"].to_numpy(), table["value"].to_numpy(), rtol=1e-8)

    tokens = np.load(out / "tokens.npy")
    assert tokens.dtype == np.int64 and tokens.shape == (5, 32)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["windows"]["seed"] == 3 and manifest["windows"]["bos_policy"] == "auto"
    assert manifest["windows"]["bos_id"] is None  # this tokenizer adds no BOS
    assert manifest["model"]["source"]["kind"] == "folder"
    assert manifest["model"]["source"]["location"] == str(tiny_llama_dir)  # the user's path, not rewritten
    assert manifest["corpus"]["kind"] == "text_file" and len(manifest["corpus"]["sha256"]) == 64
    assert manifest["versions"]["transformers"].startswith("5.")
    assert manifest["dtype"] == "float32" and manifest["device"] == "cpu"
    assert {k["kernel"] for k in manifest["kernels"]} == {"cpu_flash"}  # the fused kernel that ran, recorded

    # The same command again is refused (nothing is touched) ...
    before = (out / "results.csv").read_bytes()
    again = _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "32", "--n-seqs", "5",
                   "--out", str(out))
    assert again.exit_code == 1 and "already exists" in again.output
    assert (out / "results.csv").read_bytes() == before
    # ... and with --overwrite reproduces the same table byte for byte (same seed, CPU).
    again = _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "32", "--n-seqs", "5",
                   "--batch-size", "5", "--seed", "3", "--sink-layer-start", "1", "--out", str(out), "--overwrite",
                   "--no-figures")
    assert again.exit_code == 0, again.output
    rerun = pd.read_csv(out / "results.csv")
    np.testing.assert_allclose(rerun["value"].to_numpy(), table["value"].to_numpy(), rtol=1e-6, atol=1e-7)
    assert not (out / "figures").exists()
    assert not list(tmp_path.glob(".run*"))  # no staging folders left behind


def test_bos_add_prepends_the_bos_token(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "bos"
    result = _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16", "--n-seqs", "3",
                    "--bos", "add", "--out", str(out), "--no-figures")
    assert result.exit_code == 0, result.output
    tokens = np.load(out / "tokens.npy")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["windows"]["bos_id"] == 0 and (tokens[:, 0] == 0).all()
    assert (tokens[:, 1:] != 0).all()


@pytest.mark.parametrize(
    "args, phrase",
    [
        (["./no/such/model"], "no model file or folder"),
        (["missing.gguf"], "no GGUF file"),
        (["{model}", "--text-file", "{short}"], "enough for 0 windows"),
        (["{model}", "--text-file", "{missing}"], "no text file"),
        (["{model}", "--seq-len", "1"], "--seq-len must be at least 2"),
        (["{model}", "--bos", "sometimes"], "unknown --bos"),
        (["{model}", "--device", "cuda:0", "--text-file", "{text}"], "no CUDA GPU"),
    ],
)
def test_bad_input_is_one_sentence(args, phrase, tiny_llama_dir, text_file, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("three words only", encoding="utf-8")
    filled = [a.format(model=tiny_llama_dir, short=short, missing=tmp_path / "nope.txt", text=text_file)
              for a in args]
    result = _sinks(*filled, "--out", str(tmp_path / "out"))
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and phrase in lines[0], result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_ls_lists_probes_and_families():
    probes = runner.invoke(app, ["ls", "probes"])
    assert probes.exit_code == 0 and "p0_mass" in probes.output and "sink_rate_from_layer" in probes.output
    families = runner.invoke(app, ["ls", "families"])
    assert families.exit_code == 0 and "gpt_oss" in families.output and "qwen3_next" in families.output


def test_recipe_runs_with_overrides(tiny_llama_dir, text_file, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('command = "sinks"\n[options]\nseq_len = 16\nn_seqs = 2\nbos = "none"\nfigures = false\n')
    out = tmp_path / "recipe-run"
    result = runner.invoke(app, ["run", str(recipe), "--set", f"model={tiny_llama_dir}", "--set",
                                 f"text_file={text_file}", "--set", "n_seqs=3", "--set", f"out={out}",
                                 "--set", "progress=false"])
    assert result.exit_code == 0, result.output
    assert np.load(out / "tokens.npy").shape == (3, 16)
    bad = runner.invoke(app, ["run", str(recipe), "--set", "n_seq=3"])
    assert bad.exit_code == 1 and "unknown option 'n_seq'" in bad.output
    bad = runner.invoke(app, ["run", str(recipe), "--set", "n_seqs=many"])
    assert bad.exit_code == 1 and "must be int" in bad.output


def test_bundled_recipes_parse():

    from sinkscope.commands import discover
    from sinkscope.lab.recipes import load_steps

    known = {"train", "report", "sweep", "toy", *discover()}  # the trainer, the page, sweeps, the toy task, every measuring command
    for path in sorted((REPO / "recipes").glob("*.toml")):
        steps = load_steps(str(path))
        if path.name.startswith("sinks-"):
            assert [(command, options.seq_len) for command, options in steps] == [("sinks", 512)]
        else:  # multi-step recipes (tests/e2e/test_recipe_steps.py runs one)
            assert {command for command, _ in steps} <= known


@pytest.mark.slow  # trains
def test_train_then_probe_the_checkpoint(text_file, tmp_path):
    """`sinkscope train` writes a checkpoint that `sinkscope sinks` reads; --resume continues it."""
    ckpt = tmp_path / "ckpt"
    common = ["train", "--variant", "sinklogit", "--text-file", str(text_file), "--tokenizer", "bpe300",
              "--windows", "random",  # the sample text has no paragraph breaks for doc-start windows
              "--set", "n_layer=2", "--set", "n_head=2", "--set", "n_embd=32", "--set", "block_size=32",
              "--steps", "6", "--batch-size", "4", "--out", str(ckpt), "--no-progress"]
    result = runner.invoke(app, common + ["--stop-at", "3"])
    assert result.exit_code == 0, result.output
    assert json.loads((ckpt / "config.json").read_text())["step"] == 3
    result = runner.invoke(app, common + ["--resume"])
    assert result.exit_code == 0, result.output
    config = json.loads((ckpt / "config.json").read_text())
    assert config["step"] == 6 and config["variant"] == "sinklogit"
    log = pd.read_csv(ckpt / "log.csv")
    assert {"step", "train_loss", "val_loss"} <= set(log.columns)
    out = tmp_path / "probe"
    result = _sinks(str(ckpt), "--text-file", str(text_file), "--seq-len", "16", "--n-seqs", "3", "--out", str(out))
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    assert table[(table.metric == "phantom_mass") & table.layer.isna()]["value"].iloc[0] > 0
    bad = runner.invoke(app, ["train", "--variant", "sinklogits", "--out", str(tmp_path / "x"), "--no-progress"])
    assert bad.exit_code == 1 and "sinklogit" in bad.output
