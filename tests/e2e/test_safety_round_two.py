"""The second hostile battery's remaining classes (issue 38): silently empty runs (7), the API's
inputs (8) and SIGTERM (9). Each case is one sentence and a non-zero exit, never a traceback.

Classes 1-6 have files of their own: test_recipe_code.py, test_hostile_configs.py,
unit/store/test_hostile_json.py, test_user_paths.py, integration/test_checkpoint_recovery.py and the
conformance tests in integration/test_conformance.py.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from typer.testing import CliRunner

import sinkscope
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from tiny_models import build, random_ids

runner = CliRunner()


def _one_sentence(result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


# ---- 7. no requested policy is dropped silently --------------------------------------------------------------


@pytest.mark.parametrize("args,words", [
    (["--policy", "h2o", "--cache", "1"], ["h2o", "--cache 2 or more"]),
    (["--policy", "window,h2o", "--cache", "1,16"], ["h2o", "--cache 2 or more"]),
    (["--policy", "sinks", "--cache", "2,16", "--sink-tokens", "4"], ["--sink-tokens 4", "a cache of 2"]),
])
def test_a_stream_policy_that_cannot_run_is_refused_before_loading(args, words, tiny_llama_dir, text_file, tmp_path):
    result = runner.invoke(app, ["stream", str(tiny_llama_dir), "--text-file", str(text_file), "--length", "32",
                                 "--n-seqs", "1", *args, "--out", str(tmp_path / "run")])
    sentence = _one_sentence(result)
    assert all(word in sentence for word in words), sentence
    assert not (tmp_path / "run").exists()


def test_the_stream_probe_by_name_refuses_too(tiny_llama_dir, text_file, tmp_path):
    """``measure --probe stream`` skips the command's check: the probe itself refuses an empty policy."""
    result = runner.invoke(app, ["measure", str(tiny_llama_dir), "--probe", "stream", "--param", "stream.policies=h2o",
                                 "--param", "stream.caches=1", "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "1", "--out", str(tmp_path / "run"), "--no-figures"])
    assert "h2o policy cannot read" in _one_sentence(result)


# ---- 8. the API's inputs ---------------------------------------------------------------------------------------


def test_a_model_on_the_meta_device_is_one_sentence():
    with torch.device("meta"):
        model = build("llama")
    with pytest.raises(SinkscopeError, match="meta device") as error:
        sinkscope.measure("sinks", model, windows=random_ids(1, 8).numpy())
    assert str(error.value).count(". ") == 0


@pytest.mark.parametrize("models", [[3, 4], {"a"}, ["a", torch.nn.Linear(2, 2)]])
def test_a_list_of_what_is_not_a_model_name_is_one_sentence(models):
    """Several models are compared by name (tests/integration/test_run/dispatch.py); anything else in a list
    where models go is one sentence, not a TypeError."""
    with pytest.raises(SinkscopeError, match="several models are compared by name"):
        sinkscope.measure("sinks", models)


def test_a_model_of_another_type_is_one_sentence():
    with pytest.raises(SinkscopeError, match="not a dict"):
        sinkscope.measure("sinks", {"model": "x"})


def test_a_path_object_is_a_model_name(tiny_llama_dir, text_file):
    result = sinkscope.measure("p0_mass", tiny_llama_dir, text_file=str(text_file), seq_len=16, n_seqs=2)
    assert (result.table["metric"] == "p0_mass").any()


# ---- 9. SIGTERM says the run was stopped and how to resume it --------------------------------------------------


def test_sigterm_during_a_run_keeps_the_progress_and_says_how_to_resume(tiny_llama_dir, text_file, tmp_path,
                                                                        monkeypatch):
    """The signal is sent to this process from inside the window loop (after the first window's progress
    is saved), as a scheduler would send it; the real-process variant is in test_scale_and_resume.py."""
    import sinkscope.forward.runner as runner_mod

    original = runner_mod.run_probes
    sent = {"n": 0}

    def run_probes(*args, on_batch_done=None, **kwargs):
        def done(*a, **k):
            result = on_batch_done(*a, **k) if on_batch_done else None
            sent["n"] += 1
            if sent["n"] == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return result
        return original(*args, on_batch_done=done, **kwargs)

    monkeypatch.setattr(runner_mod, "run_probes", run_probes)
    monkeypatch.setattr("sinkscope.run.measuring.run_probes", run_probes)
    out = tmp_path / "run"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "6", "--batch-size", "1", "--checkpoint-seconds", "0", "--out", str(out),
                                 "--no-figures", "--no-progress"])
    sentence = _one_sentence(result, code=143)
    assert sentence.startswith("error: stopped by SIGTERM;") and "--resume" in sentence
    assert signal.getsignal(signal.SIGTERM) is not None and not out.exists()
    resumed = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                  "--n-seqs", "6", "--batch-size", "1", "--out", str(out), "--resume", "--no-figures",
                                  "--no-progress"])
    assert resumed.exit_code == 0, resumed.output
    assert (out / "results.csv").is_file()


def test_the_sigterm_handler_is_put_back_after_a_command(tiny_llama_dir):
    before = signal.getsignal(signal.SIGTERM)
    runner.invoke(app, ["ls", "probes"])
    assert signal.getsignal(signal.SIGTERM) == before
