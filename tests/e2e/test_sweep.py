"""``sinkscope sweep`` end to end on a very small trigger setting: every (variant, seed) trained by
the trainer, probed by the pipeline, resumable, and the tables computed from the checkpoints'
own validation losses (compared with an independent computation)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.store.results import read_results
from sinkscope.lab.sweep import SweepOptions, check, run_dir, sweep
from sinkscope.models.checkpoint_folder import read_config
from sinkscope.train.loop import train

SMALL = dict(steps=6, batch_size=8, eval_windows=8, task_options=["vocab=16"],
             overrides=["n_layer=1", "n_embd=32", "n_head=2"], n_seqs=8, report=False)
CLI_SMALL = ["--steps", "6", "--batch-size", "8", "--eval-windows", "8", "--task-set", "vocab=16",
             "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--n-seqs", "8"]


def quiet(_message: str) -> None:
    pass


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    result = CliRunner().invoke(app, ["sweep", "--variants", "baseline,sink+norm", "--seeds", "0,1", *CLI_SMALL,
                                      "--out", str(root / "sw")])
    assert result.exit_code == 0, result.output
    return root / "sw"


@pytest.mark.slow  # trains
def test_every_run_is_trained_probed_and_tabled(swept):
    options = SweepOptions(variants=("baseline", "sink+norm"), seeds=(0, 1), out=str(swept), **SMALL)
    losses = pd.read_csv(swept / "losses.csv")
    assert len(losses) == 4 and losses["step"].eq(6).all() and losses["fingerprint"].nunique() == 1
    for row in losses.itertuples():
        meta = read_config(run_dir(options, row.variant, row.seed) / "ckpt")
        assert meta["variant"] == row.variant and meta["seed"] == row.seed
        assert row.loss == pytest.approx(meta["val_loss"])  # the trainer's loss on its fixed windows
    # selectivity on the gated variant only
    assert (run_dir(options, "sink+norm", 0) / "selectivity" / "manifest.json").is_file()
    assert not (run_dir(options, "baseline", 0) / "selectivity").exists()
    # Table 1 against an independent paired computation
    t1 = pd.read_csv(swept / "table1.csv")
    by = {(r.variant, r.seed): r.loss for r in losses.itertuples()}
    diffs = np.array([by["baseline", s] - by["sink+norm", s] for s in (0, 1)])
    row = t1[(t1.block == "over baseline") & (t1.variant == "sink+norm")].iloc[0]
    assert row.improvement == pytest.approx(diffs.mean()) and row.se == pytest.approx(diffs.std(ddof=1) / math.sqrt(2))
    assert row.n == 2
    # sinks.csv holds the probe runs' model-level numbers
    sinks = pd.read_csv(swept / "sinks.csv")
    table = read_results(run_dir(options, "sink+norm", 1) / "sinks")
    model = table[table["layer"].isna() & table["head"].isna()].set_index("metric")["value"]
    got = sinks[(sinks.variant == "sink+norm") & (sinks.seed == 1)].iloc[0]
    assert got.p0_pct == pytest.approx(100 * model["p0_mass"]) and got.phantom_pct == pytest.approx(100 * model["phantom_mass"])
    assert got.value_norm_ratio == pytest.approx(model["value_norm_ratio"]) and got.gate_selectivity > 0
    base = sinks[sinks.variant == "baseline"]
    assert base.phantom_pct.eq(0).all() and base.gate_selectivity.isna().all()
    page = (swept / "sweep.md").read_text()
    assert "Table 1" in page and "sink+norm" in page and (swept / "table1.png").is_file()
    assert "Task trigger, tier micro," in page  # the task's default tier, named
    # Table 1 at every evaluation of the runs' log.csv: step 0 and the last step; the last equals Table 1
    by_step = pd.read_csv(swept / "table1_by_step.csv")
    assert sorted(by_step["step"].unique()) == [0, 6]
    last = by_step[by_step.step == 6].set_index(["block", "variant"])
    for r in t1.itertuples():
        assert last.loc[(r.block, r.variant), "improvement"] == pytest.approx(r.improvement, abs=2e-6)  # log.csv: 6 decimals
    logs = {(v, s): pd.read_csv(run_dir(options, v, s) / "ckpt" / "log.csv").set_index("step")["val_loss"]
            for v in ("baseline", "sink+norm") for s in (0, 1)}
    first = np.array([logs["baseline", s][0] - logs["sink+norm", s][0] for s in (0, 1)])
    row0 = by_step[(by_step.step == 0) & (by_step.variant == "sink+norm")].iloc[0]
    assert row0.improvement == pytest.approx(first.mean()) and row0.se == pytest.approx(first.std(ddof=1) / math.sqrt(2))
    assert "during training" in page and (swept / "table1_by_step.png").is_file()
    assert (swept / "sinks.png").is_file()
    assert (swept / "compare" / "report.html").is_file()


@pytest.mark.slow  # trains
def test_rerun_skips_finished_and_resumes_interrupted(swept, tmp_path):
    out = tmp_path / "sw"
    shutil.copytree(swept, out)
    options = SweepOptions(variants=("baseline", "sink+norm"), seeds=(0, 1), out=str(out), **SMALL)
    # interrupt one run at step 3 (a checkpoint before the last step) and drop one probe run
    partial = run_dir(options, "sink+norm", 1) / "ckpt"
    shutil.rmtree(partial.parent)
    from sinkscope.lab.sweep import train_options

    train(dataclasses.replace(train_options(options, "sink+norm", 1), stop_at=3), log=quiet)
    assert read_config(partial)["step"] == 3
    shutil.rmtree(run_dir(options, "baseline", 0) / "sinks")
    messages = []
    sweep(options, log=messages.append)
    assert "baseline seed 1: kept, sinks kept" in messages
    assert "baseline seed 0: kept, sinks measured" in messages
    assert "sink+norm seed 1: resumed, sinks measured, selectivity measured" in messages
    # the resumed run ends where the uninterrupted one of the first sweep ended
    assert pd.read_csv(out / "losses.csv").equals(pd.read_csv(swept / "losses.csv"))
    # runs trained with other settings are not mixed into the tables
    for change in ({"steps": 8}, {"overrides": ["n_layer=1", "n_embd=32", "n_head=4"]}):
        with pytest.raises(SinkscopeError, match="was trained with"):
            sweep(dataclasses.replace(options, **change), log=quiet)


@pytest.mark.slow  # spawns Python (a process pool)
def test_parallel_processes_give_the_sequential_losses(swept, tmp_path):
    options = SweepOptions(variants=("baseline", "sink+norm"), seeds=(0, 1), out=str(tmp_path / "par"),
                           jobs=2, **{**SMALL, "probe": False})
    sweep(options, log=quiet)
    assert pd.read_csv(tmp_path / "par" / "losses.csv").equals(pd.read_csv(swept / "losses.csv"))
    assert json.loads((tmp_path / "par" / "sweep.json").read_text())["jobs"] == 2


def test_mistakes_fail_in_one_sentence_before_training(tmp_path):
    out = str(tmp_path / "x")
    for bad, match in (({"variants": ("baseline", "sink-proj")}, "did you mean"),
                       ({"launcher": "slurm"}, "unknown --launcher"),
                       ({"jobs": 0}, "--jobs"),
                       ({"tier": "124m"}, "unknown tier")):
        with pytest.raises(SinkscopeError, match=match):
            check(SweepOptions(out=out, **{**SMALL, **bad}))
    try:
        import submitit  # noqa: F401
    except ImportError:
        from sinkscope.lab.sweep import sweep_executor

        with pytest.raises(SinkscopeError, match=r"sinkscope\[slurm\]"):
            sweep_executor(SweepOptions(out=out, launcher="submitit"))
    result = CliRunner().invoke(app, ["sweep", "--seeds", "0,x", "--out", out])
    assert result.exit_code == 1 and "--seeds takes" in result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.slow  # trains (its fixture); submitit's local executor spawns Python
def test_submitit_runs_one_array_job_per_run(swept, tmp_path, monkeypatch):
    """--executor slurm (submitit's local executor: the array's tasks as local processes; `--launcher
    submitit` is the same engine): one job per (variant, seed), each with its log, the tables after."""
    pytest.importorskip("submitit")
    from sinkscope.executors.settings import ExecutorOptions
    from sinkscope.lab.sweep import sweep_executor

    out = tmp_path / "sw"
    shutil.copytree(swept, out)
    options = SweepOptions(variants=("baseline", "sink+norm"), seeds=(0, 1), out=str(out), launcher="submitit",
                           slurm=["slurm_partition=gpu", "timeout_min=30"], **SMALL)
    import sinkscope.executors.settings as choose_executor

    monkeypatch.setattr(choose_executor.shutil, "which", lambda name: f"/usr/bin/{name}")  # as on a login node
    assert sweep_executor(options) == ExecutorOptions(executor="slurm", slurm_extra=("slurm_partition=gpu", "timeout_min=30"))
    monkeypatch.undo()
    messages = []
    sweep(options, log=messages.append, executor_options=ExecutorOptions(executor="slurm", slurm_cluster="local"))
    assert "Submitted 4 runs as a job array" in messages[0]
    assert "sink+norm seed 1: kept, sinks kept, selectivity kept" in messages
    for name in ("baseline-s0", "baseline-s1", "sink+norm-s0", "sink+norm-s1"):
        assert "finished in" in (out / "engine" / "logs" / f"{name}.log").read_text()
    assert list((out / "engine" / "slurm").glob("*/*_submitted.pkl"))  # one folder per submission
    assert pd.read_csv(out / "table1.csv").equals(pd.read_csv(swept / "table1.csv"))
