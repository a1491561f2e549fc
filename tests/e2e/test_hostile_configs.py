"""Configs that would eat the machine, or whose sizes make no sense, are refused in one sentence
before anything is allocated (issue 38, class 2): a model folder's config.json and a trainer
checkpoint's, through ``sinks``, ``ls hooks`` and the other commands that load a model.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import make_tokenizer
from sinkscope.cli import app
from sinkscope.train.checkpoint import save_checkpoint
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT

runner = CliRunner()


def _edited(tiny_llama_dir: Path, tmp_path: Path, **fields) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _checkpoint(tmp_path: Path, **model_fields) -> Path:
    folder = tmp_path / "ckpt"
    tokenizer = make_tokenizer()
    model = GPT(GPTConfig(vocab_size=len(tokenizer), block_size=64, n_layer=1, n_head=2, n_embd=16))
    save_checkpoint(folder, model, None, step=0, train_state=None, tokenizer=tokenizer, meta={"tier": "test", "seed": 0})
    config = json.loads((folder / "config.json").read_text())
    config["model"].update(model_fields)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _refused(args: list[str], *words: str) -> str:
    start = time.perf_counter()
    result = runner.invoke(app, args)
    assert time.perf_counter() - start < 30  # refused, not attempted (the battery's run was still growing at 180 s)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [["sinks"], ["ls", "hooks"], ["heads"]])
def test_a_billion_layers_is_refused_before_anything_is_allocated(command, tiny_llama_dir, text_file, tmp_path):
    folder = _edited(tiny_llama_dir, tmp_path, num_hidden_layers=10 ** 9)
    extra = [] if command[0] == "ls" else ["--text-file", str(text_file), "--out", str(tmp_path / "run")]
    _refused([*command, str(folder), *extra], "num_hidden_layers = 1,000,000,000", "too big for this machine")
    assert not (tmp_path / "run").exists()


def test_a_trainer_checkpoint_with_a_billion_layers_is_refused(tmp_path, text_file):
    ckpt = _checkpoint(tmp_path, n_layer=10 ** 9)
    _refused(["sinks", str(ckpt), "--text-file", str(text_file), "--out", str(tmp_path / "run")],
             "n_layer = 1,000,000,000")


def test_a_huge_width_is_refused_too(tiny_llama_dir, text_file, tmp_path):
    folder = _edited(tiny_llama_dir, tmp_path, hidden_size=10 ** 8, intermediate_size=10 ** 8)
    _refused(["selectivity", str(folder), "--text-file", str(text_file), "--out", str(tmp_path / "run")],
             "too big for this machine")


@pytest.mark.parametrize("field,value", [("num_hidden_layers", 0), ("num_hidden_layers", -1), ("vocab_size", 0),
                                         ("hidden_size", -64), ("num_attention_heads", 0)])
def test_a_zero_or_negative_size_names_the_field_not_the_tokenizer(field, value, tiny_llama_dir, text_file, tmp_path):
    folder = _edited(tiny_llama_dir, tmp_path, **{field: value})
    sentence = _refused(["sinks", str(folder), "--text-file", str(text_file), "--out", str(tmp_path / "run")],
                        f"sets {field} = {value}")
    assert "tokenizer" not in sentence and "modules" not in sentence


def test_a_nan_size_in_a_checkpoint_names_the_field(tmp_path, text_file):
    ckpt = _checkpoint(tmp_path)
    text = (ckpt / "config.json").read_text().replace('"n_embd": 16', '"n_embd": NaN')
    (ckpt / "config.json").write_text(text)
    _refused(["sinks", str(ckpt), "--text-file", str(text_file), "--out", str(tmp_path / "run")], "n_embd")


def test_a_real_tiny_model_still_runs(tiny_llama_dir, text_file, tmp_path):
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--out", str(tmp_path / "run"), "--no-figures", "--no-progress"])
    assert result.exit_code == 0, result.output
