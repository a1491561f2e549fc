"""Position-0 mass (SPEC.md "Position-0 mass"; Wang 2026 Table 15).

    p0_i = w_i0 = a_i0 / sum_j a_ij

the share of query i's real-key attention that lands on the first key, per (layer, head),
averaged over queries i >= 1 (row 0 is trivially all on position 0) and sequences. On a
sliding-window layer key 0 is invisible to queries i >= W, which then contribute 0 to ``p0_mass``
(kept so: it is the mass on key 0 of every query, and unchanged from earlier runs). So that "no
sink" can be told from "sink out of reach", a sliding layer (``record.sliding_window`` set) also
gets

    p0_out_of_reach   the share of queries i >= 1 that cannot see key 0 (key 0 masked for them)
    p0_mass_in_reach  p0 averaged over the queries that can see key 0 only

Because a masked key's w_i0 is exactly 0, the in-reach mean is ``p0_mass / (1 - p0_out_of_reach)``
per head (no per-query bookkeeping, no host transfer); its ``n`` is the windows, as ``p0_mass``'s
(SPEC.md "Tables"), and it has no ``se`` (a ratio of two means over windows).
Full layers get neither row (every query sees key 0).

``sink_head_share`` (SPEC.md "Share of sink heads"; the Megatron and PaddleFormers sink monitors
log it, a third-party audit calls it "heads > 0.5") is the share of heads whose ``p0_mass``
exceeds ``head_share_threshold`` (0.5), in its ``threshold`` column: per layer over the layer's
heads, and for the model over every (layer, head) pair; ``n`` counts the heads (the share's unit),
and it has no ``se`` (a count of heads past a threshold, not a mean over windows).

Not every row average skips row 0: the exposure probe's quiet and phantom mass
(``probes/exposure.py``, SPEC.md "Quiet mass (exposure)") average over every query i >= 0, as
Wang 2026's Tables 3 and 11 do.
"""

from __future__ import annotations

import torch

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, Param, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row


def _share_threshold(value: float) -> str | None:
    return None if 0.0 <= value < 1.0 else "must lie in [0, 1)"


@register_probe("p0_mass", params=(
    Param("head_share_threshold", float, 0.5, "sink_head_share counts the heads whose p0_mass exceeds this",
          check=_share_threshold),
), metrics={
    "p0_mass": MetricInfo(
        "Position-0 mass", "share of real-key mass",
        "p0 = w_i0 = a_i0 / sum_j a_ij: the share of query i's attention on real keys that lands on "
        "key 0, averaged over queries i >= 1 and windows (on a sliding layer, queries that cannot see key 0 "
        "count as 0: see p0_mass_in_reach)",
        "SPEC.md 'Position-0 mass'; Wang 2026 Table 15",
        "higher = more attention parked on the first token"),
    "p0_mass_in_reach": MetricInfo(
        "Position-0 mass where key 0 is in reach", "share of real-key mass",
        "p0 averaged over the queries i >= 1 that can see key 0 (sliding-window layers only): "
        "p0_mass / (1 - p0_out_of_reach); n = the windows, no se (a ratio of two means over windows)",
        "SPEC.md 'Position-0 mass'; Wang 2026 Table 14 (sliding vs full)",
        "higher = more attention parked on the first token while it is visible"),
    "p0_out_of_reach": MetricInfo(
        "Queries with key 0 out of reach", "share of queries",
        "share of queries i >= 1 that cannot see key 0 (i - 0 >= W on a sliding layer of window W)",
        "the learned-sinks note (sliding windows)",
        "a property of the window and the length: how much of p0_mass is zero by construction"),
    "sink_head_share": MetricInfo(
        "Share of sink heads", "share of heads",
        "the share of heads whose p0_mass exceeds the threshold column (head_share_threshold, 0.5): per layer over "
        "its heads, the model row over every (layer, head) pair; n = the heads counted; no se (a count of heads "
        "past a threshold, not a mean over windows)",
        "SPEC.md 'Share of sink heads'; the Megatron / PaddleFormers sink monitors",
        "higher = more heads park most of their attention on the first token", per="layer"),
})
class P0Mass(Probe):
    """Share of each head's real-key attention on position 0."""

    reads_weights_only = True  # the eager fallback's records (weights, no q/k/v) suffice

    def setup(self) -> None:
        self.acc = HeadMeans(self.spec.n_layers, self.spec.n_heads)
        self.out_of_reach = HeadMeans(self.spec.n_layers, self.spec.n_heads)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        p0 = record.key_mass(0, over="real")  # (B, H, T)
        self.acc.add(layer, p0[:, :, 1:], item_dims=(0, 2))
        if record.sliding_window is not None:
            masked = ~record.key_visible(0)  # (B, H, T)
            self.out_of_reach.add(layer, masked[:, :, 1:].to(torch.float32), item_dims=(0, 2))

    def rows(self) -> list[Row]:
        rows = self.acc.rows(self.name, "p0_mass") + self._head_share_rows()
        windowed = [layer for layer in range(self.spec.n_layers) if self.out_of_reach.seen[layer]]
        if not windowed:
            return rows
        rows += self.out_of_reach.rows(self.name, "p0_out_of_reach")
        p0, out = self.acc.means(), self.out_of_reach.means()  # (L, H)
        reach = 1.0 - out
        in_reach = torch.where(reach > 0, p0 / reach.clamp(min=1e-300), torch.full_like(p0, float("nan")))
        layer_values = []
        for layer in windowed:
            n = self.acc.n_of(layer)  # the windows (no se: a ratio of two means over them)
            for head in range(self.spec.n_heads):
                rows.append(Row(self.name, "p0_mass_in_reach", layer, head, float(in_reach[layer, head]), n))
            layer_values.append(float(in_reach[layer].mean()))
            rows.append(Row(self.name, "p0_mass_in_reach", layer, None, layer_values[-1], n))
        rows.append(Row(self.name, "p0_mass_in_reach", None, None, sum(layer_values) / len(layer_values),
                        max(self.acc.n_of(layer) for layer in windowed)))
        return rows

    def _head_share_rows(self) -> list[Row]:
        """``sink_head_share`` per layer and for the model, from the per-head means (module docstring)."""
        condition = (("threshold", float(self.head_share_threshold)),)
        p0 = self.acc.means()  # (L, H)
        rows, sinks, heads = [], 0, 0
        for layer in range(self.spec.n_layers):
            present = self.acc.counts[layer] > 0  # (H,): the layer's own heads
            if not self.acc.seen[layer] or not bool(present.any()):
                continue
            above = int((p0[layer][present] > self.head_share_threshold).sum())
            n = int(present.sum())
            rows.append(Row(self.name, "sink_head_share", layer, None, above / n, n, condition))
            sinks, heads = sinks + above, heads + n
        if heads:
            rows.append(Row(self.name, "sink_head_share", None, None, sinks / heads, heads, condition))
        return rows
