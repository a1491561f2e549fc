"""A failing run fails alone, nothing found on disk is unpickled, and Ray is said in one sentence (issue
60, items 2 to 5), on the real engines: spawned local processes, submitit's local executor and a local
Ray cluster.

- ``--jobs 2``: a worker killed with SIGKILL (as the out-of-memory killer does) costs only its own run;
  ``--resume`` then reruns only that one.
- ``--executor slurm``: a ``<job id>_0_result.pkl`` planted where submitit would read a task's result
  is never loaded (its unpickling would write a marker file); the task is lost in one sentence.
- ``--executor ray``: ``auto`` with no cluster says so; SIGTERM ends the command as it does without
  Ray (exit 143, the same sentence).

Slow tier: every case spawns Python (the engines' processes, the CLI in a subprocess).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine_jobs import kill_myself, square
from repo_paths import REPO
from sinkscope.cli import app
from sinkscope.executors.jobs import Job
from sinkscope.executors.settings import ExecutorOptions
from sinkscope.executors.run import run_jobs
from tiny_models import build

pytestmark = pytest.mark.slow

runner = CliRunner()
NAMES = ("alpha", "beta", "gamma")
SRC = str(REPO / "src")


def _one_sentence(output: str, code: int, expected: int = 1) -> str:
    assert code == expected, output
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    return lines[0]


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


# ---- 4. a failing run fails alone ------------------------------------------------------------------------


def test_a_killed_local_process_costs_only_its_own_job(tmp_path):
    jobs = [Job(f"run{k}", str(tmp_path / "logs" / f"run{k}.log"), f, (k,))
            for k, f in enumerate((square, kill_myself, square))]
    said = []
    outcomes = run_jobs(jobs, ExecutorOptions(jobs=2), tmp_path, log=said.append, show_progress=False)
    assert [o.ok for o in outcomes] == [True, False, True] and [outcomes[0].value, outcomes[2].value] == [0, 4]
    assert outcomes[1].sentence.startswith("its process ended without a result (killed by SIGKILL")
    assert said == [outcomes[1].failure()]


def _killer_model(source: Path, target: Path, test_pid: int) -> Path:
    """A copy of ``source`` whose remote code kills the process that imports it (never this test's)."""
    shutil.copytree(source, target)
    (target / "modeling_killer.py").write_text(
        "import os, signal\n"
        f"if os.getpid() != {test_pid}:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "from transformers import LlamaForCausalLM as KillerModel\n")
    config = json.loads((target / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_killer.KillerModel"}
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_with_jobs_2_a_killed_run_fails_alone_and_resume_reruns_only_it(three_models, text_file, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    models = [tmp_path / "models" / "alpha", tmp_path / "models" / "beta", tmp_path / "models" / "gamma"]
    shutil.copytree(three_models[0], models[0])
    _killer_model(three_models[1], models[1], os.getpid())
    shutil.copytree(three_models[2], models[2])
    out = tmp_path / "cmp"
    args = ["heads", *map(str, models), "--text-file", str(text_file), "--seq-len", "32", "--n-seqs", "4",
            "--batch-size", "2", "--no-progress", "--trust-remote-code", "--jobs", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    sentence = _one_sentence(result.output, result.exit_code)
    assert "1 of 3 runs failed (beta: its process ended without a result (killed by SIGKILL" in sentence
    assert not (out / "beta").exists()
    kept = {name: (out / name / "results.csv").stat().st_mtime_ns for name in ("alpha", "gamma")}

    config = json.loads((models[1] / "config.json").read_text())
    del config["auto_map"]  # mended: the model loads
    (models[1] / "config.json").write_text(json.dumps(config))
    resumed = runner.invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert {name: (out / name / "results.csv").stat().st_mtime_ns for name in ("alpha", "gamma")} == kept
    assert (out / "beta" / "results.csv").is_file()


def test_a_toy_group_that_fails_fails_alone_in_local_processes(tmp_path, monkeypatch):
    from dataclasses import replace

    from sinkscope.errors import SinkscopeError
    from sinkscope.lab.toy import ToyOptions, train_all

    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    # load 1 has 64 features, no more than the 100 relevant ones: its group refuses; load 2 trains
    options = ToyOptions(loads=(1, 2), conditions=("blind",), variants=("baseline",), seeds=(0,), steps=2,
                         batch_size=8, eval_seqs=16, n_relevant=100, out=str(tmp_path / "toy"))
    said = []
    with pytest.raises(SinkscopeError) as caught:
        train_all(replace(options, jobs=2), log=said.append)
    assert str(caught.value).startswith("1 of 2 toy groups failed: blind-load1 failed: the toy task needs more "
                                        "features (64) than relevant ones (100)")
    assert any(line.startswith("blind load 2 seed 0: baseline") for line in said)  # the other group finished


# ---- 3. no pickle found on disk is loaded ------------------------------------------------------------------


class _Planted:
    """Unpickled, it creates ``marker``: what a planted result pickle could run."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_result_pickle_is_never_loaded(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    import sinkscope.executors.slurm as slurm

    marker = tmp_path / "pwned"
    planted = pickle.dumps(_Planted(marker))
    real = slurm.executor_for

    class Planting:
        """submitit's executor, and a result pickle planted beside each task it submits."""

        def __init__(self, executor):
            self.executor = executor

        def map_array(self, *args):
            handles = self.executor.map_array(*args)
            for handle in handles:
                handle.paths.result_pickle.write_bytes(planted)
            return handles

    monkeypatch.setattr(slurm, "executor_for", lambda *args: Planting(real(*args)))
    jobs = [Job("fine", str(tmp_path / "logs" / "fine.log"), abs, (-3,)),  # builtins: the task's process imports them
            Job("killed", str(tmp_path / "logs" / "killed.log"), signal.raise_signal, (signal.SIGKILL,))]
    outcomes = run_jobs(jobs, ExecutorOptions(executor="slurm", slurm_cluster="local"), tmp_path, log=lambda m: None,
                        show_progress=False)
    assert outcomes[0].ok and outcomes[0].value == 3
    assert not outcomes[1].ok and "ended without an outcome" in outcomes[1].sentence
    assert "submitit's log: " in outcomes[1].sentence and "_log.err" in outcomes[1].sentence
    assert not marker.exists()  # the planted pickles were never loaded
    assert len(list((tmp_path / "slurm").iterdir())) == 1  # the submission's own folder


# ---- 5. Ray in one sentence ----------------------------------------------------------------------------------


def _ray_is_running() -> bool:
    return subprocess.run(["pgrep", "-f", "gcs_server"], capture_output=True).returncode == 0


def test_auto_with_no_ray_cluster_says_no_cluster_is_running(three_models, text_file, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    if _ray_is_running():
        pytest.skip("a Ray cluster runs on this machine: auto would join it")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    result = runner.invoke(app, ["heads", str(three_models[0]), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--no-progress", "--executor", "ray", "--ray-address", "auto",
                                 "--out", str(tmp_path / "run")])
    sentence = _one_sentence(result.output, result.exit_code)
    assert sentence.startswith("error: no Ray cluster is running on this machine") and "could not write" not in sentence
    assert not (tmp_path / "run").exists()


def test_a_ray_address_where_nothing_answers_is_one_sentence_within_30_seconds(three_models, text_file, tmp_path,
                                                                             monkeypatch):
    pytest.importorskip("ray")
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started = time.monotonic()
    result = runner.invoke(app, ["heads", str(three_models[0]), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--no-progress", "--executor", "ray", "--ray-address", "127.0.0.1:1",
                                 "--out", str(tmp_path / "run")])
    sentence = _one_sentence(result.output, result.exit_code)
    assert time.monotonic() - started < 30
    assert "no Ray cluster answers at 127.0.0.1:1" in sentence and "could not write or read" not in sentence
    assert not (tmp_path / "run").exists()


def _stopped(models, text_file: Path, out: Path, *executor_options: str) -> tuple[int, str]:
    """``heads`` on ``models`` in a subprocess, SIGTERM once a run has started; (exit code, stderr)."""
    args = [sys.executable, "-m", "sinkscope", "heads", *map(str, models), "--text-file", str(text_file),
            "--seq-len", "32", "--n-seqs", "64", "--batch-size", "1", "--no-progress", "--out", str(out), *executor_options]
    env = {**os.environ, "PYTHONPATH": SRC, "SINKSCOPE_CACHE": str(out.parent / "cache")}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    logs = out / "engine" / "logs"
    while time.monotonic() < deadline and proc.poll() is None:
        if logs.is_dir() and any(log.stat().st_size for log in logs.iterdir()):
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_sigterm_under_ray_ends_as_it_does_without_ray(three_models, text_file, tmp_path):
    pytest.importorskip("ray")
    code, err = _stopped(three_models, text_file, tmp_path / "ray" / "cmp", "--executor", "ray")
    ray_sentence = _one_sentence(err, code, 143)
    code, err = _stopped(three_models, text_file, tmp_path / "local" / "cmp", "--jobs", "2")
    local_sentence = _one_sentence(err, code, 143)
    assert ray_sentence == local_sentence
    assert ray_sentence.startswith("error: stopped by SIGTERM;") and "--resume" in ray_sentence
