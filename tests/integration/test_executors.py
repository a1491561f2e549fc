"""Plans run by executors.execute: one plan alone through the pipeline, several as one comparison
(src/sinkscope/run/dispatch.py, run/comparison.py, run/result.py), and the API's several models.

The reference for each run of a comparison is the same model measured alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

import sinkscope
from sinkscope.run.comparison import SERIES_TABLE, execute_several, run_comparison
from sinkscope.commands import get_command
from sinkscope.run.dispatch import execute, written_path
from sinkscope.run.plan import plan
from sinkscope.run.result import ComparisonResult, Result

OPTIONS = {"seq_len": 24, "n_seqs": 3, "progress": False, "device": "cpu"}


def _two_models(tiny_llama_dir, tmp_path):
    other = tmp_path / "llama-copy"
    shutil.copytree(tiny_llama_dir, other)
    return [str(tiny_llama_dir), str(other)]


def test_one_plan_runs_in_memory_as_the_pipeline_does(tiny_llama_dir, text_file):
    plans = plan("sinks", {**OPTIONS, "model": str(tiny_llama_dir), "text_file": str(text_file)}, write=False)
    result = execute(plans, write=False, log=lambda _m: None)
    assert isinstance(result, Result) and result.path is None and written_path(result) is None
    assert result.manifest["plan"]["source"]["location"] == str(tiny_llama_dir)  # the manifest keeps the plan
    again = sinkscope.measure("sinks", str(tiny_llama_dir), text_file=str(text_file), **OPTIONS)
    pd.testing.assert_frame_equal(result.table, again.table)


def test_several_plans_write_their_runs_and_one_page(tiny_llama_dir, text_file, tmp_path):
    models = _two_models(tiny_llama_dir, tmp_path)
    out = tmp_path / "cmp"
    plans = plan("sinks", {**OPTIONS, "text_file": str(text_file), "out": str(out), "figures": False},
                 models=models)
    folder = run_comparison(plans, log=lambda _m: None)
    assert folder == out
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(Path(p.options.out).name for p in plans)
    assert json.loads((out / ".sinkscope-files").read_text())["writer"] == "comparison"
    alone = sinkscope.measure("sinks", models[0], text_file=str(text_file), **OPTIONS).table
    first = pd.read_csv(Path(plans[0].options.out) / "results.csv")
    pd.testing.assert_series_equal(first["value"], alone["value"], check_names=False, rtol=1e-9)


def test_execute_several_is_plan_then_run(tiny_llama_dir, text_file, tmp_path):
    models = _two_models(tiny_llama_dir, tmp_path)
    command = get_command("heads")
    options = command.options(**OPTIONS, text_file=str(text_file), out=str(tmp_path / "cmp"), figures=False)
    assert execute_several(command, options, models, log=lambda _m: None) == tmp_path / "cmp"
    assert not (tmp_path / "cmp" / f"{SERIES_TABLE}.csv").exists()  # several models, not a series


def test_the_api_compares_several_models(tiny_llama_dir, text_file, tmp_path):
    models = _two_models(tiny_llama_dir, tmp_path)
    outcome = sinkscope.measure("p0_mass", models, text_file=str(text_file), **OPTIONS)
    assert isinstance(outcome, ComparisonResult) and len(outcome.results) == 2
    table = outcome.table
    assert list(table["run"].unique()) == outcome.labels and len(table) == 2 * len(outcome.results[0].table)
    page = outcome.report(tmp_path / "page")
    assert page == tmp_path / "page" / "report.html" and page.is_file()
    assert all((tmp_path / "page" / name / "results.csv").is_file() for name in outcome.names)

