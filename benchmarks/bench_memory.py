"""Peak memory of the cases where memory used to follow a file's size, not the work asked for (issue 60).

    python benchmarks/bench_memory.py corpus [--mb 60]          # sinks / explore --text-file on a large text
    python benchmarks/bench_memory.py explorer [--windows 1 8 24] [--seq-len 1024]
    python benchmarks/bench_memory.py npz                        # report on a run folder with a planted explorer.npz
    python benchmarks/bench_memory.py seq-len [--seq-len 1000000]  # sinks --inputs random at a huge --seq-len
    python benchmarks/bench_memory.py sigterm [--seq-len 16384]  # seconds from SIGTERM to the exit

Each case runs ``python -m sinkscope ...`` in its own process under ``/usr/bin/time -f %M`` and prints
the peak resident set size (the kernel's ``ru_maxrss``), the exit code and the last line of stderr.
``SRC=/path/to/other/src`` runs another checkout's code (the baseline) with this one's venv.

Models: a tiny Llama (hidden 64, 3 layers; ``--layers 6`` for the explorer case, as the issue's) and a
byte-level BPE of 500 ids trained on the bundled Austen corpus, built once into ``$BENCH_DIR``
(default /tmp/sinkscope-bench-memory). The large text is the Austen corpus repeated to ``--mb`` MB.
Not a test; CI does not run it.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(os.environ.get("BENCH_DIR", "/tmp/sinkscope-bench-memory"))


def model_dir(layers: int = 3) -> Path:
    """A tiny Llama folder with a 500-id byte-level BPE trained on the Austen corpus (built once)."""
    folder = BENCH / f"llama-{layers}"
    if (folder / "config.json").is_file():
        return folder
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from sinkscope.data.corpus import bundled_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(bundled_corpus().documents, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=1 << 21)
    model = LlamaForCausalLM(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def big_text(mb: int) -> Path:
    """The Austen corpus repeated to ``mb`` MB (built once)."""
    path = BENCH / f"austen-{mb}mb.txt"
    if path.is_file():
        return path
    from sinkscope.data.corpus import bundled_corpus

    text = "\n\n".join(bundled_corpus().documents)
    data = text.encode("utf-8")
    BENCH.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        written = 0
        while written < mb * 1_000_000:
            handle.write(data)
            written += len(data)
    return path


def run(args: list[str], label: str, *, timeout: float = 1800, limit_gb: float | None = None) -> tuple[int, int]:
    """``python -m sinkscope ARGS`` under /usr/bin/time: prints and returns (peak RSS in bytes, exit code).

    ``limit_gb``: an address-space limit (``ulimit -v``), as a container's memory limit would be."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("BENCH_THREADS", "1"), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1")
    if os.environ.get("SRC"):
        env["PYTHONPATH"] = os.environ["SRC"]
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        started = time.perf_counter()
        limit = None if limit_gb is None else int(limit_gb * 1e9)
        process = subprocess.Popen(["/usr/bin/time", "-o", out.name, "-f", "%M", sys.executable, "-m", "sinkscope",
                                    *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                   start_new_session=True,  # its own group: a timeout stops python too, not only time
                                   preexec_fn=None if limit is None else lambda: resource.setrlimit(
                                       resource.RLIMIT_AS, (limit, limit)))
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            print(f"{label:<48} still running after {timeout:.0f} s (stopped)", flush=True)
            return 0, -1
        done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        wall = time.perf_counter() - started
        peak = int(out.read().strip().splitlines()[-1]) * 1024
    last = (done.stderr.strip().splitlines() or [""])[-1][:160]
    print(f"{label:<48} peak {peak / 1e9:6.2f} GB  exit {done.returncode:3d}  {wall:6.1f} s  {last}", flush=True)
    return peak, done.returncode


def corpus_case(opts) -> None:
    model, text = model_dir(), big_text(opts.mb)
    print(f"text: {text} ({text.stat().st_size / 1e6:.0f} MB)")
    with tempfile.TemporaryDirectory() as tmp:
        run(["sinks", str(model), "--text-file", str(text), "--seq-len", "64", "--n-seqs", "4", "--no-figures",
             "--explore-heads", "none", "--device", "cpu", "--out", f"{tmp}/sinks"], f"sinks --text-file {opts.mb} MB")
        run(["explore", str(model), "--text-file", str(text), "--seq-len", "64", "--no-figures", "--device", "cpu",
             "--out", f"{tmp}/explore"], f"explore --text-file {opts.mb} MB")


def explorer_case(opts) -> None:
    model = model_dir(opts.layers)
    with tempfile.TemporaryDirectory() as tmp:
        for n in opts.windows:
            for heads in opts.heads:
                run(["sinks", str(model), "--inputs", "random", "--seq-len", str(opts.seq_len), "--n-seqs", str(n),
                     "--explore-windows", str(n), "--explore-heads", heads, "--batch-size", str(opts.batch_size),
                     "--no-figures", "--device", "cpu", "--out", f"{tmp}/run-{n}-{heads}"],
                    f"explorer: {n} windows x {opts.seq_len}, heads {heads}, batch {opts.batch_size}")


def npz_case(opts) -> None:
    """A run folder whose explorer.npz member inflates to ``--inflate-gb`` GB, then ``sinkscope report`` on it."""
    import zipfile

    model = model_dir()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "run"
        run(["sinks", str(model), "--inputs", "random", "--seq-len", "32", "--n-seqs", "2", "--no-figures",
             "--device", "cpu", "--out", str(folder)], "the run to plant in")
        header = npy_header((int(opts.inflate_gb * 1e9) // 2,), "<u2")
        with zipfile.ZipFile(folder / "explorer.npz") as npz:
            others = {name: npz.read(name) for name in npz.namelist() if name != "codes.npy"}
        with zipfile.ZipFile(folder / "explorer.npz", "w", compression=zipfile.ZIP_DEFLATED) as npz:
            for name, data in others.items():
                npz.writestr(name, data)
            with npz.open("codes.npy", "w", force_zip64=True) as member:
                member.write(header)
                chunk = bytes(1 << 24)
                for _ in range(int(opts.inflate_gb * 1e9) // len(chunk)):
                    member.write(chunk)
        print(f"planted explorer.npz: {(folder / 'explorer.npz').stat().st_size / 1e6:.1f} MB on disk, "
              f"{opts.inflate_gb:g} GB inflated")
        run(["report", str(folder), "--out", f"{tmp}/page"], "report on the planted folder")
        (folder / "explorer.npz").unlink()
        (folder / "tokens.npy").write_bytes(npy_header((1_000_000, 1_000_000), "<i8") + bytes(64))
        code = ("import sinkscope, sys\nfrom sinkscope.run.result import Result\n"
                f"Result.load({str(folder)!r})\n")
        env = dict(os.environ, PYTHONPATH=os.environ.get("SRC", ""))
        with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
            done = subprocess.run(["/usr/bin/time", "-o", out.name, "-f", "%M", sys.executable, "-c", code],
                                  capture_output=True, text=True, env=env)
            peak = int(out.read().strip().splitlines()[-1]) * 1024
        print(f"{'Result.load, tokens.npy declaring 10**12 ids':<48} peak {peak / 1e9:6.2f} GB  exit "
              f"{done.returncode:3d}  {(done.stderr.strip().splitlines() or [''])[-1][:160]}")


def npy_header(shape: tuple, descr: str) -> bytes:
    """An npy (version 1.0) header alone, declaring ``shape`` of ``descr``."""
    text = ("{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)).encode("latin1")
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text


def seq_len_case(opts) -> None:
    model = model_dir()
    with tempfile.TemporaryDirectory() as tmp:
        run(["sinks", str(model), "--inputs", "random", "--seq-len", str(opts.seq_len), "--n-seqs", "1",
             "--batch-size", "1", "--no-figures", "--device", "cpu", "--out", f"{tmp}/run"],
            f"sinks --inputs random --seq-len {opts.seq_len}" + (f", ulimit -v {opts.limit_gb:g} GB" if opts.limit_gb else ""),
            timeout=opts.timeout, limit_gb=opts.limit_gb)


def sigterm_case(opts) -> None:
    """SIGTERM ``--after`` seconds into the forward; prints how long the process took to exit."""
    model = model_dir()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("BENCH_THREADS", "1"), HF_HUB_OFFLINE="1")
    if os.environ.get("SRC"):
        env["PYTHONPATH"] = os.environ["SRC"]
    with tempfile.TemporaryDirectory() as tmp:
        process = subprocess.Popen([sys.executable, "-m", "sinkscope", "sinks", str(model), "--inputs", "random",
                                    "--seq-len", str(opts.seq_len), "--n-seqs", "1", "--no-figures", "--device", "cpu",
                                    "--explore-heads", "none", "--out", f"{tmp}/run"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        # wait for the forward to begin: the windows are drawn before it
        deadline = time.time() + 120
        lines = []
        while time.time() < deadline:
            line = process.stderr.readline()
            lines.append(line)
            if "Drawing" in line or not line:
                break
        time.sleep(opts.after)
        sent = time.perf_counter()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=opts.timeout)
        took = time.perf_counter() - sent
    print(f"SIGTERM at --seq-len {opts.seq_len}: exit {process.returncode} {took:.2f} s after the signal; "
          f"{(err.strip().splitlines() or [''])[-1][:160]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="case", required=True)
    p = sub.add_parser("corpus")
    p.add_argument("--mb", type=int, default=60)
    p = sub.add_parser("explorer")
    p.add_argument("--windows", type=int, nargs="+", default=[1, 8, 24])
    p.add_argument("--heads", nargs="+", default=["auto", "all"])
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--layers", type=int, default=6)
    p = sub.add_parser("npz")
    p.add_argument("--inflate-gb", type=float, default=3.0)
    p = sub.add_parser("seq-len")
    p.add_argument("--seq-len", type=int, default=1_000_000)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--limit-gb", type=float, default=None, help="an address-space limit, as a container's")
    p = sub.add_parser("sigterm")
    p.add_argument("--seq-len", type=int, default=16384)
    p.add_argument("--after", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=900)
    opts = parser.parse_args()
    {"corpus": corpus_case, "explorer": explorer_case, "npz": npz_case, "seq-len": seq_len_case,
     "sigterm": sigterm_case}[opts.case](opts)


if __name__ == "__main__":
    main()
