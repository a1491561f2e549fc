"""Channels whose position-0 value stands out, before and after the first pre-norm (SPEC.md "The
position-zero circuit"; the P0-sink study, §3.1, after Sun et al. 2024).

One of the position-zero circuit's probes, which ``sinkscope circuit`` runs together
(``commands/circuit.py``). It reads only named hook points (``capture/hooks.py``), so it runs on
every Hugging Face family and on the trainer's own model alike.

``p0_outliers`` (``hook_resid_pre`` and ``ln1.hook_normalized``, before and after the first
pre-norm of each layer): per channel c, ``z_c = (mean_w x[w, 0, c] - mean_{w, t>=1} x[w, t, c])
/ std_{w, t>=1} x[w, t, c]`` (population std over every other position of every window); the
``top`` channels by |z| per layer, ranked. A channel constant over the other positions (force-sink
zeroes its reserved channels there) has z = +-inf when position 0 differs, 0 when it does not.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.probes.base import LazyTensors, Param, grow, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

WHERE = {hooks.RESID_PRE: "resid_pre", hooks.LN1_NORMALIZED: "normed"}


@register_probe(
    "p0_outliers",
    params=(Param("top", int, 5, "channels reported per layer and place",
                  check=lambda v: None if v >= 1 else "must be at least 1"),),
    metrics={
        "p0_outlier_z": MetricInfo(
            "Position-0 outlier channel z-score", "z",
            "z_c = (mean_w x[w,0,c] - mean_{w,t>=1} x[w,t,c]) / std_{w,t>=1} x[w,t,c] of the rank-th channel by |z|; "
            "where = resid_pre (before the first pre-norm) or normed (ln1.hook_normalized, after it)",
            "SPEC.md 'The position-zero circuit'; the P0-sink study, §3.1 (Sun et al. 2024)",
            "large |z| = a channel that marks position 0", per="layer x rank"),
        "p0_outlier_channel": MetricInfo(
            "Position-0 outlier channel", "channel index", "the channel of that rank", "the P0-sink study, §3.1", "",
            per="layer x rank"),
        "p0_outlier_max_z": MetricInfo(
            "Largest position-0 |z|", "|z|", "max over channels of |z_c| per layer (where column)", "the P0-sink study, §3.1",
            "higher = position 0 has a more extreme channel", per="layer"),
    },
)
class P0Outliers(LazyTensors):
    """Channels whose position-0 value stands out from the other positions, before and after the pre-norm."""

    top: int

    def setup(self) -> None:
        empty = torch.zeros(0, dtype=torch.float64)
        # (2 places, L, C): sums at position 0; sums and squares over the others
        self.s0, self.so, self.qo = empty.clone(), empty.clone(), empty.clone()
        self.count = torch.zeros(2, self.spec.n_layers, 2, dtype=torch.int64)  # (place, L, [windows, others])

    def _add(self, place: int, layer: int, x: Tensor) -> None:  # (B, T, C)
        B, T, C = x.shape
        shape = (2, self.spec.n_layers, C)
        self.s0, self.so, self.qo = (grow(t, shape, x.device) for t in (self.s0, self.so, self.qo))
        x = x.detach().to(self.s0.dtype)
        self.s0[place, layer] += x[:, 0].sum(0)
        rest = x[:, 1:].reshape(-1, C)
        self.so[place, layer] += rest.sum(0)
        self.qo[place, layer] += rest.square().sum(0)
        self.count[place, layer, 0] += B
        self.count[place, layer, 1] += B * (T - 1)

    @observes(hooks.RESID_PRE)
    def before(self, layer: int, value: Tensor) -> None:
        self._add(0, layer, value)

    @observes(hooks.LN1_NORMALIZED)
    def after(self, layer: int, value: Tensor) -> None:
        self._add(1, layer, value)

    def z_scores(self, place: int, layer: int) -> Tensor | None:
        n0, no = int(self.count[place, layer, 0]), int(self.count[place, layer, 1])
        if n0 == 0 or no == 0:
            return None
        eps = torch.finfo(self.s0.dtype).eps * 64  # round-off of the accumulated sums, with room
        m0 = self.s0[place, layer].cpu().double() / n0
        mo = self.so[place, layer].cpu().double() / no
        square = self.qo[place, layer].cpu().double() / no
        var = square - mo.square()
        var = torch.where(var <= eps * square, torch.zeros_like(var), var)  # constant over the others
        diff = m0 - mo
        diff = torch.where(diff.abs() <= eps * (m0.abs() + mo.abs()), torch.zeros_like(diff), diff)
        z = diff / var.sqrt()  # a channel constant over the others (force-sink's reserved ones): +-inf
        return torch.where(torch.isnan(z), torch.zeros_like(z), z)  # 0 / 0: the channel does not differ

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        if self.s0.numel() == 0:
            return rows
        for place, where in enumerate(WHERE.values()):
            for layer in range(self.spec.n_layers):
                z = self.z_scores(place, layer)
                if z is None:
                    continue
                n = int(self.count[place, layer, 0])
                order = torch.argsort(z.abs(), descending=True, stable=True)[:self.top]
                rows.append(Row(self.name, "p0_outlier_max_z", layer, None, float(z.abs().max()), n,
                                (("where", where),)))
                for rank, c in enumerate(order.tolist(), start=1):
                    cond = (("where", where), ("rank", rank))
                    rows += [Row(self.name, "p0_outlier_z", layer, None, float(z[c]), n, cond),
                             Row(self.name, "p0_outlier_channel", layer, None, float(c), n, cond)]
        return rows
