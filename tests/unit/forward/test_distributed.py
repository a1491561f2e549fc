"""``sinkscope.forward.distributed`` in one process: the launcher's environment, the window shares, the merge.

Checked: ``world`` and ``is_distributed`` read RANK and WORLD_SIZE ((0, 1) when not launched);
``local_device`` picks ``cuda:LOCAL_RANK`` only for CUDA requests on a machine with CUDA; ``share``
splits n windows into contiguous, disjoint, near-equal ranges covering all of them; a real
one-process gloo group joins twice without harm, merges (nothing to add), broadcasts and ends;
and ``merge_into_rank0`` with two processes' states faked into the gather: process 0's probes
merged with process 1's equal a single run over all the windows, and process 1 gets False.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from sinkscope.forward import distributed
from conftest import free_port


@pytest.fixture
def launched(monkeypatch):
    """Sets the launcher's variables: ``launched(rank, size, local_rank=None)``."""
    def launch(rank: int, size: int, local_rank: int | None = None):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(size))
        if local_rank is not None:
            monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return launch


# ---- the environment ----------------------------------------------------------------------------------------


def test_not_launched_is_one_process(launched):
    assert distributed.world() == (0, 1)
    assert distributed.is_distributed() is False


@pytest.mark.parametrize("rank, size", [(0, 1), (0, 2), (3, 4)])
def test_world_reads_the_launchers_variables(launched, rank, size):
    launched(rank, size)
    assert distributed.world() == (rank, size)
    assert distributed.is_distributed() is (size > 1)


def test_local_device_without_cuda_is_the_request(launched, monkeypatch):
    launched(1, 2, local_rank=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for requested in ("auto", "cuda", "cpu", "cuda:3"):
        assert distributed.local_device(requested) == requested


def test_local_device_with_cuda_is_the_local_rank(launched, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    launched(5, 8, local_rank=1)
    assert distributed.local_device("auto") == distributed.local_device("cuda") == "cuda:1"
    assert distributed.local_device("cpu") == "cpu" and distributed.local_device("cuda:0") == "cuda:0"
    monkeypatch.delenv("LOCAL_RANK")
    assert distributed.local_device("cuda") == "cuda:0"


@pytest.mark.parametrize("n", [0, 1, 5, 7, 16])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_shares_are_contiguous_disjoint_near_equal_and_cover_every_window(n, size):
    ranges = [distributed.share(n, rank, size) for rank in range(size)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(stop == next_start for (_, stop), (next_start, _) in zip(ranges, ranges[1:]))
    lengths = [stop - start for start, stop in ranges]
    assert min(lengths) >= 0 and max(lengths) - min(lengths) <= 1 and sum(lengths) == n


# ---- the merge ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama():
    """A tiny Llama and 4 windows (the probe registry imported here, once, rather than inside a test)."""
    from sinkscope.probes import discover
    from tiny_models import build, random_ids

    discover()
    return build("llama"), random_ids(4, 12, seed=7).numpy()


def run(model, tokens, names=("p0_mass", "sink_rate")):
    from sinkscope.capture import ModelSpec
    from sinkscope.probes import get_probe
    from sinkscope.forward.runner import run_probes

    spec = ModelSpec.from_model(model)

    def make():
        return [get_probe(name)(spec) for name in names]

    probes = make()
    run_probes(model, tokens, probes, batch_size=2, progress=False)
    return probes, make


def values(probes) -> list[tuple]:
    return [(r.probe, r.metric, r.layer, r.head, r.n, r.value) for p in probes for r in p.rows()]


def test_process_0_merges_the_other_processes_states_into_a_whole_run(llama, launched, monkeypatch):
    model, tokens = llama
    launched(0, 2)
    first, second = (distributed.share(len(tokens), rank, 2) for rank in range(2))
    mine, make = run(model, tokens[slice(*first)])
    theirs, _ = run(model, tokens[slice(*second)])

    def gather(states, my_states):  # what all_gather_object hands process 0: every process's states, in order
        states[:] = [my_states, [p.state_dict() for p in theirs]]

    monkeypatch.setattr(dist, "all_gather_object", gather)
    assert distributed.merge_into_rank0(mine, make) is True
    whole, _ = run(model, tokens)
    merged, expected = values(mine), values(whole)
    assert [row[:5] for row in merged] == [row[:5] for row in expected]  # same rows, same counts
    assert [row[5] for row in merged] == pytest.approx([row[5] for row in expected], rel=1e-6, abs=1e-9)


def test_other_processes_only_send_their_states(llama, launched, monkeypatch):
    model, tokens = llama
    launched(1, 2)
    mine, make = run(model, tokens[2:])
    before = values(mine)
    sent = []
    monkeypatch.setattr(dist, "all_gather_object", lambda states, my_states: sent.append(my_states))
    assert distributed.merge_into_rank0(mine, make) is False
    assert values(mine) == before and len(sent) == 1 and len(sent[0]) == len(mine)


def test_a_real_one_process_group(llama, launched, monkeypatch):
    if not dist.is_available():
        pytest.skip("torch.distributed is not built in")
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    model, tokens = llama
    launched(0, 1, local_rank=0)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # gloo, as on the CPU machines
    try:
        distributed.init()
        distributed.init()  # joining again is harmless
        assert dist.is_initialized() and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        probes, make = run(model, tokens)
        before = values(probes)
        assert distributed.merge_into_rank0(probes, make) is True
        assert values(probes) == before  # nothing to merge from a single process
        payload = {"heads": ("0.1", "2.3"), "clean_n": 44}
        assert distributed.broadcast_from_rank0(payload) == payload
    finally:
        distributed.finish()
    assert not dist.is_initialized()
    distributed.finish()  # ending twice is harmless
