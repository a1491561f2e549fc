"""Plans run on Ray and on SLURM (issue 41): the same three plans under ``--executor local``, ``ray`` (a
local cluster of 2 CPUs, started here and shut down after) and ``slurm`` (submitit's local executor)
give byte-identical results.csv per model and one comparison page; a plan that raises fails alone, and
``--resume`` reruns only it.

Slow tier: the engines spawn Python (Ray's workers, submitit's processes).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from tiny_models import build

pytestmark = pytest.mark.slow

NAMES = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def three_models(tmp_path_factory, tokenizer) -> list[Path]:
    """Three tiny Llamas (different weights), each a save_pretrained folder with its tokenizer."""
    root = tmp_path_factory.mktemp("zoo")
    folders = []
    for seed, name in enumerate(NAMES):
        folder = root / name
        build("llama", seed=seed).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    return folders


def _heads(models, out: Path, text_file: Path, *extra: str):
    args = ["heads", *map(str, models), "--text-file", str(text_file), "--seq-len", "32", "--n-seqs", "4",
            "--batch-size", "2", "--no-progress", "--out", str(out), *extra]
    return CliRunner().invoke(app, args)


def _tables(out: Path) -> dict[str, bytes]:
    return {name: (out / name / "results.csv").read_bytes() for name in NAMES}


@pytest.fixture(scope="module")
def local_tables(three_models, text_file, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("local") / "cmp"
    result = _heads(three_models, out, text_file)
    assert result.exit_code == 0, result.output
    assert (out / "report.html").is_file()
    return _tables(out)


@pytest.fixture
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


def _same_as_local(out: Path, local_tables, result) -> None:
    assert result.exit_code == 0, result.output
    assert _tables(out) == local_tables  # byte-identical per model
    assert "sinkscope comparison of 3 runs" in (out / "report.html").read_text()
    for name in NAMES:  # each run's output went to its log
        assert f"sinkscope job {name}: finished" in (out / "engine" / "logs" / f"{name}.log").read_text()


def test_three_plans_on_ray_equal_the_local_runs(three_models, text_file, tmp_path, local_tables, ray_cluster):
    out = tmp_path / "cmp"
    _same_as_local(out, local_tables, _heads(three_models, out, text_file, "--executor", "ray"))


def test_three_plans_on_slurm_local_equal_the_local_runs(three_models, text_file, tmp_path, local_tables):
    pytest.importorskip("submitit")
    out = tmp_path / "cmp"
    result = _heads(three_models, out, text_file, "--executor", "slurm", "--slurm-cluster", "local")
    _same_as_local(out, local_tables, result)
    submissions = list((out / "engine" / "slurm").iterdir())  # submitit's own files: a folder of the submission's own
    assert len(submissions) == 1 and list(submissions[0].glob("*_submitted.pkl"))
    assert len(list(submissions[0].glob("outcome-*.json"))) == 3  # the outcomes came back as JSON


def test_three_plans_in_local_processes_equal_the_in_process_runs(three_models, text_file, tmp_path, local_tables):
    out = tmp_path / "cmp"
    _same_as_local(out, local_tables, _heads(three_models, out, text_file, "--jobs", "2"))


def _break(folder: Path) -> bytes:
    """Truncate the model's weights (a plan that raises when it loads); returns them, to mend it."""
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:100])
    return data


@pytest.mark.parametrize("executor_options", [(), ("--jobs", "2"), ("--executor", "ray"), ("--executor", "slurm", "--slurm-cluster", "local")],
                         ids=["in-process", "local-jobs", "ray", "slurm"])
def test_a_plan_that_raises_fails_alone_and_resume_reruns_only_it(executor_options, three_models, text_file, tmp_path,
                                                                 tokenizer, local_tables, request):
    if "ray" in executor_options:
        request.getfixturevalue("ray_cluster")
    if "slurm" in executor_options:
        pytest.importorskip("submitit")
    models = [tmp_path / "models" / name for name in NAMES]
    for source, target in zip(three_models, models):
        shutil.copytree(source, target)
    weights = _break(models[1])
    out = tmp_path / "cmp"
    result = _heads(models, out, text_file, *executor_options)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "1 of 3 runs failed (beta:" in result.output and "--resume" in result.output
    if executor_options:  # a job has a log, named in the sentence
        assert str(out / "engine" / "logs" / "beta.log") in result.output
    assert not (out / "beta").exists()  # nothing half-written
    kept = {name: (out / name / "results.csv").stat().st_mtime_ns for name in ("alpha", "gamma")}
    assert "sinkscope comparison of 2 runs" in (out / "report.html").read_text()  # the page of those that finished

    (models[1] / "model.safetensors").write_bytes(weights)
    result = _heads(models, out, text_file, *executor_options, "--resume")
    assert result.exit_code == 0, result.output
    assert {name: (out / name / "results.csv").stat().st_mtime_ns for name in ("alpha", "gamma")} == kept
    assert _tables(out) == local_tables
    assert "sinkscope comparison of 3 runs" in (out / "report.html").read_text()
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0  # `sinkscope report OUT` redraws it


def test_a_missing_extra_names_the_pip_command(three_models, text_file, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    result = _heads(three_models, tmp_path / "cmp", text_file, "--executor", "ray")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "pip install 'sinkscope[ray]'" in result.output
    assert not (tmp_path / "cmp").exists()


def test_the_api_runs_several_models_on_an_engine_and_reads_them_back(three_models, text_file, tmp_path, local_tables):
    import sinkscope

    out = tmp_path / "cmp"
    compared = sinkscope.measure("heads", three_models, text_file=str(text_file), seq_len=32, n_seqs=4, batch_size=2,
                                 out=str(out), jobs=2)
    assert compared.names == list(NAMES) and compared.path == out
    assert _tables(out) == local_tables and (out / "report.html").is_file()
    assert set(compared.table["run"]) == set(NAMES) and len(compared.results[0].tokens) == 4
    with pytest.raises(sinkscope.SinkscopeError, match="give out="):
        sinkscope.measure("heads", three_models, text_file=str(text_file), executor="slurm", slurm_cluster="local")
    with pytest.raises(sinkscope.SinkscopeError, match=r"jobs must be a positive integer \(got 0\)"):
        sinkscope.measure("heads", three_models, out=str(tmp_path / "x"), jobs=0)  # the API's own words


def test_a_recipes_measuring_steps_go_as_one_slurm_array(three_models, text_file, tmp_path, local_tables, monkeypatch):
    """`sinkscope run r.toml --executor slurm`: consecutive measuring steps are one batch, one array of
    every step's runs (the Pythia suite's 8 series: one array), each step finished after."""
    pytest.importorskip("submitit")
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    recipe = tmp_path / "suite.toml"
    steps = ""
    for k, model in enumerate((three_models[0], three_models[2])):
        steps += (f'[[steps]]\ncommand = "heads"\n[steps.options]\nmodel = "{model}"\ntext_file = "{text_file}"\n'
                  f'seq_len = 32\nn_seqs = 4\nbatch_size = 2\nprogress = false\nout = "{tmp_path / f"cmp{k}"}"\n\n')
    recipe.write_text(steps)
    args = ["run", str(recipe), "--executor", "slurm", "--slurm-cluster", "local"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cmp0" / "results.csv").read_bytes() == local_tables["alpha"]
    assert (tmp_path / "cmp1" / "results.csv").read_bytes() == local_tables["gamma"]
    batch = list((tmp_path / "cache" / "engine").glob("*-batch/slurm/*"))
    assert len(batch) == 1 and len(list(batch[0].glob("*_submitted.pkl"))) == 2  # one array of both runs
