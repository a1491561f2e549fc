"""What the explorer adds to a measurement, kept in the measuring forward or in a pass of its own (issue 56, item 2).

SmolLM2-135M-Instruct (float32, CPU) through ``sinkscope.measure`` (no files written, the model loaded once), on
windows of the bundled corpus, three ways per shape, interleaved over ``--repeats`` (median):

    without        --explore-windows 0
    riding         the default explorer (2 windows, auto heads): its probe rides the measuring forward
    second pass    the same explorer read in a pass of its own after the measurement (what every run did
                   before issue 56, and what a resumed or multi-process run still does)

Prints each time and the ratio to ``without`` (target for ``riding``: <= 1.1x at 2 x 4,096 and at 16 x 512). Run at
one thread per free core:

    BENCH_THREADS=1 OMP_NUM_THREADS=1 python benchmarks/bench_explorer_cost.py --shapes 16x512 2x4096 --command sinks
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_pca_sketch import corpus_windows  # noqa: E402
from bench_sinks import THREADS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["16x512", "2x4096"])
    parser.add_argument("--command", default="sinks")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    import torch

    import sinkscope
    from sinkscope.models.resolve import resolve_source
    from sinkscope.run import measuring, stages
    from sinkscope.run.loaders import load_model

    torch.set_num_threads(THREADS)
    loaded = load_model(resolve_source(None), device="cpu", dtype="float32", log=lambda m: None)
    riding_rider = measuring.explorer_rider

    def no_rider(prepared, loaded):  # what every run did before issue 56: the explorer's own pass after
        return None, None

    def run(windows, way: str) -> float:
        stages.explorer_rider = riding_rider if way == "riding" else no_rider
        options = {"explore_windows": 0} if way == "without" else {}
        started = time.perf_counter()
        result = sinkscope.measure(args.command, loaded.model, windows=windows, progress=False, log=lambda m: None,
                                   **options)
        seconds = time.perf_counter() - started
        assert (result.explorer is None) == (way == "without")
        return seconds

    print(f"SmolLM2-135M-Instruct (float32), `{args.command}` through sinkscope.measure, {THREADS} thread(s), "
          f"median of {args.repeats}\n")
    print("| windows | without the explorer | riding the measuring forward | a pass of its own |\n|---|---|---|---|")
    for shape in args.shapes:
        n, length = (int(x) for x in shape.lower().split("x"))
        windows = corpus_windows(loaded.tokenizer, n, length).numpy()
        times: dict[str, list[float]] = {}
        run(windows[:1, :64], "riding")  # warm-up
        for _ in range(args.repeats):
            for way in ("without", "riding", "second pass"):
                times.setdefault(way, []).append(run(windows, way))
        med = {way: statistics.median(v) for way, v in times.items()}
        base = med["without"]
        print(f"| {n} x {length:,} | {base:.1f} s | {med['riding']:.1f} s ({med['riding'] / base:.2f}x) | "
              f"{med['second pass']:.1f} s ({med['second pass'] / base:.2f}x) |", flush=True)
    stages.explorer_rider = riding_rider


if __name__ == "__main__":
    main()
