"""Out-of-memory retry, kill-and-resume, data-parallel and sharded runs give the same table."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from conftest import free_port, SAMPLE_TEXT, make_tokenizer
from sinkscope.capture import ModelSpec
from sinkscope.cli import app
from sinkscope.store.statefile import read_header
from sinkscope.commands.sinks import sinks_probes
from sinkscope.store.results import rows_to_frame
from sinkscope.forward.runner import run_probes
from tiny_models import build, random_ids
from repo_paths import REPO

runner = CliRunner()
SRC = str(REPO / "src")


def _table(folder: Path) -> pd.DataFrame:
    return pd.read_csv(folder / "results.csv")


def _assert_same(a: pd.DataFrame, b: pd.DataFrame, rtol: float = 1e-6) -> None:
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    np.testing.assert_allclose(a["value"].to_numpy(), b["value"].to_numpy(), rtol=rtol, atol=1e-7)


def test_out_of_memory_halves_the_batch_and_rolls_back(capsys):
    model = build("llama")
    ids = random_ids(6, 16, seed=3).numpy()
    spec = ModelSpec.from_model(model)

    def table(batch_size, fail_above=None):
        probes = sinks_probes(spec)
        handle = None
        if fail_above is not None:  # layer 1 fails on big batches, after layer 0 already fed the probes
            def hook(_m, args, kwargs):
                hidden = kwargs.get("hidden_states", args[0] if args else None)
                if hidden.shape[0] > fail_above:
                    raise torch.OutOfMemoryError("CPU out of memory (simulated)")
            handle = model.model.layers[1].register_forward_pre_hook(hook, with_kwargs=True)
        messages = []
        used = run_probes(model, ids, probes, batch_size=batch_size, progress=False, log=messages.append)
        if handle:
            handle.remove()
        return rows_to_frame(r for p in probes for r in p.rows()), used, messages

    reference, _, _ = table(1)
    retried, used, messages = table(4, fail_above=2)
    assert used == 2 and len(messages) == 1 and "retrying with --batch-size 2" in messages[0]
    _assert_same(reference, retried)
    with pytest.raises(torch.OutOfMemoryError):  # a second failure is not hidden
        table(4, fail_above=1)


@pytest.fixture(scope="module")
def slow_model_dir(tmp_path_factory) -> Path:
    """A tiny Llama big enough that 300 windows take a few seconds (room to kill it mid-way)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("slow-llama")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=512, max_position_embeddings=512)
    LlamaForCausalLM(config).save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def long_text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("long") / "long.txt"
    path.write_text(SAMPLE_TEXT * 200, encoding="utf-8")
    return path


def _slow_run_args(model_dir: Path, text: Path) -> list[str]:
    """A probe run long enough to interrupt, checkpointing after every window."""
    return [str(model_dir), "--text-file", str(text), "--seq-len", "128", "--n-seqs", "300",
            "--batch-size", "1", "--no-figures", "--no-progress", "--checkpoint-seconds", "0"]


@pytest.mark.slow  # spawns Python
def test_kill_and_resume_equals_an_uninterrupted_run(slow_model_dir, long_text, tmp_path):
    args = _slow_run_args(slow_model_dir, long_text)
    straight = tmp_path / "straight"
    assert runner.invoke(app, ["sinks", *args, "--out", str(straight)]).exit_code == 0

    killed = tmp_path / "killed"
    progress = tmp_path / ".killed.progress.safetensors"
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-m", "sinkscope", "sinks", *args, "--out", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    next_window = 0
    while time.time() < deadline and proc.poll() is None:
        if progress.is_file():
            try:
                next_window = read_header(progress)["next"]
            except Exception:  # noqa: BLE001 - replaced while reading; try again
                next_window = 0
            if next_window >= 20:
                break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not killed.exists() and progress.is_file()  # nothing half-written, progress kept

    result = runner.invoke(app, ["sinks", *args, "--out", str(killed), "--resume"])
    assert result.exit_code == 0, result.output
    assert "Resuming at window" in result.output
    assert not progress.exists()
    _assert_same(_table(straight), _table(killed))

    # A resume with different options is refused, with one sentence.
    again = runner.invoke(app, ["sinks", *args, "--out", str(killed), "--resume"])
    assert again.exit_code == 1 and "no interrupted run to resume" in again.output


@pytest.mark.slow  # spawns Python
def test_two_process_data_parallel_run_equals_one_process(tiny_llama_dir, text_file, tmp_path):
    args = [str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "24", "--n-seqs", "9",
            "--batch-size", "2", "--no-figures", "--no-progress", "--device", "cpu"]
    one = tmp_path / "one"
    assert runner.invoke(app, ["sinks", *args, "--out", str(one)]).exit_code == 0
    two = tmp_path / "two"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-port", str(free_port()), "-m", "sinkscope", "sinks", *args, "--out", str(two)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _assert_same(_table(one), _table(two))
    import json

    assert json.loads((two / "manifest.json").read_text())["processes"] == 2


def test_sharded_device_map_gives_the_same_table(tiny_llama_dir, text_file, tmp_path):
    from sinkscope.run.loaders import load_model
    from sinkscope.models.resolve import resolve_source
    from sinkscope.data.corpus import make_windows, text_file_corpus, tokenize_documents

    plain = load_model(resolve_source(str(tiny_llama_dir)), device="cpu")
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu", "model.layers.2": "cpu",
                  "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    sharded = load_model(resolve_source(str(tiny_llama_dir)), device="cpu", device_map=device_map)
    # On one device transformers skips dispatch; force accelerate's per-module device hooks so
    # the sharded code path (inputs moved layer by layer, accumulators moved to the CPU) runs.
    from accelerate import dispatch_model

    dispatch_model(sharded.model, device_map=device_map, force_hooks=True)
    assert hasattr(sharded.model.model.layers[0], "_hf_hook")
    docs = tokenize_documents(plain.tokenizer, text_file_corpus(str(text_file)).documents)
    tokens = make_windows(docs, seq_len=24, n_seqs=5, seed=0, bos_id=None).tokens
    tables = []
    for loaded in (plain, sharded):
        spec = ModelSpec.from_model(loaded.model)
        probes = sinks_probes(spec)
        run_probes(loaded.model, tokens, probes, batch_size=2, progress=False)
        tables.append(rows_to_frame(r for p in probes for r in p.rows()))
    _assert_same(*tables)
    # and through the CLI
    out = tmp_path / "auto"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "24",
                                 "--n-seqs", "5", "--device-map", "auto", "--no-figures", "--no-progress",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output


@pytest.mark.slow  # spawns Python
@pytest.mark.parametrize("stop,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_keeps_progress_and_says_how_to_resume(slow_model_dir, long_text, tmp_path, stop, code, word):
    """Ctrl-C, and SIGTERM as a scheduler or `kill` sends it (issue 38, class 9): the progress is kept and
    one sentence says the run was stopped and how to resume it."""
    args = _slow_run_args(slow_model_dir, long_text)
    out = tmp_path / "interrupted"
    progress = tmp_path / ".interrupted.progress.safetensors"
    # As from a shell: SIGINT at its default disposition in the child, whatever this test process
    # inherited or a native library set (an ignored SIGINT is inherited through exec, and Python
    # then installs no KeyboardInterrupt handler).
    proc = subprocess.Popen([sys.executable, "-m", "sinkscope", "sinks", *args, "--out", str(out)],
                            env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline, next_window = time.time() + 120, 0
    while time.time() < deadline and proc.poll() is None and next_window < 3:  # well inside the window loop
        if progress.is_file():
            try:
                next_window = read_header(progress)["next"]
            except Exception:  # noqa: BLE001 - replaced while reading; try again
                next_window = 0
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(stop)
    _, stderr = proc.communicate(timeout=180)  # a loaded machine: once seen to take > 60 s (cause unknown)
    assert proc.returncode == code, stderr  # as for a Ctrl-C before the first checkpoint
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "--resume" in errors[0] and errors[0].startswith(f"error: {word};"), stderr
    assert "Traceback" not in stderr
    assert progress.is_file() and not out.exists()


@pytest.mark.slow  # spawns Python, trains
def test_training_killed_and_resumed_equals_uninterrupted(text_file, tmp_path):
    from safetensors.torch import load_file

    args = ["train", "--variant", "sinklogit", "--text-file", str(text_file), "--tokenizer", "bpe300",
            "--windows", "random",  # the sample text has no paragraph breaks for doc-start windows
            "--set", "n_layer=2", "--set", "n_head=2", "--set", "n_embd=32", "--set", "block_size=32",
            "--steps", "300", "--batch-size", "4", "--checkpoint-every", "5", "--no-progress"]
    straight = tmp_path / "straight"
    assert runner.invoke(app, [*args, "--out", str(straight)]).exit_code == 0

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "sinkscope", *args, "--out", str(killed)],
                            env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    import json

    deadline, step = time.time() + 120, 0
    while time.time() < deadline and proc.poll() is None:
        try:
            step = json.loads((killed / "config.json").read_text())["step"]
        except (OSError, ValueError, KeyError):
            step = 0
        if step >= 20:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "training finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    result = runner.invoke(app, [*args, "--out", str(killed), "--resume"])
    assert result.exit_code == 0, result.output
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(killed / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
