"""Small exact statistics shared by probes."""

from __future__ import annotations

import torch
from torch import Tensor


def median(x: Tensor, dim: int = -1) -> Tensor:
    """The exact median along ``dim`` (mean of the two middle values for an even count).

    ``torch.median`` returns the lower middle value; numpy and SPEC's "median" mean this one.
    Works on tensors of any size (``torch.quantile`` refuses more than 2**24 elements).
    """
    n = x.shape[dim]
    lower = torch.kthvalue(x, (n + 1) // 2, dim=dim).values
    if n % 2:
        return lower
    upper = torch.kthvalue(x, n // 2 + 1, dim=dim).values
    return (lower + upper) / 2
