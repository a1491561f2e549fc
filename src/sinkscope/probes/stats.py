"""Small exact statistics shared by probes."""

from __future__ import annotations

import torch
from torch import Tensor


def median(x: Tensor, dim: int = -1) -> Tensor:
    """The exact median along ``dim`` (mean of the two middle values for an even count).

    ``torch.median`` returns the lower middle value; numpy and SPEC's "median" mean this one.
    Works on tensors of any size (``torch.quantile`` refuses more than 2**24 elements). One
    selection (``kthvalue``) finds the lower middle value; the upper one is the smallest value
    above it, or the same value when it repeats.
    """
    n = x.shape[dim]
    lower = torch.kthvalue(x, (n + 1) // 2, dim=dim, keepdim=True).values
    if n % 2:
        return lower.squeeze(dim)
    at_or_below = (x <= lower).sum(dim=dim, keepdim=True)
    above = x.masked_fill(x <= lower, float("inf")).amin(dim=dim, keepdim=True)
    upper = torch.where(at_or_below > n // 2, lower, above)
    return ((lower + upper) / 2).squeeze(dim)
