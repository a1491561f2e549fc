"""Progress that counts work as it is done (issue 61): the forward loop's bar moves with every pass of a batch
(``inject``: one clean pass and one per condition), ``stream``'s with every chunk of a condition; an
interrupted one-document ``stream`` keeps the conditions it read and ``resume`` reads the others, to the
table of an uninterrupted run; with progress off the pipeline still says each checkpoint, and the Python
API shows progress on stderr unless ``progress=False``.

The bars are captured (a stand-in for tqdm records every update), never timed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import sinkscope
from sinkscope.capture.families import ModelSpec
from sinkscope.errors import Interrupted
from sinkscope.forward import runner
from sinkscope.forward.stream import windows as stream_windows
from sinkscope.probes import get_probe
from tiny_models import build, random_ids


class Bar:
    """A stand-in for tqdm: keeps its arguments and every update."""

    made: list["Bar"] = []

    def __init__(self, total=None, initial=0, disable=False, **kwargs):
        self.total, self.n, self.disable, self.kwargs = total, initial, disable, kwargs
        self.updates: list[float] = []
        self.postfix = ""
        Bar.made.append(self)

    def update(self, n=1):
        self.updates.append(n)
        self.n += n

    def set_postfix_str(self, text, refresh=True):
        self.postfix = text

    def refresh(self):
        pass

    def close(self):
        pass


@pytest.fixture
def bars(monkeypatch):
    Bar.made = []
    monkeypatch.setattr(runner, "progress_bar", Bar)
    monkeypatch.setattr(stream_windows, "progress_bar", Bar)
    return Bar.made


def test_the_bar_counts_each_pass_of_an_inject_batch(bars, monkeypatch):
    model = build("llama")
    spec = ModelSpec.from_model(model)
    probe = get_probe("injection")(spec, junk=("gaussian",), cutoffs=("median",), doses=(0.2, 0.4, 0.8), eval_batch=2)
    seen = []  # the bar's count as each pass starts
    forward = runner._forward

    def counted(*args, **kwargs):
        seen.append(bars[0].n)
        return forward(*args, **kwargs)

    monkeypatch.setattr(runner, "_forward", counted)
    runner.run_probes(model, random_ids(2, 8).numpy(), [probe], batch_size=2)
    (bar,) = bars
    assert bar.total == 4 and bar.kwargs["unit"] == "pass"  # one batch: the clean pass and three doses
    assert seen == [0, 1, 2, 3]  # the bar moved within the one batch, pass by pass
    assert bar.n == 4 and bar.postfix == "2/2 windows"


def test_one_pass_per_batch_still_counts_windows(bars):
    model = build("llama")
    probe = get_probe("p0_mass")(ModelSpec.from_model(model))
    runner.run_probes(model, random_ids(3, 8).numpy(), [probe], batch_size=2)
    (bar,) = bars
    assert bar.kwargs["unit"] == "win" and bar.total == 3 and bar.updates == [2, 1]


def test_the_stream_bar_counts_tokens_within_a_condition(bars):
    model = build("llama")
    spec = ModelSpec.from_model(model)
    stream = get_probe("stream")(spec, policies=("full", "window"), caches=(8,), positions=("original",), chunk=4,
                                 length=24, n_windows=1)
    stream_windows.read_windows(model, random_ids(1, 24).numpy(), [stream], log=lambda _m: None)
    (bar,) = bars
    assert bar.total == 2 * 24 and bar.n == bar.total
    moves = [n for n in bar.updates if n]
    assert moves == [4] * 12  # every chunk of both conditions, as it is read
    assert stream.read.all()


STREAM = dict(length=24, chunk=4, cache=8, policy="full,window,sinks", sink_tokens=2, positions="original",
              figures=False)


def test_an_interrupted_document_keeps_its_conditions_and_resumes_to_the_same_table(tmp_path, monkeypatch):
    model, ids = build("llama"), random_ids(1, 24, seed=3).numpy()
    whole = sinkscope.measure("stream", model, windows=ids, progress=False, **STREAM).table
    real, calls = stream_windows.read_stream, {"n": 0}

    def stopped(*args, **kwargs):  # Ctrl-C while the third condition of the one document is read
        calls["n"] += 1  # the first read is the check before the first window (a prefix with nothing evicted)
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(stream_windows, "read_stream", stopped)
    out = tmp_path / "run"
    with pytest.raises(Interrupted, match="resume"):  # saved at once, whatever --checkpoint-seconds says
        sinkscope.measure("stream", model, windows=ids, progress=False, out=str(out), checkpoint_seconds=3600, **STREAM)
    monkeypatch.setattr(stream_windows, "read_stream", real)
    messages: list[str] = []
    resumed = sinkscope.measure("stream", model, windows=ids, progress=False, out=str(out), resume=True,
                                log=messages.append, **STREAM)
    assert any("2 of 3 conditions of window 0 were read before the interruption" in m for m in messages), messages
    read = [m for m in messages if m.startswith("Read window")]  # progress off: one line per condition read
    assert read == ["Read window 1 of 1 under sinks 2+6 (original positions) (3 of 3 conditions)."]
    columns = ["probe", "metric", "layer", "head", "policy", "cache", "sink_tokens", "positions", "position_bucket"]
    pd.testing.assert_frame_equal(resumed.table.sort_values(columns, ignore_index=True),
                                  whole.sort_values(columns, ignore_index=True), check_exact=False, rtol=1e-6)


def test_progress_off_still_says_each_checkpoint(tmp_path):
    messages: list[str] = []
    sinkscope.measure("p0_mass", build("llama"), windows=random_ids(4, 8).numpy(), batch_size=1, progress=False,
                      out=str(tmp_path / "run"), checkpoint_seconds=0, figures=False, log=messages.append)
    assert messages[0].startswith("Running llama") and messages[-1].startswith("Wrote ")
    assert [m for m in messages if m.startswith("Checkpoint")] == [
        f"Checkpoint: {k} of 4 windows measured, kept for --resume." for k in (1, 2, 3)]


def test_the_api_shows_progress_on_stderr_unless_told_not_to(capsys):
    model, ids = build("llama"), random_ids(2, 8).numpy()
    sinkscope.measure("p0_mass", model, windows=ids)
    err = capsys.readouterr().err
    assert "Running llama" in err and "win" in err  # the phases and the bar
    sinkscope.measure("p0_mass", model, windows=ids, progress=False)
    assert capsys.readouterr().err == ""
