"""The loss change of one changed pass against the clean one, shared by ``head_ablation`` and ``massive_intervention``.

Both probes measure, on the same windows::

    loss_clean   = mean over windows and positions i = 0 .. T-2 of -log p(x_{i+1} | x_<=i)   (the ``loss`` point)
    loss_changed = the same on the probe's changed pass (heads zeroed, residual entries set)
    loss_delta   = loss_changed - loss_clean                                        (nats per token)

with the sums in float64 on the loss's device (no host read per batch). :class:`LossChange` is
that second-stage block: the observer of the ``loss`` point on both passes and the three numbers.
Their ``n`` is the number of windows (SPEC.md "Tables"). They carry no ``se``: only the sums over
every prediction are kept (the second stage receives the first stage's sum, not its windows'
losses), so no per-window loss exists to take a standard error over.

The clean loss of a second stage (``heads --ablate-dormant``, ``sinks --massive-intervention``)
is the loss of the first stage's clean pass, which ran over the same windows in the same batches:
the first stage's probe sums it (:class:`CleanLossSum`, its ``clean_loss`` parameter, set by the
command), the command's followup hands the sum and the count to the second stage's probe
(``clean_sum``, ``clean_n``: :meth:`CleanLossSum.clean_loss_params`), and the second stage runs
the changed pass alone: 1 + 1 forward passes per batch instead of 1 + 2. Without ``clean_sum``
(``sinkscope measure --probe head_ablation``) the probe runs its own clean pass.

Both stages run one kernel. The first stage observes attention records, so its passes run
sinkscope's attention function (``capture``); a second stage reads no record, and would run the
model's own implementation (eager, as loaded: a different softmax, 1.7e-8 nats apart on the
tiny Llama of the tests, and quadratic memory). Both classes below set ``attention_function``,
so the changed pass runs sinkscope's function too, in the run's ``--attention`` mode, and the
loss change is a difference of two passes of the same kernel (tested against a hand computation
in ``tests/integration/test_loss_change_stages.py``). Families read through the eager fallback run the
model's own attention in both stages.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.probes.base import Param, Probe, non_negative, observes


#: the second stage's parameters: the clean loss its first stage summed (absent: the probe runs its own clean pass).
CLEAN_PARAMS = (
    Param("clean_sum", float, None, "the summed clean next-token loss of the first stage over the same windows "
          "(set by the command's second stage; absent: the probe runs its own clean pass)", optional=True),
    Param("clean_n", int, 0, "the predictions behind clean_sum", check=non_negative),
    Param("clean_windows", int, 0, "the windows behind clean_sum (the rows' n)", check=non_negative),
)

#: the first stage's parameter: also sum the clean pass's loss, for a second stage's loss change.
CLEAN_LOSS_PARAM = Param("clean_loss", bool, False,
                         "also sum the clean pass's next-token loss (for the command's second stage)")


class LossChange(Probe):
    """The loss of the clean pass (None) and of ``changed_pass``, on the same windows; see the module docstring.

    A subclass calls :meth:`setup_loss` in ``setup`` (``changes``: whether anything is changed at
    all) and builds its rows from :meth:`losses`; it declares :data:`CLEAN_PARAMS` among its params.
    """

    #: the label of the changed pass.
    changed_pass: ClassVar[str] = "changed"
    #: the changed pass runs the first stage's kernel (see the module docstring).
    attention_function: ClassVar[bool] = True

    def setup_loss(self, changes: bool) -> None:
        self.changes = bool(changes)
        self.loss_sum = torch.zeros(2, dtype=torch.float64)  # clean, changed: summed cross-entropy
        self.loss_n = torch.zeros(2, dtype=torch.float64)  # clean, changed: predictions
        self.loss_windows = torch.zeros(2, dtype=torch.int64)  # clean, changed: windows (on the CPU: shapes only)

    @property
    def clean_given(self) -> bool:
        """Whether the clean loss came from the first stage (so no clean pass runs here)."""
        return self.clean_sum is not None

    def passes(self) -> tuple[str | None, ...]:
        """The clean pass unless the first stage measured it, and the changed pass if anything changes."""
        clean = () if self.clean_given else (None,)
        return clean + ((self.changed_pass,) if self.changes else ())

    @observes(hooks.LOSS)
    def loss(self, layer: None, value: Tensor) -> None:  # value: (B, T-1)
        if self.loss_sum.device != value.device:  # accumulate where the loss lives (no host sync per batch)
            self.loss_sum, self.loss_n = self.loss_sum.to(value.device), self.loss_n.to(value.device)
        index = 1 if self.pass_label == self.changed_pass else 0
        self.loss_sum[index] += value.double().sum()
        self.loss_n[index] += value.numel()
        self.loss_windows[index] += value.shape[0]

    def losses(self) -> tuple[float, float, int]:
        """(clean loss, changed loss, windows): the changed loss is the clean one when nothing changes.

        The windows are the rows' ``n``: the clean pass's (the first stage's where it measured it).
        """
        sums, counts = self.loss_sum.tolist(), self.loss_n.tolist()  # float64 sums -> Python floats
        windows = int(self.loss_windows[0])
        if self.clean_given:
            sums[0], counts[0], windows = float(self.clean_sum), float(self.clean_n), int(self.clean_windows)
        clean = sums[0] / counts[0] if counts[0] else math.nan
        changed = sums[1] / counts[1] if self.changes and counts[1] else clean
        return clean, changed, windows if counts[0] else 0


class CleanLossSum:
    """For a first-stage probe (mixed in before ``Probe``): sums the clean pass's loss when ``clean_loss`` is set.

    The probe declares :data:`CLEAN_LOSS_PARAM` and calls :meth:`setup_clean_loss` in ``setup``;
    without ``clean_loss`` the pass reads no loss (no logits beyond the last position's).
    """

    @property
    def attention_function(self) -> bool:
        """With ``clean_loss``, the clean pass runs sinkscope's attention function (the second stage's kernel)."""
        return bool(self.clean_loss)

    def setup_clean_loss(self) -> None:
        self.clean_loss_sum = torch.zeros((), dtype=torch.float64)  # summed cross-entropy of the clean pass
        self.clean_loss_n = torch.zeros((), dtype=torch.float64)  # its predictions
        self.clean_loss_windows = torch.zeros((), dtype=torch.int64)  # its windows (on the CPU: shapes only)

    def pass_observers(self, label: str | None) -> dict[str, str]:
        observers = super().pass_observers(label)
        return observers if self.clean_loss else {t: m for t, m in observers.items() if t != hooks.LOSS}

    @observes(hooks.LOSS)
    def clean_loss_seen(self, layer: None, value: Tensor) -> None:  # value: (B, T-1)
        if self.clean_loss_sum.device != value.device:
            self.clean_loss_sum, self.clean_loss_n = (self.clean_loss_sum.to(value.device),
                                                      self.clean_loss_n.to(value.device))
        self.clean_loss_sum += value.double().sum()
        self.clean_loss_n += value.numel()
        self.clean_loss_windows += value.shape[0]

    def clean_loss_params(self) -> dict:
        """The second stage's ``clean_sum``, ``clean_n`` and ``clean_windows`` (one host read)."""
        return {"clean_sum": float(self.clean_loss_sum.cpu()), "clean_n": int(self.clean_loss_n.cpu()),
                "clean_windows": int(self.clean_loss_windows)}
