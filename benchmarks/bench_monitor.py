"""Overhead of the sink monitor on the bundled trainer's `tiny` tier (issue 29: at most 2%).

    .venv/bin/python benchmarks/bench_monitor.py [--every 100] [--repeats 5]

The `tiny` tier's model (4 layers x 4 heads x 128, context 128, vocabulary 4,096) trains on
random ids at the tier's batch (32 sequences, AdamW, as `sinkscope train` steps). The training
step and one monitor measurement (``SinkMonitor.measure``: the default probes on 8 windows of 128
tokens, the trainer's ``--monitor-every`` windows) are timed interleaved, so load on the machine
hits both alike; medians over ``--repeats``. The overhead at ``--every N`` is

    overhead = t_monitor / (N * t_step)

which is what ``--monitor-every N`` adds to the wall time of training (the monitor runs once
every N steps, nothing in between).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from sinkscope.train.monitor import DEFAULT_PROBES, SinkMonitor
    from sinkscope.train.loop import MONITOR_WINDOWS
    from sinkscope.train.config import TIER_TRAINING
    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    config = GPTConfig.from_tier("tiny", vocab_size=4096)
    torch.manual_seed(0)
    model = GPT(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    batch = TIER_TRAINING["tiny"]["batch_size"]
    T = config.block_size
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, config.vocab_size, (batch, T), generator=generator)
    y = torch.randint(0, config.vocab_size, (batch, T), generator=generator)
    windows = np.random.default_rng(0).integers(0, config.vocab_size, (MONITOR_WINDOWS, T))
    monitor = SinkMonitor(every=args.every, windows=windows)

    def train_step() -> None:
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    train_step()  # warm-up: allocations, the optimizer's state
    monitor.measure(model)  # warm-up: discovery of the spec
    steps, measures = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        train_step()
        steps.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        monitor.measure(model)
        measures.append(time.perf_counter() - t0)
    t_step, t_monitor = statistics.median(steps), statistics.median(measures)
    print(f"tier tiny: {config.n_layer}L x {config.n_head}H x {config.n_embd}, batch {batch} x {T} tokens; "
          f"monitor: {', '.join(DEFAULT_PROBES)} on {MONITOR_WINDOWS} x {T} tokens; threads {torch.get_num_threads()}")
    print(f"training step  {t_step * 1e3:8.1f} ms (median of {args.repeats})")
    print(f"monitor        {t_monitor * 1e3:8.1f} ms (median of {args.repeats})")
    for every in sorted({args.every, 50, 100, 500}):
        print(f"--monitor-every {every:4d}: overhead {100 * t_monitor / (every * t_step):.2f}% of the training time")


if __name__ == "__main__":
    main()
