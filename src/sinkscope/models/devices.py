"""Where and in what precision a model runs: ``--device``, ``--dtype`` and ``--device-map``, checked in a
second before anything loads (the trainer and the pipeline share them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sinkscope.errors import SinkscopeError, option

if TYPE_CHECKING:
    from sinkscope.models.resolve import Source

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the short names people type for them (PyTorch's and most tools' spellings).
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32"}
#: the device types sinkscope runs on (its kernels and tests cover these).
DEVICE_TYPES = ("cpu", "cuda")
#: accelerate's placement strategies for --device-map (transformers' ``check_and_set_device_map``).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda if available, else cpu; otherwise the named device, checked before any loading.

    Only ``cpu`` and ``cuda[:N]`` are accepted (``mps``, ``xpu``, ``meta``, ... are refused in
    one sentence), and ``cuda:N`` must name a visible GPU.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as error:
        raise SinkscopeError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N.") from error
    if resolved.type not in DEVICE_TYPES:
        raise SinkscopeError(f"{option('device')} {device} is not supported; sinkscope runs on cpu or cuda (auto picks cuda "
                             "when a GPU is available).")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise SinkscopeError(f"{option('device')} {device} was asked for but no CUDA GPU is available; use {option('device')} cpu.")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise SinkscopeError(f"{option('device')} {device} names GPU {resolved.index}, but {count} GPU(s) are visible; "
                             f"use cuda:0 to cuda:{count - 1}.")
    return resolved


def check_device_map(device_map: str | dict | None, source: Source | None = None) -> None:
    """``--device-map`` must be one of accelerate's strategies, for a transformers model (before loading)."""
    if device_map is None or isinstance(device_map, dict):
        return
    if device_map not in DEVICE_MAPS:
        raise SinkscopeError(f"unknown {option('device_map')} {device_map!r}; use {', '.join(DEVICE_MAPS)} "
                             f"(or {option('device')} to put the whole model on one device).")
    if source is not None and source.kind == "checkpoint":
        raise SinkscopeError(f"{option('device_map')} is for transformers models; a trainer checkpoint runs on one {option('device')}.")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> float32 on CPU, bfloat16 on GPU; otherwise float32/bfloat16/float16 (or fp32, bf16, fp16, half)."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    dtype = DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if dtype not in DTYPES:
        raise SinkscopeError(f"unknown dtype {dtype!r}; use auto, {', '.join(DTYPES)} (or fp32, bf16, fp16).")
    return DTYPES[dtype]
