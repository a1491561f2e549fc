"""Issue 60, item 3: memory follows the work asked for, measured (slow tier).

Each case runs ``python -m sinkscope`` in its own process under ``/usr/bin/time`` and compares its peak
resident memory with the same command on a small input: the difference is what the large input
costs, and must stay far below what it used to (before: ~200x a text file's size; the explorer's
patterns for every window at once). The last test times SIGTERM during a long forward. The numbers
for the issue come from benchmarks/bench_memory.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile

import numpy as np
import pytest

from conftest import SAMPLE_TEXT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not shutil.which("time") and not os.path.exists("/usr/bin/time"),
                                 reason="needs /usr/bin/time")]


def peak(args: list[str], tmp_path) -> int:
    """Peak resident bytes of ``python -m sinkscope ARGS`` (which must succeed unless it is ``report``)."""
    out = tmp_path / f"time-{time.monotonic_ns()}.txt"
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    done = subprocess.run(["/usr/bin/time", "-o", str(out), "-f", "%M", sys.executable, "-m", "sinkscope", *args],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0 or args[0] == "report", done.stderr[-2000:]
    return int(out.read_text().split()[-1]) * 1024


def big_text(path, mb: int):
    """Paragraphs of the sample text with numbers in them, so the tokenizer does not see one text repeated."""
    with open(path, "w", encoding="utf-8") as handle:
        written, i = 0, 0
        while written < mb * 1_000_000:
            paragraph = f"{i}. {SAMPLE_TEXT}\n\n"
            handle.write(paragraph)
            written += len(paragraph)
            i += 1
    return path


def test_a_large_text_costs_little_more_than_its_windows(tiny_llama_dir, text_file, tmp_path):
    """20 MB of text: ``sinks`` and ``explore`` peak within 300 MB of the same runs on a 5 KB text (the whole
    text tokenised at once cost about 200 times its size: 4 GB)."""
    large = big_text(tmp_path / "large.txt", 20)
    for command, extra in (("sinks", ["--n-seqs", "4", "--explore-heads", "none"]), ("explore", [])):
        runs = {name: peak([command, str(tiny_llama_dir), "--text-file", str(text), "--seq-len", "64", *extra,
                            "--device", "cpu", "--no-figures", "--no-progress", "--out", str(tmp_path / f"{command}-{name}")],
                           tmp_path)
                for name, text in (("small", text_file), ("large", large))}
        assert runs["large"] - runs["small"] < 300e6, (command, runs)


def test_the_explorer_reads_its_windows_in_batches(tiny_llama_dir, tmp_path):
    """8 windows of 1,024 tokens and every head cost the explorer no more than 1 window does (before: all
    8 windows in one batch, and every pattern kept until the budget was applied)."""
    runs = {}
    for n in (1, 8):
        runs[n] = peak(["sinks", str(tiny_llama_dir), "--inputs", "random", "--seq-len", "1024", "--n-seqs", str(n),
                        "--explore-windows", str(n), "--explore-heads", "all", "--batch-size", "1", "--device", "cpu",
                        "--no-figures", "--no-progress", "--out", str(tmp_path / f"run-{n}")], tmp_path)
    assert runs[8] - runs[1] < 150e6, runs


def test_a_planted_explorer_member_is_refused_unread(tiny_llama_dir, text_file, tmp_path):
    """A member inflating to 1 GB: ``report`` refuses it having read its header only."""
    out = tmp_path / "run"
    peak(["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16", "--n-seqs", "2",
          "--explore-windows", "1", "--no-figures", "--no-progress", "--out", str(out)], tmp_path)
    clean = peak(["report", str(out)], tmp_path)
    with zipfile.ZipFile(out / "explorer.npz") as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    header = b"\x93NUMPY\x01\x00" + b"{'descr': '<u2', 'fortran_order': False, 'shape': (500000000,), }"
    header = header[:8] + (118).to_bytes(2, "little") + header[8:].ljust(117) + b"\n"
    with zipfile.ZipFile(out / "explorer.npz", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            if name != "codes.npy":
                archive.writestr(name, data)
        with archive.open("codes.npy", "w", force_zip64=True) as member:
            member.write(header)
            for _ in range(1000):
                member.write(bytes(1_000_000))
    planted = peak(["report", str(out)], tmp_path)
    assert planted - clean < 100e6, (clean, planted)


def test_sigterm_takes_effect_between_layers():
    """The signal handler runs as soon as the interpreter gets control: between layers (the decoder's loop
    is Python), never later than the end of the layer running when it arrives. A long forward: 3 layers of
    16,384 tokens; the signal comes 0.1 s into layer 1, and layer 2 never starts."""
    sys.path.insert(0, os.path.dirname(__file__) + "/..")
    import torch

    from sinkscope.capture.families import ModelSpec
    from sinkscope.probes import get_probe
    from sinkscope.forward.runner import run_probes
    from tiny_models import build, random_ids

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop

    model = build("llama")
    started: dict[int, float] = {}
    T = 16384

    def mark(index):
        def hook(_module, args, kwargs):  # the run's forward only (not the kernels' short self-check)
            hidden = args[0] if args else kwargs.get("hidden_states")
            if hidden is not None and hidden.shape[1] == T:
                started.setdefault(index, time.perf_counter())  # returns None: the inputs are unchanged
        return hook

    handles = [layer.register_forward_pre_hook(mark(i), with_kwargs=True) for i, layer in enumerate(model.model.layers)]
    tokens = random_ids(1, T).numpy()
    probe = get_probe("p0_mass")(ModelSpec.from_model(model))
    previous = signal.signal(signal.SIGTERM, stop)
    sent: list[float] = []

    def send():
        while 1 not in started:
            time.sleep(0.01)
        time.sleep(0.1)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=send, daemon=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        thread.start()
        with pytest.raises(Stop):
            run_probes(model, tokens, [probe], batch_size=1, progress=False)
        stopped = time.perf_counter()
    finally:
        torch.set_num_threads(threads)
        signal.signal(signal.SIGTERM, previous)
        for handle in handles:
            handle.remove()
        thread.join(timeout=60)
    layer_time = started[1] - started[0]
    assert 2 not in started, "the signal waited for the next layer"
    assert stopped - sent[0] <= layer_time + 1.0, (stopped - sent[0], layer_time)
