"""Recipes with several steps (src/sinkscope/lab/recipes.py): train, probe and compare in one command."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.lab.recipes import load_recipe, load_steps
from repo_paths import REPO

BUNDLED = REPO / "recipes" / "trigger-baseline-vs-sinklogit.toml"
#: A tiny version of the bundled recipe: 1 layer x 2 heads x 16, vocabulary 16, 4 steps.
SMALL = ["vars.root={root}", "train.steps=4", "train.batch_size=8", "train.progress=false",
         "train.overrides=['n_layer=1', 'n_head=2', 'n_embd=16', 'block_size=12']",
         "train.task_options=['vocab=16']", "n_seqs=4", "sinks.figures=false", "sinks.progress=false"]


@pytest.mark.slow  # trains
def test_bundled_trigger_recipe_trains_probes_and_compares(tmp_path):
    root = tmp_path / "trigger"
    overrides = [item.format(root=root) for item in SMALL]
    steps = load_steps(str(BUNDLED), overrides)
    assert [c for c, _ in steps] == ["train", "train", "sinks", "sinks", "report"]
    assert steps[1][1].variant == "sinklogit" and steps[1][1].out == f"{root}/ckpt-sinklogit"
    assert steps[3][1].text_file == f"{root}/ckpt-sinklogit/validation.txt" and steps[3][1].n_seqs == 4
    result = CliRunner().invoke(app, ["run", str(BUNDLED), *[a for o in overrides for a in ("--set", o)]])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(root / "compare" / "report.html")
    for variant in ("baseline", "sinklogit"):
        meta = json.loads((root / f"ckpt-{variant}" / "config.json").read_text())
        assert (meta["task"], meta["variant"], meta["step"], meta["model"]["n_layer"]) == ("trigger", variant, 4, 1)
        assert np.load(root / f"sinks-{variant}" / "tokens.npy").shape == (4, 12)
    table = pd.read_csv(root / "sinks-sinklogit" / "results.csv")
    assert table[(table.metric == "phantom_mass") & table.layer.isna()]["value"].iloc[0] > 0
    assert (root / "compare" / "figures" / "overlay_p0_mass.png").is_file()
    assert (root / "compare" / "figures" / "training_loss.png").is_file()


@pytest.mark.slow  # trains
def test_train_then_sinks_steps_run_in_order(tmp_path):
    """A two-step recipe: the sinks step reads the checkpoint the train step just wrote."""
    recipe = tmp_path / "r.toml"
    recipe.write_text(
        '[vars]\nroot = "x"\n'
        '[[steps]]\ncommand = "train"\n[steps.options]\ntask = "trigger"\nout = "{root}/ckpt"\nsteps = 3\n'
        'batch_size = 4\nprogress = false\ntask_options = ["vocab=12"]\n'
        'overrides = ["n_layer=1", "n_head=2", "n_embd=16", "block_size=10"]\n'
        '[[steps]]\ncommand = "sinks"\n[steps.options]\nmodel = "{root}/ckpt"\n'
        'text_file = "{root}/ckpt/validation.txt"\nbos = "none"\nn_seqs = 3\nfigures = false\nprogress = false\n'
        'out = "{root}/run"\n')
    root = tmp_path / "runs"
    result = CliRunner().invoke(app, ["run", str(recipe), "--set", f"vars.root={root}"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(root / "run")
    assert json.loads((root / "ckpt" / "config.json").read_text())["step"] == 3
    tokens = np.load(root / "run" / "tokens.npy")
    assert tokens.shape == (3, 10) and np.all(tokens[:, 0] == 0)


def test_step_overrides_and_variables_fail_in_one_sentence(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[vars]\nroot = "runs"\n[[steps]]\ncommand = "train"\n[steps.options]\nout = "{root}/a"\n'
                      '[[steps]]\ncommand = "sinks"\n[steps.options]\nmodel = "{root}/a"\n')
    steps = load_steps(str(recipe), ["vars.root=elsewhere", "seed=3"])  # seed: every step that has it
    assert steps[0][1].out == "elsewhere/a" and steps[1][1].model == "elsewhere/a"
    assert steps[0][1].seed == 3 and steps[1][1].seed == 3
    assert load_steps(str(recipe), ["sinks.seed=5"])[0][1].seed is None  # scoped to the sinks step
    with pytest.raises(SinkscopeError, match="no step of the recipe has the option 'n_seq'"):
        load_steps(str(recipe), ["n_seq=3"])
    with pytest.raises(SinkscopeError, match="the recipe has no report step"):
        load_steps(str(recipe), ["report.out=x"])
    with pytest.raises(SinkscopeError, match="'trian' is not a command or vars"):
        load_steps(str(recipe), ["trian.steps=3"])
    with pytest.raises(SinkscopeError, match="has 2 steps; load it with load_steps"):
        load_recipe(str(recipe))
    recipe.write_text('[[steps]]\ncommand = "sinks"\n[steps.options]\nmodel = "{nowhere}/a"\n')
    with pytest.raises(SinkscopeError, match="step 1 \\(sinks\\) uses \\{nowhere\\}, which \\[vars\\] does not define"):
        load_steps(str(recipe))
    recipe.write_text('[[steps]]\ncommand = "fit"\n')
    with pytest.raises(SinkscopeError, match="step 1 of the recipe .* names the command 'fit'; known: circuit, explore, heads, inject, measure, report, selectivity, sinks, stream, sweep, toy, train"):
        load_steps(str(recipe))
    recipe.write_text('[[steps]]\ncommand = "report"\n[steps.options]\nruns = "a"\n')
    with pytest.raises(SinkscopeError, match="'runs' must be a list of strings"):
        load_steps(str(recipe))
