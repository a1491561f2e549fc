"""The engines' options in one sentence (issue 60, items 1, 2 and 5), from the command line: a value that
would reach a batch script, a shell or a cluster's API with a control character in it, a number that is
not one, a Ray address that is malformed or where nothing answers. Each is one ``error:`` line, exit 1,
no traceback, nothing written, and Ray never started (nor imported).

The cases that import or start Ray or spawn processes are in test_engine_failures.py (slow); the Ray
address checks on a stand-in for Ray are in tests/unit/executors/test_executors_units.py.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sinkscope.cli import app

runner = CliRunner()


def _one_sentence(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def _heads(model, tmp_path, *extra: str):
    return runner.invoke(app, ["heads", str(model), "--seq-len", "16", "--n-seqs", "2", "--no-progress",
                               "--out", str(tmp_path / "run"), *extra])


@pytest.mark.parametrize("extra, words", [
    (("--ray-address", "garbage"), "--ray-address 'garbage' is not a Ray address; use auto, HOST:PORT"),
    (("--ray-address", "http://[::1"), "--ray-address 'http://[::1' is not a Ray address"),
    (("--ray-address", "127.0.0.1:99999"), "has the port 99999"),
    (("--ray-gpus-per-run", "nan"), "--ray-gpus-per-run must be a finite number, 0 or more (got nan)"),
    (("--slurm-partition", "gpu\n#SBATCH --wrap=id"), "--slurm-partition holds the control character '\\n'"),
])
def test_an_engine_option_that_cannot_be_used_is_one_sentence_before_anything(extra, words, tiny_llama_dir, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    sentence = _one_sentence(_heads(tiny_llama_dir, tmp_path, "--executor", "ray", *extra))
    assert words in sentence
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("value", ["slurm_comment=x\necho pwned", "slurm_comment=x\x1b[2J", "slurm_setup=echo pwned"])
def test_a_sweeps_slurm_value_that_would_bend_the_batch_script_is_one_sentence(value, tmp_path):
    out = tmp_path / "sw"
    result = runner.invoke(app, ["sweep", "--variants", "baseline", "--seeds", "0", "--launcher", "submitit",
                                 "--slurm", value, "--out", str(out)])
    sentence = _one_sentence(result)
    assert "--slurm" in sentence and ("control character" in sentence or "shell commands" in sentence)
    assert not out.exists()
