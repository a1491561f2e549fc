"""The lab commands' low cases of issue 60 in one sentence: a recipe whose command, vars or steps have the
wrong type, a key at a ``[[steps]]`` table's own level (once silently ignored), a variable that is not a
text; ``toy --batch-size 0`` (once a ZeroDivisionError in every training process). Each is refused
before anything runs: exit 1, one ``error:`` line, no traceback, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.lab.recipes import load_steps

runner = CliRunner()


def _one_sentence(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "unexpected" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("text, words", [
    ('command = ["sinks"]\n', "names the command ['sinks']; known: circuit"),
    ('vars = "x"\ncommand = "sinks"\n', "[vars] of the recipe r.toml must be a table"),
    ("steps = [1, 2]\n", "step 1 of the recipe r.toml is 1, not a table"),
    ('[[steps]]\ncommand = "sinks"\nseq_len = 16\n',
     "has the unknown key 'seq_len' (an option: put it under [steps.options]); a step holds command and options"),
    ('[[steps]]\ncommand = "sinks"\ncolour = "red"\n', "has the unknown key 'colour'; a step holds"),
    ('[vars]\nx = [1]\n[[steps]]\ncommand = "sinks"\n[steps.options]\nout = "{x}"\n',
     "uses {x}, whose value in [vars] is [1]; a variable stands in a text"),
])
def test_a_recipe_of_the_wrong_shape_is_one_sentence(text, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = Path("r.toml")
    recipe.write_text(text, encoding="utf-8")
    with pytest.raises(SinkscopeError) as caught:
        load_steps(str(recipe))
    assert words in str(caught.value)
    sentence = _one_sentence(runner.invoke(app, ["run", str(recipe)]))
    assert words in sentence
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("args, words", [
    (["--batch-size", "0"], "--batch-size must be a positive integer, not 0"),
    (["--steps", "0"], "must be positive"),
    (["--jobs", "0"], "--jobs must be a positive integer, not 0"),
])
def test_toy_counts_that_cannot_train_are_one_sentence(args, words, tmp_path):
    out = tmp_path / "toy"
    assert words in _one_sentence(runner.invoke(app, ["toy", *args, "--out", str(out)]))
    assert not out.exists()


def test_toy_rates_from_the_api_are_checked(tmp_path):
    from sinkscope.lab.toy import ToyOptions, run_toy

    for bad, words in (({"lr": float("nan")}, "lr must be a finite positive number"),
                       ({"p_relevant": 1.5}, "p_relevant must be a number in (0, 1]")):
        with pytest.raises(SinkscopeError) as caught:
            run_toy(ToyOptions(out=str(tmp_path / "toy"), **bad))
        assert words in caught.value.phrased("api")
    assert not (tmp_path / "toy").exists()
