"""Data-parallel probe runs under ``torchrun`` (or ``accelerate launch``): split windows, merge.

    torchrun --nproc-per-node 2 -m sinkscope sinks MODEL ...

Each process takes a contiguous share of the windows (process r of W gets windows
[r*n/W, (r+1)*n/W)), runs the probes on its own device (``cuda:LOCAL_RANK`` when GPUs are
present, else the CPU), and the accumulators, which only add, are gathered on process 0 and
merged in process order, so the table equals a one-process run (up to float summation order).
Only process 0 writes the run folder. No home-made process pools: the launcher starts the
processes and ``torch.distributed`` (gloo on CPU, NCCL on GPU) moves the accumulators.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from sinkscope.probes.base import Probe


def world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) when not launched."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_distributed() -> bool:
    return world()[1] > 1


def init() -> None:
    """Join the process group the launcher set up (idempotent)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)


def local_device(requested: str) -> str:
    """``cuda:LOCAL_RANK`` when the run asks for (or defaults to) CUDA, else the request."""
    if requested in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return requested


def share(n: int, rank: int, size: int) -> tuple[int, int]:
    """The contiguous window range [start, stop) of process ``rank`` out of ``size``."""
    return n * rank // size, n * (rank + 1) // size


def merge_into_rank0(probes: Sequence[Probe], make_probes) -> bool:
    """Gather every process's accumulators; process 0 merges them (in rank order) into ``probes``.

    Args:
        probes: this process's probes.
        make_probes: builds fresh probes of the same kinds (to load other processes' states into).

    Returns:
        True on process 0 (whose ``probes`` now hold the merged accumulators).
    """
    import torch.distributed as dist

    rank, size = world()
    states = [None] * size
    dist.all_gather_object(states, [p.state_dict() for p in probes])
    if rank != 0:
        return False
    for other_state in states[1:]:
        others = make_probes()
        for mine, other, state in zip(probes, others, other_state):
            other.load_state_dict(state)
            mine.merge(other)
    return True


def broadcast_from_rank0(value):
    """Process 0's ``value`` (any picklable object) on every process."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def finish() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
