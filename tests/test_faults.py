"""Bad input battery: every failure is one sentence, a non-zero exit, and nothing written is lost."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import make_tokenizer
from sinkscope.cli import app
from sinkscope.sources import default_gguf_path
from tiny_models import build

runner = CliRunner()


def _error_line(result) -> str:
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def _sinks(*args):
    return runner.invoke(app, ["sinks", *args, "--no-progress", "--no-figures", "--seq-len", "16", "--n-seqs", "2"])


@pytest.fixture
def existing_run(tiny_llama_dir, text_file, tmp_path) -> Path:
    """A finished run folder whose bytes must survive every failure below."""
    out = tmp_path / "existing"
    assert _sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(out)).exit_code == 0
    return out


def _snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_truncated_safetensors_is_one_sentence(tiny_llama_dir, text_file, tmp_path, existing_run):
    broken = Path(shutil.copytree(tiny_llama_dir, tmp_path / "truncated"))
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = _snapshot(existing_run)
    line = _error_line(_sinks(str(broken), "--text-file", str(text_file), "--out", str(existing_run), "--overwrite"))
    assert "could not load the model folder" in line
    assert _snapshot(existing_run) == before


def test_gguf_with_a_flipped_header_byte(tmp_path, text_file):
    broken = tmp_path / "broken.gguf"
    data = bytearray(default_gguf_path().read_bytes())
    data[0] ^= 0xFF  # the magic "GGUF" is no longer
    broken.write_bytes(bytes(data))
    line = _error_line(_sinks(str(broken), "--text-file", str(text_file), "--out", str(tmp_path / "out")))
    assert "could not read the GGUF file" in line
    assert not (tmp_path / "out").exists()


def test_model_with_a_nan_weight(tmp_path, text_file, existing_run):
    model = build("llama")
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[0, 0] = float("nan")
    folder = tmp_path / "nan-model"
    model.save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    before = _snapshot(existing_run)
    line = _error_line(_sinks(str(folder), "--text-file", str(text_file), "--out", str(existing_run), "--overwrite"))
    assert "non-finite" in line and "layer 0" in line
    assert _snapshot(existing_run) == before


def test_unknown_hub_id_offline(tmp_path, text_file, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    line = _error_line(_sinks("EleutherAI/pythia-1bb", "--text-file", str(text_file), "--out", str(tmp_path / "o")))
    assert "not available offline" in line


def test_unwritable_output_is_one_sentence(tiny_llama_dir, text_file, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(blocker / "run")))
    assert "could not write" in line or "not a folder" in line


def test_same_command_gives_byte_identical_tables(tiny_llama_dir, text_file, tmp_path):
    args = [str(tiny_llama_dir), "--text-file", str(text_file), "--seed", "7"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert _sinks(*args, "--out", str(a)).exit_code == 0
    assert _sinks(*args, "--out", str(b)).exit_code == 0
    assert (a / "results.csv").read_bytes() == (b / "results.csv").read_bytes()
    assert (a / "tokens.npy").read_bytes() == (b / "tokens.npy").read_bytes()


def test_remote_code_is_refused_without_the_flag(tmp_path, text_file):
    """A folder whose config asks for custom code is not executed unless --trust-remote-code."""
    import json

    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": {
        "AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}))
    (folder / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    make_tokenizer().save_pretrained(folder)
    result = _sinks(str(folder), "--text-file", str(text_file), "--out", str(tmp_path / "o"))
    line = _error_line(result)
    assert "remote code ran" not in result.output
    assert "trust-remote-code" in line or "cannot build" in line or "could not load" in line


def test_inputs_are_checked_before_the_model_loads(tiny_llama_dir, tmp_path, monkeypatch):
    """A too-short text or an impossible --seq-len fails before any weights are read."""
    import sinkscope.pipeline

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(sinkscope.pipeline, "load_model", no_loading)
    short = tmp_path / "short.txt"
    short.write_text("three words only", encoding="utf-8")
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(short), "--out", str(tmp_path / "a")))
    assert "enough for 0 windows" in line
    line = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(short), "--seq-len", "9999",
                               "--out", str(tmp_path / "b")])
    assert "exceeds the model's context of 512 tokens" in _error_line(line)


def test_a_full_disk_is_one_sentence_and_keeps_the_old_run(tiny_llama_dir, text_file, existing_run, monkeypatch):
    import errno

    import sinkscope.pipeline

    def disk_full(stage, *args, **kwargs):
        (Path(stage) / "results.csv").write_text("half a tab")  # a partial write inside the stage ...
        raise OSError(errno.ENOSPC, "No space left on device", str(Path(stage) / "results.parquet"))

    monkeypatch.setattr(sinkscope.pipeline, "write_tables", disk_full)
    before = _snapshot(existing_run)
    line = _error_line(_sinks(str(tiny_llama_dir), "--text-file", str(text_file), "--out", str(existing_run),
                              "--overwrite"))
    assert "No space left on device" in line and "unchanged" in line
    assert _snapshot(existing_run) == before  # ... never reaches the run folder
    assert not list(existing_run.parent.glob(".existing.partial-*"))
