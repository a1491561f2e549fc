"""The only forward loop: windows in, probe accumulators filled.

A transformers model runs under :func:`sinkscope.capture.capture`; the bundled trainer's model
emits its records natively (``model(ids, tap=...)``, no hooks). Either way each attention layer
hands its record to every probe the moment it exists, and nothing per-token outlives the layer. The logits of the
LM head are not needed, so where the model supports it only the last position's are computed.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from typing import Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from sinkscope.capture import AttentionRecord, capture
from sinkscope.probes.base import Probe


class ProbeTap:
    """Dispatches captured tensors to probes (the capture's ``Tap``)."""

    def __init__(self, probes: Sequence[Probe]):
        self.probes = list(probes)
        self.residual_probes = [p for p in self.probes if p.needs_residual]

    def on_attention(self, record: AttentionRecord) -> None:
        for probe in self.probes:
            probe.observe_attention(record)

    def on_residual(self, layer: int, hidden: Tensor) -> None:
        for probe in self.residual_probes:
            probe.observe_residual(layer, hidden)


def _forward_kwargs(model: torch.nn.Module) -> dict:
    """``use_cache=False`` and, where accepted, ``logits_to_keep=1`` (skip the full LM head)."""
    kwargs = {"use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = 1
    return kwargs


def run_probes(
    model: torch.nn.Module,
    tokens: np.ndarray,
    probes: Sequence[Probe],
    *,
    batch_size: int = 4,
    device: torch.device | str | None = None,
    progress: bool = True,
    attention: str = "fused",
) -> None:
    """Run ``model`` over ``tokens`` (n_seqs, seq_len) in batches, feeding ``probes``.

    Results do not depend on ``batch_size``: probes only add per-sequence sums. ``attention``
    chooses the capture: ``"fused"`` (kernel log-sum-exp, memory linear in the sequence length)
    or ``"explicit"`` (the model's eager weights; the reference).
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    tap = ProbeTap(probes)
    kwargs = {} if hasattr(model, "model_spec") else _forward_kwargs(model)
    n = tokens.shape[0]
    starts = range(0, n, batch_size)
    bar = tqdm(starts, desc="batches", unit="batch", disable=not progress, file=sys.stderr,
               total=len(starts), dynamic_ncols=True)
    native = hasattr(model, "model_spec")  # sinkscope's trainer: records without hooks
    attached = contextlib.nullcontext() if native else capture(
        model, tap, residual=bool(tap.residual_probes), mode=attention)
    with attached, torch.inference_mode():
        for start in bar:
            ids = torch.from_numpy(np.ascontiguousarray(tokens[start:start + batch_size])).to(device)  # (B, T)
            if native:
                model(ids, tap=tap)
            else:
                model(input_ids=ids, **kwargs)
            bar.set_postfix(seqs=min(start + batch_size, n))
    bar.close()
