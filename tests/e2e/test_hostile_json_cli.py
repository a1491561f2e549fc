"""Files that are valid JSON but hostile (issue 38), through the commands: a config.json, a tokenizer's
file, a run's manifest.json or a folder's ``.sinkscope-files`` nested 200,000 levels deep is one
``error:`` sentence naming the file, exit 1, no traceback. In-process (CliRunner); the reader and
each module's use of it are in tests/unit/store/test_hostile_json.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.store.files import INVENTORY
from repo_paths import GOLDEN

runner = CliRunner()
DEEP = "[" * 200_000 + "]" * 200_000


def _refused(args: list[str], damaged: Path) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, RecursionError), result.output
    assert result.output.startswith("error: "), result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert str(damaged) in result.output, result.output
    return result.output.strip()


def _sinks(model: Path, text_file: Path, out: Path, *extra: str) -> list[str]:
    return ["sinks", str(model), "--text-file", str(text_file), "--out", str(out), "--seq-len", "16", "--n-seqs", "2",
            "--no-progress", "--no-figures", *extra]


@pytest.fixture
def model_copy(tiny_llama_dir, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_llama_dir, tmp_path / "model"))


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "tokenizer.json", "generation_config.json"])
def test_sinks_names_a_deep_model_file(model_copy, text_file, tmp_path, name):
    damaged = model_copy / name
    damaged.write_text(DEEP)
    line = _refused(_sinks(model_copy, text_file, tmp_path / "out"), damaged)
    assert line == f"error: the model's {name} at {damaged} is not valid JSON (nested too deeply); repair or replace it."
    assert not (tmp_path / "out").exists()


def test_ls_hooks_names_a_deep_config(model_copy):
    damaged = model_copy / "config.json"
    damaged.write_text(DEEP)
    assert "nested too deeply" in _refused(["ls", "hooks", str(model_copy)], damaged)


def test_ls_hooks_names_a_tokenizer_config_that_is_not_utf8(model_copy):
    damaged = model_copy / "tokenizer_config.json"
    damaged.write_bytes(b'{"model_max_length": "\xff"}')
    assert "is not UTF-8 text" in _refused(["ls", "hooks", str(model_copy)], damaged)


@pytest.mark.parametrize("name", ["manifest.json", INVENTORY])
def test_report_names_a_deep_run_file(tmp_path, name):
    run = Path(shutil.copytree(GOLDEN / "run_tiny_llama", tmp_path / "run"))
    damaged = run / name
    damaged.write_text(DEEP)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert "nested too deeply" in _refused(["report", str(run)], damaged)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_overwrite_onto_a_folder_whose_record_is_deep(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("metric,value\n")
    damaged = out / INVENTORY
    damaged.write_text(DEEP)
    line = _refused(_sinks(tiny_llama_dir, text_file, out, "--overwrite"), damaged)
    assert "sinkscope's record of its files" in line and "replaces none of them" in line
    assert sorted(p.name for p in out.iterdir()) == sorted(["results.csv", INVENTORY])  # nothing replaced
