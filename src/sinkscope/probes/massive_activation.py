"""Massive activations in the residual stream (Sun et al. 2024; SPEC.md "Massive activations").

Per layer l (the output hidden state of decoder layer l), over every evaluated token:

    massive_activation          = max |h|                       (the top entry)
    massive_activation_channel  = its channel
    massive_activation_position = its position in the window
    massive_activation_ratio    = max |h| / median |h|

The median is not a streaming statistic, so we take it per sequence (exact median of |h| over
that sequence's positions and channels) and average those over sequences; the ratio divides
the overall top by that mean median. Both are independent of the batch size. Ties for the top
keep the first sequence in evaluation order. Model rows: the largest ``massive_activation`` and
``massive_activation_ratio`` over layers (a mean of maxima would describe no activation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.probes.base import MetricInfo, Probe, Row, observes, register_probe
from sinkscope.probes.stats import median


@register_probe(
    "massive_activation",
    metrics={
        "massive_activation": MetricInfo(
            "Largest residual activation", "max |h|",
            "max |h| over every position and channel of the layer's output residual stream; model row = "
            "largest over layers",
            "SPEC.md 'Massive activations'; Sun et al. 2024", "higher = a more massive activation", per="layer"),
        "massive_activation_ratio": MetricInfo(
            "Largest activation / median", "ratio",
            "max |h| divided by the median |h| (exact median per window, averaged over windows); model row = "
            "largest over layers",
            "SPEC.md 'Massive activations'; Sun et al. 2024", "higher = a more massive activation", per="layer"),
        "massive_activation_channel": MetricInfo(
            "Channel of the largest activation", "channel index",
            "the residual channel holding max |h|", "SPEC.md 'Massive activations'", per="layer"),
        "massive_activation_position": MetricInfo(
            "Position of the largest activation", "token position",
            "the position in the window holding max |h|", "SPEC.md 'Massive activations'", per="layer"),
    },
)
class MassiveActivation(Probe):
    """The largest residual-stream activation of each layer and its ratio to the median."""

    def setup(self) -> None:
        L = self.spec.n_layers
        self.top = torch.full((L,), -1.0, dtype=torch.float64)
        self.channel = torch.zeros(L, dtype=torch.int64)
        self.position = torch.zeros(L, dtype=torch.int64)
        self.median_sum = torch.zeros(L, dtype=torch.float64)
        self.n_seqs = torch.zeros(L, dtype=torch.int64)

    @observes(hooks.RESID_POST)
    def residual(self, layer: int, hidden: Tensor) -> None:
        magnitude = hidden.detach().float().abs()  # (B, T, C)
        B, T, C = magnitude.shape
        flat = magnitude.reshape(B, T * C)  # (B, T*C)
        seq_top, seq_arg = flat.max(dim=-1)  # (B,), (B,)
        self.median_sum[layer] += median(flat, dim=-1).double().sum().cpu()
        self.n_seqs[layer] += B
        best = int(seq_top.argmax())  # first maximal sequence of the batch
        if float(seq_top[best]) > float(self.top[layer]):
            self.top[layer] = float(seq_top[best])
            self.position[layer] = int(seq_arg[best]) // C
            self.channel[layer] = int(seq_arg[best]) % C

    def merge(self, other: "MassiveActivation") -> None:
        """Sum the medians and counts; keep the larger top (ties: this share, the earlier windows)."""
        better = other.top > self.top  # (L,)
        self.top = torch.where(better, other.top, self.top)
        self.channel = torch.where(better, other.channel, self.channel)
        self.position = torch.where(better, other.position, self.position)
        self.median_sum = self.median_sum + other.median_sum
        self.n_seqs = self.n_seqs + other.n_seqs

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        seen = [l for l in range(self.spec.n_layers) if self.n_seqs[l] > 0]
        ratios = {}
        for l in seen:
            n = int(self.n_seqs[l])
            ratios[l] = float(self.top[l] / (self.median_sum[l] / n))
            rows += [
                Row(self.name, "massive_activation", l, None, float(self.top[l]), n),
                Row(self.name, "massive_activation_ratio", l, None, ratios[l], n),
                Row(self.name, "massive_activation_channel", l, None, float(self.channel[l]), n),
                Row(self.name, "massive_activation_position", l, None, float(self.position[l]), n),
            ]
        if seen:
            n_total = int(self.n_seqs.sum())
            rows.append(Row(self.name, "massive_activation", None, None, float(self.top[seen].max()), n_total))
            rows.append(Row(self.name, "massive_activation_ratio", None, None, max(ratios.values()), n_total))
        return rows
