"""Overhead of a plan on each executor (issue 41): `--executor local` in this process against a local
process pool (`--jobs 2`), a local Ray cluster and submitit's local executor (`--executor slurm
--slurm-cluster local`).

    .venv/bin/python benchmarks/bench_executors.py [--plans 1] [--repeats 3] [--seq-len 128]

Each repeat runs `heads` on the same model `--plans` times (one plan alone by default; several make
one comparison) with SmolLM2-135M (`--model` another), on every executor in turn, interleaved,
fresh output folders each time; the numbers are medians. With one plan nothing runs side by side,
so the difference to the in-process run is the executor's own cost; with several, the engines also
run plans at once (a throughput, not an overhead). A plan on an engine pays a fresh Python process (imports of torch,
transformers and sinkscope), the engine's own hand-off, and the job's log; the model loads in
every plan on every executor alike. Per plan:

    overhead = (t_executor - t_in_process) / plans

Ray's cluster start (`ray.init`, once per command) is timed apart and not in the overhead; the
Ray cluster gets one CPU per plan at once (`num_cpus` = `--plans`), submitit runs every array task
at once. Torch runs one thread per process (`BENCH_THREADS`, as the other CPU scripts).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

THREADS = int(os.environ.get("BENCH_THREADS", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2-135M GGUF")
    parser.add_argument("--plans", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(THREADS)
    import ray

    from sinkscope.executors.settings import ExecutorOptions, check_executor
    from sinkscope.run.dispatch import execute
    from sinkscope.run.plan import plan
    from sinkscope.models.resolve import default_gguf_path

    model = args.model or str(default_gguf_path())
    engines = {"in process": ExecutorOptions(), "local --jobs 2": ExecutorOptions(jobs=2),
               "ray (local cluster)": ExecutorOptions(executor="ray"),
               "slurm (submitit local)": ExecutorOptions(executor="slurm", slurm_cluster="local")}
    for executor_options in engines.values():
        check_executor(executor_options)
    started = time.perf_counter()
    ray.init(num_cpus=args.plans, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray_start = time.perf_counter() - started
    times: dict[str, list[float]] = {name: [] for name in engines}
    root = Path(tempfile.mkdtemp(prefix="bench-executors-"))
    quiet = lambda message: None  # noqa: E731
    try:
        for repeat in range(args.repeats):
            for name, executor_options in engines.items():
                out = root / f"{repeat}-{name.split()[0]}"
                plans = plan("heads", {"seq_len": args.seq_len, "n_seqs": 1, "batch_size": 1, "progress": False,
                                       "figures": False, "out": str(out)}, models=[model] * args.plans)
                started = time.perf_counter()
                execute(plans, log=quiet, executor_options=executor_options)
                times[name].append(time.perf_counter() - started)
                shutil.rmtree(out)
                print(f"repeat {repeat}: {name:24s} {times[name][-1]:6.2f} s", flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(times["in process"])
    print(f"\n{args.plans} plans of `heads` ({Path(model).name}, {args.seq_len} tokens), median of {args.repeats}; "
          f"Ray cluster start {ray_start:.1f} s (once, not below)\n")
    print("| executor | wall (s) | overhead per plan (s) |")
    print("|---|---|---|")
    for name, values in times.items():
        wall = statistics.median(values)
        print(f"| {name} | {wall:.2f} | {(wall - base) / args.plans:+.2f} |")


if __name__ == "__main__":
    main()
