"""Runs that would be silently meaningless, and API inputs that gave tracebacks (issue 23).

Each case gets one sentence (a :class:`SinkscopeError`, exit 1 on the CLI) or, where the run
still means something, a warning.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import sinkscope
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from tiny_models import build

runner = CliRunner()


@pytest.fixture(scope="module")
def trigger_checkpoint(tmp_path_factory):
    """A trigger-task checkpoint stopped at step 2 of 4 (an interrupted training)."""
    from sinkscope.train.loop import train
    from sinkscope.train.config import TrainOptions

    out = tmp_path_factory.mktemp("trigger") / "ckpt"
    train(TrainOptions(task="trigger", tier="micro", steps=4, stop_at=2, batch_size=4, eval_windows=4,
                       overrides=["n_layer=1"], task_options=["vocab=16"], out=str(out), progress=False,
                       device="cpu"), log=lambda m: None)
    return out


def _error_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.output
    return errors[0]


@pytest.mark.slow  # trains
def test_english_text_on_a_trigger_checkpoint_is_refused(trigger_checkpoint, text_file, tmp_path):
    result = runner.invoke(app, ["sinks", str(trigger_checkpoint), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--no-figures", "--no-progress", "--out", str(tmp_path / "r")])
    line = _error_line(result)
    assert "unknown token" in line and "validation windows" in line
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # trains (its fixture)
def test_an_interrupted_checkpoint_is_measured_with_a_warning(trigger_checkpoint):
    messages = []
    result = sinkscope.measure("p0_mass", str(trigger_checkpoint), n_seqs=2, log=messages.append)
    assert len(result.table)
    assert any(m.startswith("warning:") and "step 2 of the 4" in m for m in messages), messages


def test_eviction_without_sliding_layers_writes_no_empty_table(tiny_llama_dir, text_file, tmp_path):
    result = runner.invoke(app, ["measure", str(tiny_llama_dir), "--probe", "eviction", "--text-file", str(text_file),
                                 "--seq-len", "16", "--n-seqs", "2", "--no-figures", "--no-progress",
                                 "--out", str(tmp_path / "r")])
    line = _error_line(result)
    assert "eviction" in line and ("sliding" in line or "no numbers" in line)
    assert not (tmp_path / "r").exists()


def test_an_overflowing_dose_is_refused_before_loading(tiny_llama_dir, text_file, tmp_path):
    result = runner.invoke(app, ["inject", str(tiny_llama_dir), "--doses", "1e30", "--text-file", str(text_file),
                                 "--seq-len", "16", "--n-seqs", "2", "--no-figures", "--out", str(tmp_path / "r")])
    assert "out of range" in _error_line(result)


def test_non_finite_numbers_are_written_with_a_warning():
    from sinkscope.run.write import _warn_non_finite

    messages = []
    table = pd.DataFrame({"probe": ["injection"] * 2, "metric": ["inject_loss"] * 2, "layer": [None, None],
                          "head": [None, None], "value": [1.0, float("nan")], "n": [4, 4], "dose": [0.2, 1e5]})
    _warn_non_finite(table, messages.append)
    assert len(messages) == 1 and "1 of the 2" in messages[0] and "dose 100000" in messages[0]
    _warn_non_finite(table.iloc[:1], messages.append)
    assert len(messages) == 1


@pytest.fixture(scope="module")
def llama():
    return build("llama")


@pytest.mark.parametrize("windows, phrase", [
    (np.array([[1.7, 2.2, 3.9]]), "integer token ids, not floats"),
    (np.zeros((0, 8), dtype=np.int64), "shape"),
    (np.array([1, 2, 3]), "shape"),
    (np.array([[1, -2, 3]]), "negative token id"),
    ([["a", "b", "c"]], "integer token ids"),
    ([[1, 2, 3], [4, 5]], "rectangular"),
    (np.array([[True, False]]), "integer token ids"),
])
def test_bad_windows_are_one_sentence(llama, windows, phrase):
    with pytest.raises(SinkscopeError, match=phrase):
        sinkscope.measure("p0_mass", llama, windows=windows)


def test_windows_as_nested_lists_and_tensors_work(llama):
    ids = [[1, 5, 9, 13], [2, 6, 10, 14]]
    from_list = sinkscope.measure("p0_mass", llama, windows=ids)
    from_tensor = sinkscope.measure("p0_mass", llama, windows=torch.tensor(ids))
    pd.testing.assert_frame_equal(from_list.table, from_tensor.table)
    assert from_list.tokens.tolist() == ids


def test_measure_leaves_the_model_in_the_mode_it_came_in(llama):
    llama.train()
    sinkscope.measure("p0_mass", llama, windows=[[1, 2, 3, 4]])
    assert llama.training
    llama.eval()
    sinkscope.measure("p0_mass", llama, windows=[[1, 2, 3, 4]])
    assert not llama.training


def test_api_messages_use_the_api_names(tiny_llama_dir, tmp_path):
    with pytest.raises(SinkscopeError) as caught:
        sinkscope.measure("sinks", str(tiny_llama_dir), seq_len=1)
    assert "seq_len" in str(caught.value) and "--seq-len" not in str(caught.value)
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(SinkscopeError) as caught:
        sinkscope.measure("sinks", str(tiny_llama_dir), out=str(out), n_seqs=1, seq_len=8)
    assert "--out" not in str(caught.value) and "out" in str(caught.value)


def test_a_recipe_that_is_not_utf8_is_one_sentence(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_bytes(b'command = "sinks"\n[options]\nmodel = "caf\xe9"\n')
    assert "not UTF-8" in _error_line(runner.invoke(app, ["run", str(recipe)]))


def test_a_recipe_inside_the_folder_it_replaces_is_refused(tmp_path, tiny_llama_dir):
    out = tmp_path / "run"
    out.mkdir()
    recipe = out / "r.toml"
    recipe.write_text(f'command = "sinks"\n[options]\nmodel = "{tiny_llama_dir}"\nout = "{out}"\noverwrite = true\n')
    line = _error_line(runner.invoke(app, ["run", str(recipe)]))
    assert "the recipe" in line and "lies inside" in line
    assert recipe.is_file()
