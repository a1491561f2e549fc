"""Where the docs' times come from: every line of README.md's tour, and the longer runs it names, timed
as a user runs them (one `sinkscope` process each, wall time, cold imports included).

    python benchmarks/bench_doc_times.py                 # the tour (a few minutes on 2 cores)
    python benchmarks/bench_doc_times.py --long          # also train --tier tiny (extrapolated) and its checkpoint's sinks
    python benchmarks/bench_doc_times.py --json t.json   # keep the raw numbers

Each line runs in a fresh folder under a temporary directory (so `runs/...` and `ckpt/...` are its own),
with the repository's recipes/ linked in. `train --tier tiny` is timed over its first `--train-steps`
steps and extrapolated to the tier's 600 (the per-step time after the first checkpoint's overhead is
steady); the line says so. Print: a markdown table, line by line, for docs/costs.md "Where the docs'
times come from". Run it on an otherwise idle machine: the numbers are wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SINKSCOPE = [sys.executable, "-m", "sinkscope"]

#: README.md's quick tour, in its order
TOUR = [
    "sinks --out runs/smollm2",
    "heads --seq-len 256 --n-seqs 8 --ablate-dormant",
    "circuit --n-seqs 4 --seq-len 256 --bos none --subtract-head 0.6",
    "stream --cache 128,256 --seq-len 1024",
    'explore --text "The quick brown fox jumps over the lazy dog."',
    "run recipes/sinks-smollm2.toml --set n_seqs=4 --set out=runs/recipe",
    "report runs/smollm2 runs/recipe --label default --label recipe --out runs/compare",
    "ls runs runs",
    "ls probes",
]
#: the longer runs README names that this script times (after train); inject's 16 x 256 (26 min), circuit's 16 x 256
#: (14 min) and the three lengths (13.5 min) are timed on their own pages (inject.md, circuit.md, lengths.md)
LONG = [
    "sinks ckpt/sinklogit",
]
TINY_STEPS = 600


def run(line: str, folder: Path) -> float:
    """Wall seconds of ``sinkscope <line>`` in ``folder``; raises on a non-zero exit."""
    started = time.perf_counter()
    done = subprocess.run([*SINKSCOPE, *shlex.split(line), *(["--no-progress"] if _takes_progress(line) else [])],
                          cwd=folder, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"`sinkscope {line}` failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return seconds


def _takes_progress(line: str) -> bool:
    return line.split()[0] not in ("ls", "report", "run")


def train_tiny(folder: Path, steps: int) -> tuple[float, float]:
    """(seconds for ``steps`` steps of ``train --tier tiny``, the extrapolation to the tier's 600)."""
    seconds = run(f"train --variant sinklogit --tier tiny --seed 0 --out ckpt/sinklogit --stop-at {steps}", folder)
    return seconds, seconds / steps * TINY_STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--long", action="store_true", help="also the longer runs README names")
    parser.add_argument("--train-steps", type=int, default=50, help="steps of train --tier tiny timed (then extrapolated)")
    parser.add_argument("--json", help="save the raw numbers here")
    args = parser.parse_args()
    rows: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="sinkscope-doc-times-") as tmp:
        folder = Path(tmp)
        (folder / "recipes").symlink_to(REPO / "recipes")
        for line in TOUR:
            rows.append((line, run(line, folder), ""))
            print(f"{rows[-1][1]:8.1f} s  sinkscope {line}", file=sys.stderr, flush=True)
        if args.long:
            seconds, whole = train_tiny(folder, args.train_steps)
            rows.append(("train --variant sinklogit --tier tiny --seed 0 --out ckpt/sinklogit", whole,
                         f"{args.train_steps} steps in {seconds:.0f} s, x {TINY_STEPS // args.train_steps}"))
            print(f"{whole:8.1f} s  train --tier tiny (extrapolated)", file=sys.stderr, flush=True)
            for line in LONG:
                rows.append((line, run(line, folder), ""))
                print(f"{rows[-1][1]:8.1f} s  sinkscope {line}", file=sys.stderr, flush=True)
    print(f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, load average "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print("| command | wall | note |\n|---|---|---|")
    for line, seconds, note in rows:
        wall = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
        print(f"| `sinkscope {line}` | {wall} | {note} |")
    if args.json:
        Path(args.json).write_text(json.dumps([{"line": l, "seconds": s, "note": n} for l, s, n in rows], indent=1))


if __name__ == "__main__":
    main()
