"""models/devices.py: --device, --dtype and --device-map checked before anything loads (one sentence each)."""

from __future__ import annotations

import pytest
import torch

from sinkscope.models.devices import check_device_map, resolve_device, resolve_dtype
from sinkscope.errors import SinkscopeError
from sinkscope.models.resolve import Source


def test_auto_and_named_devices():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(SinkscopeError, match="sinkscope runs on cpu or cuda"):
        resolve_device("meta")
    with pytest.raises(SinkscopeError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")


def test_dtypes_follow_the_device():
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(SinkscopeError, match="unknown dtype 'int8'"):
        resolve_dtype("int8", torch.device("cpu"))


def test_device_maps_are_accelerates_and_not_for_checkpoints():
    check_device_map(None)
    check_device_map("auto", Source("folder", "m", "m"))
    with pytest.raises(SinkscopeError, match="unknown --device-map 'everywhere'"):
        check_device_map("everywhere")
    with pytest.raises(SinkscopeError, match="a trainer checkpoint runs on one --device"):
        check_device_map("auto", Source("checkpoint", "ck", "ck"))


def test_the_short_dtype_names_are_aliases():
    """issue 61, item 10: fp16/bf16 (and fp32, half) as PyTorch users type them."""
    import torch

    from sinkscope.errors import SinkscopeError
    from sinkscope.models.devices import resolve_dtype

    cpu = torch.device("cpu")
    assert [resolve_dtype(name, cpu) for name in ("bf16", "fp16", "fp32", "half", "BF16")] == [
        torch.bfloat16, torch.float16, torch.float32, torch.float16, torch.bfloat16]
    import pytest

    with pytest.raises(SinkscopeError, match="unknown dtype 'int8'; use auto, float32, bfloat16, float16 \\(or fp32"):
        resolve_dtype("int8", cpu)
