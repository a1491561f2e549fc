"""One layer's attention-output norm at every position, before and after W_O (SPEC.md "The position-zero
circuit"; the P0-sink study, §3.2 Table 2).

One of the position-zero circuit's probes, which ``sinkscope circuit`` runs together
(``commands/circuit.py``). It reads only named hook points (``capture/hooks.py``), so it runs on
every Hugging Face family and on the trainer's own model alike.

``attn_out_norm`` (one layer, the first attention layer by default), over windows w, one row per
position t:

    attn_z_norm[h, t]   = mean_w ||z[w, t, h]||,  z_h[t] = sum_j a_tj v_j   (hook_z: the P0-sink study's quantity,
                          attention as a weighted sum of value vectors, before W_O; per head h)
    attn_z_norm[t]      = mean_w ||z[w, t, :, :]||                          (pooled over heads, no head: the
                          norm of every head's z side by side, the vector W_O maps to hook_attn_out)
    attn_out_norm[t]    = mean_w ||hook_attn_out[w, t]||                    (after W_O, beside it)

and for each curve y (per head and pooled; after W_O pooled only) ``*_p0_ratio = y_0 / mean_{t>=1}
y_t`` and ``*_trend`` = the least-squares slope of
y_t against log2 t over t >= 1, over mean_{t>=1} y_t (relative change per doubling of position;
< 0 = the norm falls with position, as the P0-sink study argues from sum_j a_tj^2). Resolved (SPEC.md,
2026-12): the hook_z numbers are the headline. The pooled row is the norm of the concatenated
heads, not the mean of the per-head rows (that mean can be recomputed from them; the norm of the
concatenation cannot). Where the model has an output gate, hook_z is after it (what W_O reads).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.probes.base import LazyTensors, Param, grow, observes, register_probe
from sinkscope.store.results import MetricInfo, Row


def _trend(curve: list[float]) -> float:
    """Relative change of a norm curve per doubling of position, over positions t >= 1.

    ``trend = b / mean_{t>=1} y_t`` with ``b`` the least-squares slope of ``y_t`` against
    ``log2 t`` (t = 1 .. T-1): negative = the norm falls as the query sees more keys (the P0-sink study
    §3.2: sum_i p_i^2 shrinks with the length). NaN with fewer than two positions t >= 1.
    """
    if len(curve) < 3:
        return math.nan
    x = torch.log2(torch.arange(1, len(curve), dtype=torch.float64))  # (T-1,)
    y = torch.tensor(curve[1:], dtype=torch.float64)  # (T-1,)
    xc = x - x.mean()
    slope = float((xc * (y - y.mean())).sum() / xc.square().sum())
    return slope / float(y.mean()) if float(y.mean()) != 0 else math.nan


def _curve_rows(probe: str, metric: str, layer: int, head: int | None, curve: list[float], n: int) -> list[Row]:
    """One row per position, then ``metric_p0_ratio`` (position 0 over the mean of t >= 1) and ``metric_trend``."""
    rows = [Row(probe, metric, layer, head, v, n, (("position", t),)) for t, v in enumerate(curve)]
    if len(curve) > 1:
        rest = sum(curve[1:]) / (len(curve) - 1)
        rows.append(Row(probe, f"{metric}_p0_ratio", layer, head, curve[0] / rest if rest > 0 else math.nan, n))
        rows.append(Row(probe, f"{metric}_trend", layer, head, _trend(curve), n))
    return rows


_TABLE2 = "the P0-sink study, §3.2 Table 2"


@register_probe(
    "attn_out_norm",
    params=(Param("layer", int, 0, "the layer whose hook_z and hook_attn_out are read",
                  check=lambda v: None if v >= 0 else "must be at least 0"),),
    metrics={
        "attn_z_norm": MetricInfo(
            "Norm of the weighted value sum by position (before W_O)", "L2 norm",
            "||z_h[t]|| = ||sum_j a_tj v_j|| of head h at hook_z (before W_O; after an output gate where there is "
            "one), averaged over windows; one row per position t, per head and pooled (the head-less row: "
            "||z[t]|| of all heads side by side, the vector W_O maps to hook_attn_out)", _TABLE2 + " (the P0-sink study's quantity: attention as a weighted sum of values)",
            "position 0 highest = its unmixed value (sum_j a_tj^2 = 1 there)", per="layer x head x position"),
        "attn_z_norm_p0_ratio": MetricInfo(
            "Weighted value sum norm, position 0 / others (before W_O)", "ratio",
            "attn_z_norm at position 0 over its mean at positions t >= 1, per head and pooled", _TABLE2, "> 1 = position 0's weighted value sum is larger",
            per="layer x head"),
        "attn_z_norm_trend": MetricInfo(
            "Weighted value sum norm, change per doubling of position (before W_O)", "share per doubling",
            "least-squares slope of attn_z_norm against log2 t over t >= 1, over its mean there; per head and "
            "pooled", _TABLE2 + " ('the norm decreases with sequence length')",
            "< 0 = the norm falls as the query sees more keys", per="layer x head"),
        "attn_out_norm": MetricInfo(
            "Attention-output norm by position (after W_O)", "L2 norm",
            "||hook_attn_out[t]|| of the same layer (after W_O and its bias, after Gemma 3's post-attention norm), "
            "averaged over windows; one row per position t", _TABLE2 + " (after the output projection: not the "
            "seed's quantity, reported beside it)", "", per="layer x position"),
        "attn_out_norm_p0_ratio": MetricInfo(
            "Attention-output norm, position 0 / others (after W_O)", "ratio",
            "attn_out_norm at position 0 over its mean at positions t >= 1", _TABLE2,
            "> 1 = position 0's projected attention output is larger", per="layer"),
        "attn_out_norm_trend": MetricInfo(
            "Attention-output norm, change per doubling of position (after W_O)", "share per doubling",
            "least-squares slope of attn_out_norm against log2 t over t >= 1, over its mean there", _TABLE2,
            "< 0 = the norm falls with position", per="layer"),
    },
)
class AttnOutNorm(LazyTensors):
    """One layer's attention-output norm at every position (the P0-sink study, Table 2), before and after W_O.

    Before W_O (``hook_z``, (B, T, H, D)) is the P0-sink study's quantity: attention as a weighted sum of
    value vectors, whose norm is largest at position 0 (only its own value, sum_j a_0j^2 = 1) and
    falls as the weights spread. After W_O (``hook_attn_out``, (B, T, C)) the heads are mixed by
    the output projection, which need not preserve that order.
    """

    layer: int

    def setup(self) -> None:
        self.z_sums = torch.zeros(0, dtype=torch.float64)  # (T, H): sums over windows of ||z_h[t]||
        self.z_pooled = torch.zeros(0, dtype=torch.float64)  # (T,): sums over windows of ||z[t]||, heads side by side
        self.sums = torch.zeros(0, dtype=torch.float64)  # (T,): sums over windows of ||attn_out[t]||
        self.z_count = torch.zeros(1, dtype=torch.int64)
        self.count = torch.zeros(1, dtype=torch.int64)

    @observes(hooks.ATTN_Z)
    def z(self, layer: int, value: Tensor) -> None:  # (B, T, H, D)
        if layer != self.layer:
            return
        B, T, H, _ = value.shape
        self.z_sums, self.z_pooled = grow(self.z_sums, (T, H), value.device), grow(self.z_pooled, (T,), value.device)
        z = value.detach().to(self.z_sums.dtype)  # (B, T, H, D)
        self.z_sums += z.norm(dim=-1).sum(0)  # (T, H)
        self.z_pooled += z.flatten(-2).norm(dim=-1).sum(0)  # (T,)
        self.z_count[0] += B

    @observes(hooks.ATTN_OUT)
    def attn_out(self, layer: int, value: Tensor) -> None:  # (B, T, C)
        if layer != self.layer:
            return
        B, T, _ = value.shape
        self.sums = grow(self.sums, (T,), value.device)
        self.sums += value.detach().to(self.sums.dtype).norm(dim=-1).sum(0)
        self.count[0] += B

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        n = int(self.z_count[0])
        if n and self.z_sums.numel():
            per_head = self.z_sums.cpu().double() / n  # (T, H)
            for head in range(per_head.shape[1]):
                rows += _curve_rows(self.name, "attn_z_norm", self.layer, head, per_head[:, head].tolist(), n)
            rows += _curve_rows(self.name, "attn_z_norm", self.layer, None,
                                (self.z_pooled.cpu().double() / n).tolist(), n)
        n = int(self.count[0])
        if n and self.sums.numel():
            rows += _curve_rows(self.name, "attn_out_norm", self.layer, None, (self.sums.cpu().double() / n).tolist(), n)
        return rows
