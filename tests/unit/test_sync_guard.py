"""The host-sync guard counts exactly the calls that would make the host wait for a device."""

from __future__ import annotations

import pytest
import torch

from sync_guard import HostSyncGuard, classify, no_host_sync


def dirty(x: torch.Tensor) -> None:
    """Thirteen host-synchronising calls, one of each kind, in this order."""
    x.sum().item()  # item
    float(x.max())  # __float__
    if x.mean() > -100:  # __bool__
        pass
    x[:2].tolist()  # tolist
    x.cpu()  # cpu
    x.to("cpu", torch.float64)  # to(cpu)
    x[x > 0]  # __getitem__[bool mask]
    int(x.argmax())  # __int__
    x.numpy()  # numpy
    [0, 1, 2, 3][x.argmin() % 4]  # __index__
    torch.nonzero(x)  # nonzero
    x[[0, 2]]  # __getitem__[list index]: host indices copied in
    torch.tensor([1.0, 2.0], device=x.device)  # tensor(host data, device=)


DIRTY_NAMES = ["item", "__float__", "__bool__", "tolist", "cpu", "to(cpu)", "__getitem__[bool mask]", "__int__",
               "numpy", "__index__", "nonzero", "__getitem__[list index]", "tensor(host data, device=)"]


def clean(x: torch.Tensor) -> torch.Tensor:
    """The same information kept on the device: no host sync."""
    total = x.sum()  # ()
    top, where = x.max(dim=0)  # (), ()
    positive = torch.where(x > 0, x, torch.zeros_like(x))  # (n,)
    y = x.to(torch.float64)  # dtype only
    picked = x.gather(0, where.view(1))  # (1,)
    sorted_x = torch.sort(x).values  # (n,)
    counts = torch.zeros(4, dtype=torch.int64).index_add_(0, (x > 0).long(), torch.ones_like(x, dtype=torch.int64))
    x[3] = total  # integer index: no sync
    x[1:3] = x[0]  # slices: no sync
    ones = torch.full((2,), 1.0, device=x.device)  # filled on the device: no copy
    return total + top + positive.sum() + y.sum() + picked.sum() + sorted_x[0] + counts.sum() + ones.sum()


def test_counts_each_kind_of_sync_once():
    x = torch.randn(16)
    with HostSyncGuard() as guard:
        dirty(x)
    assert guard.names() == DIRTY_NAMES
    assert guard.count == len(DIRTY_NAMES) == 13
    assert all("test_sync_guard.py" in call.where for call in guard.calls)  # call sites, not torch internals
    assert "13 host-synchronising calls" in guard.report()


def test_counts_nothing_in_clean_code():
    x = torch.randn(16)
    with HostSyncGuard() as guard:
        clean(x)
    assert guard.count == 0, guard.report()


def test_counts_repeats_and_stops_at_exit():
    x = torch.randn(8)
    with HostSyncGuard() as guard:
        for _ in range(5):
            x.sum().item()
    x.sum().item()  # outside: not counted
    assert guard.count == 5
    assert guard.report().splitlines()[1].split()[0] == "5"  # one call site, five times


def test_no_host_sync_raises_with_the_call_site():
    x = torch.randn(8)
    with no_host_sync():
        clean(x)
    with pytest.raises(AssertionError, match="1 host-synchronising calls"):
        with no_host_sync():
            bool(x.any())


def test_classify_device_moves():
    x = torch.randn(3)
    meta = torch.empty(3, device="meta")
    assert classify(torch.Tensor.to, (x, "cpu"), {}) == "to(cpu)"
    assert classify(torch.Tensor.to, (x, "cpu", torch.float64), {}) == "to(cpu)"
    assert classify(torch.Tensor.to, (x,), {"device": "cpu"}) == "to(cpu)"
    assert classify(torch.Tensor.to, (x, torch.float16), {}) is None
    assert classify(torch.Tensor.to, (x, "meta"), {}) is None
    assert classify(torch.Tensor.to, (x, x.device), {}) is None  # stays where it is (on a GPU too)
    assert classify(torch.Tensor.to, (meta, x.device), {}) == "to(cpu)"  # moves off a device
    assert classify(torch.Tensor.to, (meta, x), {}) == "to(cpu)"
    assert classify(torch.Tensor.copy_, (x, meta), {}) == "copy_(to cpu)"
    assert classify(torch.Tensor.copy_, (x, x), {}) is None
    assert classify(torch.Tensor.__setitem__, (x, x > 0, 0.0), {}) == "__setitem__[bool mask]"
    assert classify(torch.Tensor.__getitem__, (x, (slice(None), 0)), {}) is None
    assert classify(torch.repeat_interleave, (x, torch.tensor([1, 2, 0])), {}) == "repeat_interleave(tensor repeats)"
    assert classify(torch.repeat_interleave, (x, 2), {}) is None
    assert classify(torch.add, (x, x), {}) is None
