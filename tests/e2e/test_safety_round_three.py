"""The third hostile battery (issue 60): sizes that allocate, values at the boundary, the API's inputs,
damaged tables and the last line of defence. Each case is one sentence and a non-zero exit (a
``SinkscopeError`` in the API), never a traceback, and nothing is written that was not asked for.

The engines' cases (recipes that pick an executor, planted pickles, a killed worker, Ray) and the
memory cases (text files, the explorer, npy/npz headers, unbounded lengths) have files of their own.
"""

from __future__ import annotations

import json
import math
import shutil
import sys

import pytest
import torch
from typer.testing import CliRunner

import sinkscope
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from checkpoints import trainer_checkpoint
from tiny_models import random_ids

runner = CliRunner()


def _one_sentence(result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def _edited(source, folder, section=None, **changes):
    """A copy of the model folder ``source`` with its config.json (or its ``section``) changed."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    (config[section] if section else config).update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _sinks(model, text_file, out, *extra):
    return runner.invoke(app, ["sinks", str(model), "--text-file", str(text_file), "--seq-len", "16", "--n-seqs", "1",
                               "--out", str(out), "--no-figures", "--no-progress", *extra])


# ---- a small checkpoint whose config.json describes a huge model ---------------------------------------------


@pytest.fixture
def checkpoint(tmp_path, tokenizer):
    return trainer_checkpoint(tmp_path / "ckpt", "baseline", tokenizer)


@pytest.mark.parametrize("field,value", [("block_size", 10 ** 7), ("vocab_size", 10 ** 7), ("n_layer", 40)])
def test_a_checkpoint_whose_config_disagrees_with_its_weights_is_refused_before_allocating(
        checkpoint, text_file, tmp_path, field, value):
    """The shapes come from the model built on the meta device against model.safetensors' header: a 1 MB
    checkpoint whose block_size says 10**7 no longer allocates a (10**7, C) position table first."""
    edited = _edited(checkpoint, tmp_path / "edited", "model", **{field: value})
    sentence = _one_sentence(_sinks(edited, text_file, tmp_path / "run"))
    assert f"{field} = {value:,} asks for" in sentence and "model.safetensors" in sentence, sentence
    assert not (tmp_path / "run").exists()
    resumed = runner.invoke(app, ["train", "--resume", "--out", str(edited), "--no-progress"])
    assert f"{field} = {value:,} asks for" in _one_sentence(resumed)


def test_the_weight_check_passes_every_variant_and_its_tied_head(tmp_path, tokenizer):
    from sinkscope.models.checkpoint_folder import model_config, read_config
    from sinkscope.train.checkpoint import check_weights_fit_config, load_checkpoint

    for variant in ("baseline", "sinktoken", "sinklogit", "normgate"):
        folder = trainer_checkpoint(tmp_path / variant, variant, tokenizer)
        config = model_config(read_config(folder), folder)
        need = check_weights_fit_config(folder, config)
        model = load_checkpoint(folder)[0]
        assert need == 4 * sum(p.numel() for p in model.parameters())


# ---- a transformers config that names its field at fault --------------------------------------------------------


@pytest.mark.parametrize("changes,words", [
    ({"head_dim": 10 ** 9}, "(head_dim = 1,000,000,000:"),
    ({"layer_types": ["full_attention"] * 200_000}, "layer_types with 200,000 entries but num_hidden_layers"),
    ({"rms_norm_eps": math.nan}, "sets rms_norm_eps = nan; a model's settings must be finite"),
    ({"layer_types": ["no_such_attention"] * 3}, "is not a valid model config"),
])
def test_a_config_that_cannot_build_names_its_field(tiny_llama_dir, text_file, tmp_path, changes, words):
    n = json.loads((tiny_llama_dir / "config.json").read_text())["num_hidden_layers"]
    if "layer_types" in changes and len(changes["layer_types"]) == 3:
        changes = {"layer_types": ["no_such_attention"] * n}
    edited = _edited(tiny_llama_dir, tmp_path / "edited", **changes)
    sentence = _one_sentence(_sinks(edited, text_file, tmp_path / "run"))
    assert words in sentence and "tokenizer" not in sentence, sentence
    assert not (tmp_path / "run").exists()


# ---- values at the boundary: CLI, recipes and the API alike -------------------------------------------------------


@pytest.mark.parametrize("args,words", [
    (["--protect", "top-p0:²"], "--protect takes top-p0:N"),
    (["--protect", "top-p0:1000"], "--protect top-p0:1000 keeps every key of a cache of 16"),
    (["--protect-sinks", "1000"], "--protect-sinks 1000 keeps every key of a cache of 16"),
    (["--explore-max-mb", "inf"], "--explore-max-mb must be a finite number"),
    (["--explore-max-mb", "nan"], "--explore-max-mb must be a finite number"),
])
def test_stream_values_that_quantise_nothing_or_are_not_numbers(tiny_llama_dir, text_file, tmp_path, args, words):
    quantise = [] if args[0].startswith("--explore") else ["--kv-bits", "2"]
    result = runner.invoke(app, ["stream", str(tiny_llama_dir), "--text-file", str(text_file), "--length", "32",
                                 "--cache", "16", "--policy", "window", *quantise, *args, "--out", str(tmp_path / "run")])
    assert words in _one_sentence(result)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("options,words", [
    ({"n_seqs": "4"}, "n_seqs must be an integer (got '4')"),
    ({"seq_len": 16, "explore_max_mb": math.inf}, "explore_max_mb must be a finite number"),
    ({"checkpoint_seconds": math.nan}, "checkpoint_seconds must be a finite number"),
    ({"figures": "no"}, "figures must be true or false"),
    ({"batch_size": 2.5}, "batch_size must be an integer"),
])
def test_the_api_checks_every_number_and_names_it_in_its_own_words(options, words):
    with pytest.raises(SinkscopeError) as error:
        sinkscope.measure("sinks", windows=random_ids(1, 8).numpy(), **options)
    assert words in str(error.value) and "--" not in str(error.value)


def test_numpy_numbers_are_numbers():
    import numpy as np

    from sinkscope.commands.sinks import SinksOptions

    options = SinksOptions(n_seqs=np.int64(3), checkpoint_seconds=np.float32(2.0))
    assert type(options.n_seqs) is int and type(options.checkpoint_seconds) is float
    json.dumps(options.__dict__)


def test_a_recipe_with_an_infinite_number_is_one_sentence(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('command = "sinks"\n[options]\nexplore_max_mb = inf\n')
    result = runner.invoke(app, ["run", str(recipe)])
    assert "--explore-max-mb must be a finite number (got inf)" in _one_sentence(result)


# ---- the API's inputs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("what,model,words", [
    ("sinks", torch.nn.Module(), "the Module given as model= has no weights"),
    (123, None, "what= takes a command name"),
    (None, None, "what= takes a command name"),
    (["p0_mass", 3], None, "what= takes a command name"),
    ("sinks", [], "model= is an empty list"),
    ("sinks", (), "model= is an empty list"),
])
def test_what_is_not_a_measurement_or_a_model_is_one_sentence(what, model, words):
    with pytest.raises(SinkscopeError, match=words):
        sinkscope.measure(what, model, windows=random_ids(1, 8).numpy())


# ---- damaged tables, comparison folders, the conformance matrix ---------------------------------------------------


LOG = "step,train_loss,val_loss\n0,5.0,5.1\n10,4.0,4.2\n"


def test_a_garbage_row_in_a_checkpoints_monitor_table_is_one_sentence(checkpoint, tmp_path):
    (checkpoint / "log.csv").write_text(LOG)
    (checkpoint / "monitor.csv").write_text("step,probe,metric,layer,head,value,n,se\n"
                                            "0,p0_mass,p0_mass,0,0,0.5,2,0.1\n\x00garbage,,,,\n")
    result = runner.invoke(app, ["report", str(checkpoint), "--out", str(tmp_path / "page")])
    sentence = _one_sentence(result)
    assert "holds a row that is not a measurement (line 3" in sentence and "\x00" not in sentence
    assert not (tmp_path / "page").exists()
    (checkpoint / "monitor.csv").unlink()
    (checkpoint / "log.csv").write_text(LOG + "oops,x,\n")
    result = runner.invoke(app, ["report", str(checkpoint), "--out", str(tmp_path / "page")])
    assert "holds a row that is not a training step (line 4)" in _one_sentence(result)
    (checkpoint / "log.csv").write_text(LOG)
    assert runner.invoke(app, ["report", str(checkpoint), "--out", str(tmp_path / "page")]).exit_code == 0


def test_report_of_a_comparison_folder_into_another_folder(tiny_llama_dir, text_file, tmp_path):
    other = _edited(tiny_llama_dir, tmp_path / "other", max_position_embeddings=1024)
    compared = runner.invoke(app, ["heads", str(tiny_llama_dir), str(other), "--text-file", str(text_file),
                                   "--seq-len", "16", "--n-seqs", "2", "--out", str(tmp_path / "cmp"), "--no-figures",
                                   "--no-progress"])
    assert compared.exit_code == 0, compared.output
    result = runner.invoke(app, ["report", str(tmp_path / "cmp"), "--out", str(tmp_path / "page")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "page" / "report.html").is_file()
    again = runner.invoke(app, ["report", str(tmp_path / "cmp"), "--out", str(tmp_path / "page")])
    assert "--overwrite" in _one_sentence(again)


def test_a_conformance_matrix_that_would_check_nothing_fails(tmp_path, capsys):
    from sinkscope.conformance.matrix import main

    assert main(["--types", "bert", "--no-commands", "--out", str(tmp_path / "matrix")]) == 1
    err = capsys.readouterr().err
    assert "nothing would be checked" in err and "Traceback" not in err
    assert not (tmp_path / "matrix").exists()


def test_a_connection_error_is_not_called_a_disk_failure(monkeypatch, tiny_llama_dir, text_file, tmp_path):
    import sinkscope.run.dispatch as executors

    def refuse(*args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(executors, "execute", refuse)
    monkeypatch.setattr("sinkscope.cli.measuring_commands.execute", refuse, raising=False)
    sentence = _one_sentence(_sinks(tiny_llama_dir, text_file, tmp_path / "run"))
    assert "could not write or read" not in sentence and "ConnectionRefusedError" in sentence and "--debug" in sentence


# ---- SinkMonitor's arguments ---------------------------------------------------------------------------------------

WINDOWS = [[1, 2, 3, 4], [5, 6, 7, 8]]


@pytest.mark.parametrize("arguments,words", [
    ({"every": 1.5}, "every= must be a whole number"), ({"every": "10"}, "every= must be a whole number"),
    ({"every": None}, "every= must be a whole number"), ({"every": math.nan}, "every= must be a whole number"),
    ({"every": True}, "every= must be a whole number"), ({"batch_size": 0}, "batch_size= must be a whole number"),
    ({"batch_size": None}, "batch_size= must be a whole number"), ({"probes": None}, "probes= takes probe names"),
    ({"probes": [1]}, "probes= takes probe names"), ({"probes": []}, "probes= takes probe names"),
    ({"windows": "abc"}, "must hold whole token ids"), ({"windows": [[1.5, 2.5]]}, "must hold whole token ids"),
    ({"windows": [[-1, 2, 3]]}, "negative token id"), ({"windows": [[1, 2], [3]]}, "ragged"),
    ({"out": 123}, "out= takes a folder path"), ({"out": ""}, "out= takes a folder path"),
    ({"out": "/proc/no/such/place"}, "could not create the monitor's folder"),
])
def test_a_bad_monitor_argument_is_one_sentence(arguments, words, tmp_path, monkeypatch):
    from sinkscope.train.monitor import SinkMonitor

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SinkscopeError, match=words):
        SinkMonitor(**{"windows": WINDOWS, **arguments})
    assert list(tmp_path.iterdir()) == []  # out="" no longer writes into the working folder


def test_a_probe_name_given_as_a_string_is_one_probe():
    from sinkscope.train.monitor import SinkMonitor

    assert SinkMonitor("p0_mass", windows=WINDOWS).probes == ("p0_mass",)


def test_result_save_refuses_what_the_command_line_refuses(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    result = sinkscope.measure("p0_mass", tiny_llama_dir, text_file=str(text_file), seq_len=16, n_seqs=2)
    before = sorted(p.name for p in tiny_llama_dir.iterdir())
    with pytest.raises(SinkscopeError, match="lies inside the model"):
        result.save(tiny_llama_dir / "run")
    assert sorted(p.name for p in tiny_llama_dir.iterdir()) == before
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SinkscopeError, match="is the current folder or one above it"):
        result.save(".")
    assert result.save(tmp_path / "run") == tmp_path / "run"
