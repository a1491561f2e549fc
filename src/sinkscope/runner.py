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
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from sinkscope.capture import AttentionRecord, capture
from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import Probe


class ProbeTap:
    """Dispatches captured tensors to probes (the capture's ``Tap``)."""

    def __init__(self, probes: Sequence[Probe]):
        self.probes = list(probes)
        self.residual_probes = [p for p in self.probes if p.needs_residual]

    def on_attention(self, record: AttentionRecord) -> None:
        if not bool(torch.isfinite(record.query).all()):
            raise SinkscopeError(
                f"the model produced non-finite (NaN or inf) attention inputs at layer {record.layer}; its weights "
                "may be damaged, or --dtype too narrow (try --dtype float32)."
            )
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


def _input_device(model: torch.nn.Module) -> torch.device:
    """Where input ids go: the embedding's device (differs from parameters[0] when sharded)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "weight"):
        return embeddings.weight.device
    return next(model.parameters()).device


def run_probes(
    model: torch.nn.Module,
    tokens: np.ndarray,
    probes: Sequence[Probe],
    *,
    batch_size: int = 4,
    device: torch.device | str | None = None,
    progress: bool = True,
    attention: str = "fused",
    start: int = 0,
    on_batch_done: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> int:
    """Run ``model`` over ``tokens[start:]`` (n_seqs, seq_len) in batches, feeding ``probes``.

    Results do not depend on ``batch_size``: probes only add per-sequence sums. ``attention``
    chooses the capture: ``"fused"`` (kernel log-sum-exp, memory linear in the sequence length)
    or ``"explicit"`` (the model's eager weights; the reference). After each batch
    ``on_batch_done(next_window)`` is called (the caller checkpoints there).

    Out of memory: the batch's partial contributions are rolled back (probes are snapshot
    before each batch), the batch size is halved once and the batch retried, saying so; the
    numbers do not change. A second out-of-memory error is raised.

    Returns:
        The batch size finally used.
    """
    device = torch.device(device) if device is not None else _input_device(model)
    log = log or (lambda message: print(message, file=sys.stderr))
    tap = ProbeTap(probes)
    native = hasattr(model, "model_spec")  # sinkscope's trainer: records without hooks
    kwargs = {} if native else _forward_kwargs(model)
    n = tokens.shape[0]
    bar = tqdm(total=n, initial=start, desc="windows", unit="win", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    attached = contextlib.nullcontext() if native else capture(
        model, tap, residual=bool(tap.residual_probes), mode=attention)
    retried = False
    index = start
    with attached, torch.inference_mode():
        while index < n:
            snapshot = [p.state_dict() for p in probes]
            ids = torch.from_numpy(np.ascontiguousarray(tokens[index:index + batch_size])).to(device)  # (B, T)
            try:
                if native:
                    model(ids, tap=tap)
                else:
                    model(input_ids=ids, **kwargs)
            except torch.OutOfMemoryError:
                for probe, state in zip(probes, snapshot):
                    probe.load_state_dict(state)
                del ids
                if retried or batch_size == 1:
                    raise
                retried, batch_size = True, max(1, batch_size // 2)
                _free_cache(device)
                log(f"Out of memory; retrying with --batch-size {batch_size} (the numbers do not change).")
                continue
            index += ids.shape[0]
            bar.update(ids.shape[0])
            if on_batch_done is not None:
                on_batch_done(index)
    bar.close()
    return batch_size


def _free_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
