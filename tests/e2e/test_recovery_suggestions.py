"""Every suggested next step works from the state it is suggested in (issue 61, item 7): Ctrl-C in
``train`` before and after the first checkpoint, a ``--resume`` of a folder that holds only a log, and
``--debug`` anywhere on the line. Each test follows the sentence's advice and checks it works.

The trainings are the trigger task on a one-layer model (a fraction of a second each, slow tier: they
train)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.cli.application import debug_first
from sinkscope.train.model import GPT

CLI = ["--task", "trigger", "--task-set", "vocab=16", "--set", "n_layer=1", "--set", "n_head=2", "--set", "n_embd=32",
       "--set", "block_size=16", "--batch-size", "4", "--warmup-steps", "1", "--eval-every", "2", "--no-progress"]


def invoke(args):
    return CliRunner().invoke(app, [str(a) for a in args])


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def stop_at_training_step(monkeypatch, n: int) -> None:
    """Ctrl-C at the ``n``-th training forward pass."""
    original, seen = GPT.forward, [0]

    def forward(self, idx, targets=None, **kw):
        if targets is not None and torch.is_grad_enabled():
            seen[0] += 1
            if seen[0] == n:
                raise KeyboardInterrupt
        return original(self, idx, targets, **kw)

    monkeypatch.setattr(GPT, "forward", forward)


def test_debug_is_taken_anywhere_before_a_double_dash():
    assert debug_first(["sinks", "m", "--debug"]) == ["--debug", "sinks", "m"]
    assert debug_first(["--debug", "sinks"]) == ["--debug", "sinks"]
    assert debug_first(["run", "r.toml", "--", "--debug"]) == ["run", "r.toml", "--", "--debug"]
    after = invoke(["sinks", "no/such-model-here", "--seq-len", "0", "--debug"])
    before = invoke(["--debug", "sinks", "no/such-model-here", "--seq-len", "0"])
    assert after.exit_code == before.exit_code == 1
    assert "rerun with --debug" not in after.stderr and after.stderr == before.stderr


def test_resume_of_a_folder_holding_only_a_log_says_to_start_again(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "log.csv").write_text("step,loss\n0,2.7\n")
    said = error_line(invoke(["train", *CLI, "--steps", "4", "--resume", "--out", out]))
    assert "nothing to resume" in said and "--overwrite" in said and "without --resume" in said


@pytest.mark.slow  # trains
def test_ctrl_c_before_the_first_checkpoint_then_its_advice(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    stop_at_training_step(monkeypatch, 2)
    result = invoke(["train", *CLI, "--steps", "4", "--checkpoint-every", "4", "--out", out])
    said = error_line(result)
    assert result.exit_code == 130
    assert "no checkpoint was written yet (the first was due at step 4)" in said and "--overwrite" in said, said
    assert "--resume" not in said  # there is nothing to resume: the loop the newcomer met
    monkeypatch.undo()
    again = invoke(["train", *CLI, "--steps", "4", "--checkpoint-every", "4", "--out", out, "--overwrite"])
    assert again.exit_code == 0, again.output


@pytest.mark.slow  # trains
def test_ctrl_c_after_a_checkpoint_then_resume(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    stop_at_training_step(monkeypatch, 4)
    said = error_line(invoke(["train", *CLI, "--steps", "6", "--checkpoint-every", "2", "--out", out]))
    assert "keeps the checkpoint of step 2" in said and "--resume" in said, said
    monkeypatch.undo()
    again = invoke(["train", *CLI, "--steps", "6", "--checkpoint-every", "2", "--out", out, "--resume"])
    assert again.exit_code == 0, again.output


def test_a_comparison_where_every_model_failed_leaves_nothing_in_the_way(tmp_path, tiny_llama_dir, text_file):
    broken = []
    for name in ("bad-a", "bad-b"):  # a config and no tokenizer: each run fails when its model loads
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text('{"model_type": "llama"}')
        broken.append(tmp_path / name)
    out = tmp_path / "cmp"
    said = error_line(invoke(["sinks", *broken, "--out", out, "--seq-len", "16", "--n-seqs", "2", "--no-progress"]))
    assert said.startswith("error: every run failed") and "--resume" not in said and "rerun the same command" in said
    assert not out.exists()  # the retry, with these models fixed or others, is not refused
    again = invoke(["sinks", tiny_llama_dir, "--text-file", text_file, "--out", out, "--seq-len", "16", "--n-seqs", "2",
                    "--no-progress", "--no-figures", "--explore-windows", "0"])
    assert again.exit_code == 0, again.output
