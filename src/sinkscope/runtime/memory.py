"""How much memory this process may still use, read before anything large is allocated.

:func:`available_memory` is what a model's weights may take (RAM plus the accelerators' free memory,
``models.size``); :func:`ram_available` is what a CPU-side allocation may take (the least of
MemAvailable, the memory cgroup's room and ``ulimit -v``'s room: a window draw, a forward on the
CPU, a file read whole).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def available_memory() -> int | None:
    """Bytes this process could use for weights: available RAM (Linux's MemAvailable, else the physical
    total), plus the accelerators' free memory when torch is already imported; None when unknown."""
    total = None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    total = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            for index in range(torch.cuda.device_count()):
                total += torch.cuda.mem_get_info(index)[0]
        except Exception:  # noqa: BLE001 - no usable accelerator: RAM alone
            pass
    return total


def ram_available() -> int | None:
    """Bytes of RAM this process may still use, or None where nothing says: the least of Linux's
    MemAvailable, its memory cgroup's room (``memory.max - memory.current``, a container's limit) and
    its address-space limit's room (``ulimit -v`` less what is mapped).

    Unlike :func:`available_memory` it counts no accelerator (and so never starts CUDA): what a
    window draw, or a forward on the CPU, has (:func:`free_memory`).
    """
    found = [_meminfo_available(), _cgroup_room(), _address_space_room()]
    known = [n for n in found if n is not None]
    return max(0, min(known)) if known else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


#: (limit, usage) files of a memory cgroup: v2's, then v1's; a limit this large is none.
_CGROUP_FILES = (("", "memory.max", "memory.current", "inactive_file"),
                 ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
_NO_LIMIT = 1 << 60


def _cgroup_room(groups: str = "/proc/self/cgroup", mounted: str = "/sys/fs/cgroup") -> int | None:
    """Room left under this process's memory cgroup limit: limit - usage + the inactive file cache the
    kernel reclaims first (v2 ``memory.max``, v1 ``memory.limit_in_bytes``); None without a limit."""
    try:
        with open(groups, encoding="ascii") as handle:
            lines = [line.strip().split(":", 2) for line in handle]
    except OSError:
        return None
    for controller, limit_file, usage_file, inactive in _CGROUP_FILES:
        paths = [p for _, names, p in lines if (names == "" if not controller else controller in names.split(","))]
        root = Path(mounted) / controller
        for folder in [root / p.lstrip("/") for p in paths] + [root]:  # the process's group, or a namespace's root
            try:
                limit = (folder / limit_file).read_text(encoding="ascii").strip()
                usage = int((folder / usage_file).read_text(encoding="ascii").strip())
            except (OSError, ValueError):
                continue
            if limit == "max" or not limit.isascii() or not limit.isdigit() or int(limit) >= _NO_LIMIT:
                return None
            cache = 0
            try:
                for line in (folder / "memory.stat").read_text(encoding="ascii").splitlines():
                    name, _, value = line.partition(" ")
                    if name == inactive:
                        cache = int(value)
            except (OSError, ValueError):
                pass
            return int(limit) - usage + cache
    return None


def _address_space_room() -> int | None:
    """``RLIMIT_AS`` less the address space mapped now (``VmSize``), None without a limit."""
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status", encoding="ascii") as handle:
            size = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmSize:"))
        return limit - size
    except (OSError, ValueError, ImportError, StopIteration, IndexError):
        return None


def free_memory(device) -> int | None:
    """Bytes a forward on ``device`` can still allocate: a CUDA device's free memory plus what torch's
    allocator holds unused; on the CPU, available RAM (Linux's MemAvailable); None where unknown."""
    if device.type == "cuda":
        import torch

        try:
            free, _ = torch.cuda.mem_get_info(device)
            return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
        except RuntimeError:
            return None
    return ram_available() if device.type == "cpu" else None
