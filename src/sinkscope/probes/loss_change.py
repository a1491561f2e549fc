"""The loss change of one changed pass against the clean one, shared by ``head_ablation`` and ``massive_intervention``.

Both probes measure, on the same windows of every batch::

    loss_clean   = mean over windows and positions i = 0 .. T-2 of -log p(x_{i+1} | x_<=i)   (the ``loss`` point)
    loss_changed = the same on the probe's changed pass (heads zeroed, residual entries set)
    loss_delta   = loss_changed - loss_clean                                        (nats per token)

with the sums in float64 on the loss's device (no host read per batch). :class:`LossChange` is
that block: the two passes, the observer of the ``loss`` point on both, and the three numbers; a
probe adds what it changes (an ``@intervenes`` method acting on ``changed_pass`` only) and its rows.

Both run as a command's second stage (``heads --ablate-dormant``, ``sinks --massive-intervention``)
and keep their own clean pass there, although the first stage's pass is a clean pass of the same
windows: the first stage observes attention records, so it runs sinkscope's attention function
(``capture(mode="fused")``), while the second stage runs the model's own, and the two clean
losses differ in the last digits (1.7e-8 nats on the tiny Llama of the tests). Pairing the
changed pass with its own clean pass keeps the kernel round-off out of the loss change.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.probes.base import Probe, observes


class LossChange(Probe):
    """The loss of the clean pass (None) and of ``changed_pass``, on the same windows; see the module docstring.

    A subclass calls :meth:`setup_loss` in ``setup`` (``changes``: whether anything is changed;
    if not, only the clean pass runs and the changed loss is the clean one) and builds its rows
    from :meth:`losses`.
    """

    #: the label of the changed pass (the runner's pass label).
    changed_pass: ClassVar[str] = "changed"

    def setup_loss(self, changes: bool) -> None:
        self.changes = bool(changes)
        self.loss_sum = torch.zeros(2, dtype=torch.float64)  # clean, changed: summed cross-entropy
        self.loss_n = torch.zeros(2, dtype=torch.float64)  # clean, changed: predictions

    def passes(self) -> tuple[str | None, ...]:
        return (None, self.changed_pass) if self.changes else (None,)

    @observes(hooks.LOSS)
    def loss(self, layer: None, value: Tensor) -> None:  # value: (B, T-1)
        if self.loss_sum.device != value.device:  # accumulate where the loss lives (no host sync per batch)
            self.loss_sum, self.loss_n = self.loss_sum.to(value.device), self.loss_n.to(value.device)
        index = 1 if self.pass_label == self.changed_pass else 0
        self.loss_sum[index] += value.double().sum()
        self.loss_n[index] += value.numel()

    def losses(self) -> tuple[float, float, int]:
        """(clean loss, changed loss, predictions of the clean pass); NaN losses before any window."""
        sums, counts = self.loss_sum.cpu(), self.loss_n.cpu()
        n = int(counts[0])
        clean = float(sums[0] / counts[0]) if n else math.nan
        changed = float(sums[1] / counts[1]) if self.changes and counts[1] else clean
        return clean, changed, n
