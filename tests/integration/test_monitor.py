"""Sinks through training (issue 29): the monitor's numbers are sinkscope.measure's on the saved checkpoint.

A tiny Llama trains a few steps under transformers' ``Trainer`` with the monitor's callback; the
p0 mass and value-norm ratio it logged at step k equal ``sinkscope.measure`` on the checkpoint the
Trainer saved at step k, on the same windows (the independent reference is a fresh load of that
checkpoint, measured by the ordinary pipeline). The bundled trainer does the same through
``sinkscope train --monitor-every``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.train.monitor import SinkMonitor
from tiny_models import build
from repo_paths import REPO

PROBES = ("p0_mass", "value_norm_ratio")


def _head_rows(frame: pd.DataFrame, metric: str) -> np.ndarray:
    rows = frame[(frame["metric"] == metric) & frame["head"].notna()].sort_values(["layer", "head"])
    return rows["value"].to_numpy(dtype=float)


class _Ids(torch.utils.data.Dataset):
    def __init__(self, ids: torch.Tensor):
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class _Recorder:
    """A stand-in for a ``report_to`` logger: a callback placed before the monitor, keeping every on_log."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Recorder(TrainerCallback):
            def __init__(self):
                self.logged = []

            def on_log(self, args, state, control, logs=None, **kwargs):
                self.logged.append((state.global_step, dict(logs or {})))

        return Recorder()


@pytest.mark.slow  # trains
@pytest.mark.parametrize("form", ["callbacks=[monitor]", "add_callback(monitor.callback(trainer))"])
def test_the_trainer_callback_logs_what_measure_gives_on_the_saved_checkpoint(tmp_path, form):
    import sinkscope
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = build("llama").train()
    vocab = model.config.vocab_size
    train_ids = torch.randint(1, vocab, (16, 24), generator=torch.Generator().manual_seed(1))
    windows = torch.randint(1, vocab, (3, 16), generator=torch.Generator().manual_seed(2)).numpy()
    monitor = SinkMonitor(PROBES, every=2, windows=windows, out=tmp_path / "monitor")
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=4, save_steps=2, per_device_train_batch_size=4,
                             learning_rate=5e-3, report_to=[], use_cpu=True, logging_steps=1,
                             disable_tqdm=True, seed=0)
    recorder = _Recorder()
    if form == "callbacks=[monitor]":  # as EarlyStoppingCallback is passed; the recorder comes first, as report_to's
        trainer = Trainer(model=model, args=args, train_dataset=_Ids(train_ids), callbacks=[recorder, monitor])
    else:
        trainer = Trainer(model=model, args=args, train_dataset=_Ids(train_ids), callbacks=[recorder])
        trainer.add_callback(monitor.callback(trainer))
    attention_before = model.config._attn_implementation
    trainer.train()
    assert model.training and model.config._attn_implementation == attention_before  # left as it was

    steps = [int(f["step"].iloc[0]) for f in monitor.frames]
    assert steps == [0, 2, 4]
    logged = [h for h in trainer.state.log_history if "sinks/p0_mass" in h]
    assert [h["step"] for h in logged] == [0, 2, 4]  # as trainer.log does: every report_to logger sees them
    assert [step for step, logs in recorder.logged if "sinks/p0_mass" in logs] == [0, 2, 4]
    assert all("sinks/sink_head_share" in logs for _, logs in recorder.logged if "sinks/p0_mass" in logs)
    moved = False
    for frame in monitor.frames[1:]:
        step = int(frame["step"].iloc[0])
        saved = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / f"checkpoint-{step}").eval()
        reference = sinkscope.measure(list(PROBES), saved, windows=windows).table
        for metric in PROBES:
            np.testing.assert_allclose(_head_rows(frame, metric), _head_rows(reference, metric), rtol=1e-5, atol=1e-6)
        moved |= not np.allclose(_head_rows(frame, "p0_mass"), _head_rows(monitor.frames[0], "p0_mass"), atol=1e-6)
    assert moved, "the weights did not change: the test would compare one model with itself"

    table = pd.read_csv(tmp_path / "monitor" / "monitor.csv")
    assert sorted(table["step"].unique()) == [0, 2, 4]
    assert list(table.columns) == ["step", "probe", "metric", "layer", "head", "value", "n", "se"]
    head_rows = table[(table.metric == "p0_mass") & table["head"].notna()]
    assert head_rows["se"].notna().all()  # the standard error over the 3 windows, as in results.csv
    assert (table.metric == "sink_head_share").any()
    assert np.array_equal(np.load(tmp_path / "monitor" / "monitor_tokens.npy"), windows)


@pytest.mark.slow  # trains
def test_monitor_step_in_a_hand_written_loop_leaves_the_model_trainable(tmp_path):
    model = build("gpt2").train()
    windows = torch.randint(1, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)).numpy()
    monitor = SinkMonitor(every=3, windows=windows)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    measured = []
    for step in range(1, 7):
        ids = torch.from_numpy(windows)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()  # a buffer cached under the monitor's pass would fail here under inference mode
        optimizer.step()
        optimizer.zero_grad()
        if monitor.step(model, step) is not None:
            measured.append(step)
        assert model.training
    assert measured == [3, 6]
    assert SinkMonitor.scalars(monitor.frames[0])["sinks/p0_mass"] > 0


def test_a_folder_holding_another_monitors_table_is_refused(tmp_path):
    windows = np.arange(2, 26).reshape(2, 12)
    SinkMonitor(every=2, windows=windows, out=tmp_path)
    SinkMonitor(every=5, windows=windows, out=tmp_path)  # the same probes and windows: continued
    with pytest.raises(SinkscopeError, match="other probes or windows"):
        SinkMonitor(every=2, windows=windows + 1, out=tmp_path)
    with pytest.raises(SinkscopeError, match="either windows="):
        SinkMonitor(every=2)
    with pytest.raises(SinkscopeError, match="no_such_probe|unknown"):
        SinkMonitor(["no_such_probe"], windows=windows)


# ---- the bundled trainer: sinkscope train --monitor-every ----------------------------------------------------

SMALL = ["n_layer=2", "n_head=2", "n_embd=32", "block_size=32"]


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    import os
    import random

    root = tmp_path_factory.mktemp("monitor-train")
    old = os.environ.get("SINKSCOPE_CACHE")
    os.environ["SINKSCOPE_CACHE"] = str(root / "cache")
    rng = random.Random(0)
    vocab = "the cat dog bird sat ran flew on under a mat house tree and with red blue small big quietly".split()
    lines = [" ".join(rng.choice(vocab) for _ in range(10)) + "." for _ in range(3000)]
    text = root / "words.txt"
    text.write_text("\n\n".join("\n".join(lines[i:i + 3]) for i in range(0, len(lines), 3)), encoding="utf-8")
    yield str(text)
    if old is None:
        os.environ.pop("SINKSCOPE_CACHE", None)
    else:
        os.environ["SINKSCOPE_CACHE"] = old


def _train_options(text, out, **kw):
    from sinkscope.train.config import TrainOptions

    base = dict(out=str(out), text_file=text, tokenizer="bpe300", steps=10, batch_size=8, warmup_steps=2,
                eval_every=5, eval_windows=8, checkpoint_every=5, overrides=list(SMALL), progress=False,
                monitor_every=5, device="cpu")
    base.update(kw)
    return TrainOptions(**base)


def _last_step_equals_measure_on_the_checkpoint(ckpt, steps):
    import sinkscope

    table = pd.read_csv(ckpt / "monitor.csv")
    assert sorted(table["step"].unique()) == steps
    assert not table.duplicated(["step", "probe", "metric", "layer", "head"]).any()  # each step once, resumed or not
    windows = np.load(ckpt / "monitor_tokens.npy")
    reference = sinkscope.measure(["p0_mass", "phantom_mass", "value_norm_ratio"], str(ckpt), windows=windows).table
    last = table[table["step"] == steps[-1]]
    for metric in ("p0_mass", "value_norm_ratio"):
        np.testing.assert_allclose(_head_rows(last, metric), _head_rows(reference, metric), rtol=1e-5, atol=1e-6)
    first = table[table["step"] == 0]
    assert not np.allclose(_head_rows(first, "p0_mass"), _head_rows(last, "p0_mass"), atol=1e-6)


@pytest.mark.slow  # trains
def test_train_monitor_every_equals_measure_on_the_checkpoint_and_survives_resume(words, tmp_path):
    from sinkscope.models.checkpoint_folder import foreign_files
    from sinkscope.train.loop import train

    straight = train(_train_options(words, tmp_path / "straight"))
    _last_step_equals_measure_on_the_checkpoint(straight, [0, 5, 10])
    assert foreign_files(straight) == []  # the monitor's files are the checkpoint's own

    stopped = tmp_path / "stopped"
    train(_train_options(words, stopped, stop_at=5))
    train(_train_options(words, stopped, resume=True))
    _last_step_equals_measure_on_the_checkpoint(stopped, [0, 5, 10])
    a, b = pd.read_csv(straight / "monitor.csv"), pd.read_csv(stopped / "monitor.csv")
    np.testing.assert_allclose(a["value"].to_numpy(dtype=float), b["value"].to_numpy(dtype=float), rtol=1e-5,
                               atol=1e-6, equal_nan=True)


@pytest.mark.slow  # spawns Python
def test_train_monitor_under_torchrun_two_processes(words, tmp_path):
    import os
    import subprocess
    import sys

    from conftest import free_port

    out = tmp_path / "ddp"
    args = ["--text-file", words, "--tokenizer", "bpe300", "--steps", "10", "--batch-size", "8", "--warmup-steps", "2",
            "--eval-every", "5", "--checkpoint-every", "5", "--monitor-every", "5",
            "--device", "cpu", "--no-progress", "--out", str(out)] + [a for s in SMALL for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(free_port()), "-m", "sinkscope", "train", *args],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _last_step_equals_measure_on_the_checkpoint(out, [0, 5, 10])  # rank 0 wrote every step once


def test_the_monitor_is_a_trainer_callback_and_logs_through_the_handler_that_calls_it():
    """No training: a CallbackHandler (the Trainer's dispatcher) with a logger before the monitor; training
    begins at step 0, the monitor measures, and the logger receives the scalars in its on_log."""
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    model = build("llama")
    windows = torch.randint(1, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)).numpy()
    monitor = SinkMonitor(PROBES, every=5, windows=windows)
    assert isinstance(monitor, TrainerCallback)
    recorder = _Recorder()
    handler = CallbackHandler([DefaultFlowCallback(), recorder, monitor], model, None, None, None)
    args = TrainingArguments(output_dir="unused", report_to=[], use_cpu=True, logging_steps=1000)
    state, control = TrainerState(), TrainerControl()
    handler.on_train_begin(args, state, control)
    (step, logs), = recorder.logged
    assert step == 0 and logs == monitor.scalars(monitor.frames[0])
    assert state.log_history == [{**logs, "step": 0}]
    state.global_step = 3  # not due: nothing measured or logged
    handler.on_step_end(args, state, control)
    state.global_step = 5
    handler.on_step_end(args, state, control)
    assert [s for s, _ in recorder.logged] == [0, 5] and [h["step"] for h in state.log_history] == [0, 5]


def test_a_table_written_before_se_gets_the_column_when_continued(tmp_path):
    model = build("llama")
    windows = torch.randint(1, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0)).numpy()
    out = tmp_path / "monitor"
    first = SinkMonitor(PROBES, every=1, windows=windows, out=out)
    first.step(model, 0)
    table = out / "monitor.csv"
    old = pd.read_csv(table).drop(columns="se")  # as a monitor before 2026-12 wrote it
    old.to_csv(table, index=False)
    again = SinkMonitor(PROBES, every=1, windows=windows, out=out)
    again.step(model, 1)
    upgraded = pd.read_csv(table)
    assert list(upgraded.columns)[-1] == "se" and len(upgraded) == 2 * len(old)
    assert upgraded[upgraded.step == 0]["se"].isna().all()
    assert upgraded[(upgraded.step == 1) & upgraded["head"].notna() & (upgraded.metric == "p0_mass")]["se"].notna().all()


def test_the_monitor_keeps_each_steps_windows_and_gives_the_emergence_step(tmp_path):
    """Issue 58, item 2: every measured step's per-window values go to monitor_windows.npz (model row = the
    table's model value); SinkMonitor.emergence is stats.emergence on them; a resumed training drops later steps."""
    from sinkscope.stats.emergence import emergence

    windows = torch.randint(1, 500, (4, 16), generator=torch.Generator().manual_seed(0)).numpy()
    monitor = SinkMonitor(every=100, windows=windows, out=tmp_path / "mon")
    for k, step in enumerate((0, 100, 200, 300)):
        frame = monitor.step(build("llama", seed=k + 1), step)
        model = frame[(frame.metric == "p0_mass") & frame["layer"].isna() & frame["head"].isna()]
        metrics, values = monitor.window_steps[step]
        assert values.shape == (len(metrics), 4, 4)  # 3 layers + the model row, 4 windows
        assert float(values[metrics.index("p0_mass"), -1].mean()) == pytest.approx(model["value"].iloc[0], rel=1e-5)
    found = monitor.emergence("p0_mass")
    stacked = np.stack([monitor.window_steps[s][1][monitor.window_steps[s][0].index("p0_mass"), -1]
                        for s in (0, 100, 200, 300)])
    again = emergence(np.array([0.0, 100, 200, 300]), stacked)
    assert (found.threshold, found.n_windows) == (again.threshold, 4)
    assert found.step == again.step or (np.isnan(found.step) and np.isnan(again.step))
    with np.load(tmp_path / "mon" / "monitor_windows.npz") as held:
        assert held["steps"].tolist() == [0, 100, 200, 300] and held["values"].shape[:2] == (4, len(metrics))
    continued = SinkMonitor(every=100, windows=windows, out=tmp_path / "mon")  # a resumed training's monitor
    assert sorted(continued.window_steps) == [0, 100, 200, 300]
    continued.truncate(100)
    with np.load(tmp_path / "mon" / "monitor_windows.npz") as held:
        assert held["steps"].tolist() == [0, 100]
    with pytest.raises(SinkscopeError, match="needs 2 or more"):
        SinkMonitor(every=100, windows=windows).emergence("p0_mass")
