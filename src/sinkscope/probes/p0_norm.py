"""Position 0's norm and direction against the other positions (SPEC.md "The position-zero circuit";
the P0-sink study, §3.1 Fig. 2).

One of the position-zero circuit's probes, which ``sinkscope circuit`` runs together
(``commands/circuit.py``). It reads only named hook points (``capture/hooks.py``), so it runs on
every Hugging Face family and on the trainer's own model alike.

``p0_norm`` (``hook_resid_post``), per layer l, over windows w:

    p0_norm         = mean_w ||h_l[w, 0]||
    other_norm      = mean_w median_{t >= 1} ||h_l[w, t]||      (exact median per window)
    p0_norm_ratio   = p0_norm / other_norm
    p0_norm_separates (model row) = the first layer whose ratio exceeds ``threshold`` (2); NaN if none
    p0_cosine       = mean over pairs of windows w != v of cos(h_l[w, 0], h_l[v, 0])
    later_cosine    = the same at position ``position`` (64, capped to seq_len - 1)

The pairwise mean is streamed exactly: with unit vectors u_w, sum_{w != v} u_w . u_v =
||sum_w u_w||^2 - N, over N (N - 1) ordered pairs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.probes.base import LazyTensors, Param, grow, observes, register_probe
from sinkscope.store.results import MetricInfo, Row
from sinkscope.probes.stats import median


@register_probe(
    "p0_norm",
    params=(
        Param("position", int, 64, "the later position compared with position 0 (capped to seq_len - 1)",
              check=lambda v: None if v >= 1 else "must be at least 1"),
        Param("threshold", float, 2.0, "p0_norm_separates: the first layer whose norm ratio exceeds this",
              check=lambda v: None if v > 0 else "must be positive"),
    ),
    metrics={
        "p0_norm": MetricInfo(
            "Position-0 norm", "L2 norm", "||h_l[0]|| of hook_resid_post, averaged over windows",
            "SPEC.md 'The position-zero circuit'; the P0-sink study, §3.1 Fig. 2", "", per="layer"),
        "other_norm": MetricInfo(
            "Median norm of the other positions", "L2 norm",
            "median over positions t >= 1 of ||h_l[t]|| (exact, per window), averaged over windows",
            "the P0-sink study, §3.1 Fig. 2", "", per="layer"),
        "p0_norm_ratio": MetricInfo(
            "Position-0 norm / median other norm", "ratio", "p0_norm / other_norm",
            "the P0-sink study, §3.1 Fig. 2", "higher = position 0 stands out", per="layer"),
        "p0_norm_separates": MetricInfo(
            "First layer with norm ratio > 2", "layer",
            "the first layer whose p0_norm_ratio exceeds the threshold (2); empty (NaN) if none does; n = the windows, "
            "no se (a layer index)",
            "the P0-sink study, §3.1 ('the norm grows early')", "lower = position 0 separates earlier", per="model"),
        "p0_cosine": MetricInfo(
            "Position-0 direction agreement", "mean pairwise cosine",
            "mean over pairs of windows w != v of cos(h_l[w, 0], h_l[v, 0]) (hook_resid_post)",
            "the P0-sink study, §3.1 Fig. 2(c)", "near 1 = position 0 converges to one direction", per="layer"),
        "later_cosine": MetricInfo(
            "Later-position direction agreement", "mean pairwise cosine",
            "the same at a later position p (64, capped to seq_len - 1; the position column)",
            "the P0-sink study, §3.1 Fig. 2(c) (control)", "", per="layer"),
    },
)
class P0Norm(LazyTensors):
    """Position-0 norm against the other positions, and the direction's agreement across windows."""

    position: int
    threshold: float

    def setup(self) -> None:
        L = self.spec.n_layers
        empty = torch.zeros(0, dtype=torch.float64)
        self.p0_sum, self.median_sum = empty.clone(), empty.clone()  # (L,)
        self.unit0, self.unit_later = empty.clone(), empty.clone()  # (L, C): sums of unit vectors
        self.count = torch.zeros(L, dtype=torch.int64)  # windows per layer (host: from shapes)
        self.at = torch.zeros(1, dtype=torch.int64)  # the later position used (max over shares)

    @observes(hooks.RESID_POST)
    def residual(self, layer: int, hidden: Tensor) -> None:  # (B, T, C)
        B, T, C = hidden.shape
        L, device = self.spec.n_layers, hidden.device
        self.p0_sum, self.median_sum = grow(self.p0_sum, (L,), device), grow(self.median_sum, (L,), device)
        self.unit0, self.unit_later = grow(self.unit0, (L, C), device), grow(self.unit_later, (L, C), device)
        f = self.p0_sum.dtype
        h = hidden.detach().to(f)  # (B, T, C)
        norms = h.norm(dim=-1)  # (B, T)
        self.p0_sum[layer] += norms[:, 0].sum()
        if T > 1:
            self.median_sum[layer] += median(norms[:, 1:], dim=-1).sum()  # (B,) exact medians
        p = min(self.position, T - 1)
        self.at[0] = p
        self.unit0[layer] += (h[:, 0] / norms[:, 0:1].clamp_min(1e-30)).sum(0)  # (C,)
        self.unit_later[layer] += (h[:, p] / norms[:, p:p + 1].clamp_min(1e-30)).sum(0)  # (C,)
        self.count[layer] += B

    def merge(self, other: "P0Norm") -> None:
        at = torch.maximum(self.at, other.at)
        super().merge(other)
        self.at = at

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        if self.p0_sum.numel() == 0:
            return rows
        p0, med = self.p0_sum.cpu().double(), self.median_sum.cpu().double()
        u0, ul = self.unit0.cpu().double(), self.unit_later.cpu().double()
        first = math.nan
        later = int(self.at[0])
        for layer in range(self.spec.n_layers):
            n = int(self.count[layer])
            if n == 0:
                continue
            a, b = float(p0[layer] / n), float(med[layer] / n)
            ratio = a / b if b > 0 else math.nan
            if math.isnan(first) and ratio > self.threshold:
                first = float(layer)
            rows += [Row(self.name, "p0_norm", layer, None, a, n), Row(self.name, "other_norm", layer, None, b, n),
                     Row(self.name, "p0_norm_ratio", layer, None, ratio, n)]
            if n >= 2:
                pairs = n * (n - 1)
                rows.append(Row(self.name, "p0_cosine", layer, None, float((u0[layer].square().sum() - n) / pairs),
                                pairs))
                rows.append(Row(self.name, "later_cosine", layer, None,
                                float((ul[layer].square().sum() - n) / pairs), pairs, (("position", later),)))
        rows.append(Row(self.name, "p0_norm_separates", None, None, first, int(self.count.max())))
        return rows
