"""Count the calls that would make the host wait for an accelerator, on any device (CPU in CI).

    from sync_guard import HostSyncGuard, no_host_sync

    with HostSyncGuard() as guard:
        fn(x)
    assert guard.count == 0, guard.report()

    with no_host_sync():  # the same, raising AssertionError with the call sites on exit
        fn(x)

On CUDA these calls copy device memory to the host or need a value the device has not yet
computed, so the CPU stops queueing work until the GPU catches up. On CPU tensors they are
cheap, but they are the same calls, so a test on CPU tensors finds them before a GPU run does.
The guard is a :class:`torch.overrides.TorchFunctionMode`: it sees every torch function and
tensor method called from Python inside the block (not calls torch makes internally).

Counted (``SYNC_METHODS`` / ``SYNC_FUNCTIONS``):

- reading a value on the host: ``Tensor.item``, ``tolist``, ``numpy``, ``__bool__`` (``if t``,
  ``and``/``or``/``not``), ``__float__``, ``__int__``, ``__index__`` (a tensor as a Python
  index or ``range`` bound), ``__complex__``, ``__array__``, ``__format__``/``__repr__``/``__str__``;
- copies to host memory: ``Tensor.cpu``, ``Tensor.to("cpu")``, and ``Tensor.to`` / ``Tensor.copy_``
  with a ``torch.device`` or tensor target when they move a tensor off a device. (So
  ``x.to(y.device)``, which on a GPU stays on the GPU, is not counted on CPU tensors; the price
  is that ``x.to(torch.device("cpu"))`` is not either: write host moves as ``.cpu()`` or
  ``.to("cpu")``.)
- host data copied to the device, which torch does with a blocking copy (the host waits for the
  stream): ``torch.tensor``/``torch.as_tensor`` with a ``device`` argument, and indexing or
  assigning with a Python list (the list becomes a host index tensor). (A CPU tensor moved with
  ``.to(x.device)`` is the same on a GPU but cannot be told apart on CPU tensors.)
- ops whose output size depends on the data (they read a count back before allocating):
  ``nonzero``, ``argwhere``, ``masked_select``, ``unique``, ``unique_consecutive``, ``bincount``,
  ``repeat_interleave`` with tensor repeats, indexing or assigning with a boolean mask,
  ``torch.equal``, ``allclose`` (return Python bools).
"""

from __future__ import annotations

import contextlib
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch.overrides import TorchFunctionMode

_T = torch.Tensor

#: tensor methods that always read device memory back on the host.
SYNC_METHODS = {
    _T.item: "item", _T.tolist: "tolist", _T.numpy: "numpy", _T.__bool__: "__bool__",
    _T.__float__: "__float__", _T.__int__: "__int__", _T.__index__: "__index__",
    _T.__complex__: "__complex__", _T.__array__: "__array__", _T.__format__: "__format__",
    _T.__repr__: "__repr__", _T.cpu: "cpu", _T.nonzero: "nonzero", _T.argwhere: "argwhere",
    _T.masked_select: "masked_select", _T.unique: "unique", _T.unique_consecutive: "unique_consecutive",
    _T.bincount: "bincount", _T.__str__: "__str__",
}
#: torch functions that always do.
SYNC_FUNCTIONS = {
    torch.nonzero: "nonzero", torch.argwhere: "argwhere", torch.masked_select: "masked_select",
    torch.unique: "unique", torch.unique_consecutive: "unique_consecutive", torch.bincount: "bincount",
    torch.equal: "equal", torch.allclose: "allclose",
}
_HERE = str(Path(__file__).resolve())
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def _is_cpu_target(value) -> bool:
    if isinstance(value, str):
        return torch.device(value).type == "cpu"
    if isinstance(value, torch.device):
        return value.type == "cpu"
    return False


def _is_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


def _is_list_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, list) for i in items)


def classify(func, args: tuple, kwargs: dict) -> str | None:
    """The name under which a call is counted, or None when it keeps the host free."""
    if func in SYNC_METHODS:
        return SYNC_METHODS[func]
    if func in SYNC_FUNCTIONS:
        return SYNC_FUNCTIONS[func]
    if func is _T.to:
        target = kwargs.get("device")
        positional = [a for a in args[1:] if isinstance(a, (str, torch.device, torch.Tensor))]
        if target is None and positional:
            target = positional[0]
        if isinstance(target, str):  # an explicit host move: .to("cpu")
            return "to(cpu)" if _is_cpu_target(target) else None
        if isinstance(target, (torch.device, torch.Tensor)):  # .to(x.device), .to(x): only if it moves
            device = target if isinstance(target, torch.device) else target.device
            return "to(cpu)" if device.type == "cpu" and args[0].device.type != "cpu" else None
        return None
    if func is _T.copy_:
        dst, src = args[0], args[1]
        if dst.device.type == "cpu" and isinstance(src, torch.Tensor) and src.device.type != "cpu":
            return "copy_(to cpu)"
        return None
    if func in (_T.__getitem__, _T.__setitem__):
        if _is_bool_index(args[1]):
            return f"{func.__name__}[bool mask]"
        return f"{func.__name__}[list index]" if _is_list_index(args[1]) else None
    if func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
        return f"{func.__name__}(host data, device=)"
    if func in (torch.repeat_interleave, _T.repeat_interleave):
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return "repeat_interleave(tensor repeats)" if isinstance(repeats, torch.Tensor) else None
    return None


@dataclass
class SyncCall:
    """One counted call: what it was and where it was made (the first frame outside torch)."""

    name: str
    where: str


class HostSyncGuard(TorchFunctionMode):
    """Records every host-synchronising call made inside the ``with`` block.

    Attributes:
        calls: the counted calls (:class:`SyncCall`), in order.
    """

    def __init__(self):
        super().__init__()
        self.calls: list[SyncCall] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = classify(func, args, kwargs)
        if name is not None:
            self.calls.append(SyncCall(name, _caller()))
        return func(*args, **kwargs)

    @property
    def count(self) -> int:
        return len(self.calls)

    def names(self) -> list[str]:
        return [call.name for call in self.calls]

    def report(self) -> str:
        """One line per call site: count, name, file:line."""
        sites: dict[tuple[str, str], int] = {}
        for call in self.calls:
            sites[(call.name, call.where)] = sites.get((call.name, call.where), 0) + 1
        lines = [f"{n:>5} x {name:<28} {where}" for (name, where), n in sorted(sites.items(), key=lambda kv: -kv[1])]
        return f"{self.count} host-synchronising calls\n" + "\n".join(lines)


def _caller() -> str:
    """file:line of the innermost frame that is neither this module nor torch."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = str(Path(frame.filename).resolve())
        if path != _HERE and not path.startswith(_TORCH_DIR):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


@contextlib.contextmanager
def no_host_sync() -> Iterator[HostSyncGuard]:
    """A guard that fails (AssertionError listing the call sites) if anything inside synced."""
    with HostSyncGuard() as guard:
        yield guard
    assert guard.count == 0, guard.report()
