"""Value-norm ratio, of the values and of gated reads (SPEC.md "Value-norm ratio"; Wang 2026 Tables 14-15).

    r0 = ||v_0|| / median_{j >= 1} ||v_j||

per value (KV) head and sequence, then averaged over sequences. ``v`` is the head's value
vector before any gate. The ``head`` column of these rows indexes value heads (0..Hkv-1), which
under GQA are fewer than query heads. The median is the exact one (mean of the two middle values
for an even count).

``gated_value_norm_ratio`` is the same ratio for the read a value-gated head takes, g_j v_j
(SPEC.md: "for gated variants also report the ratio of the gated read"):

    r0_gated = ||g_0 v_0|| / median_{j >= 1} ||g_j v_j||
"""

from __future__ import annotations

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row
from sinkscope.probes.stats import median


@register_probe("value_norm_ratio", metrics={"value_norm_ratio": MetricInfo(
    "Value-norm ratio", "ratio",
    "r0 = ||v_0|| / median_{j >= 1} ||v_j|| per value (KV) head and window, averaged over windows; "
    "v before any gate",
    "SPEC.md 'Value-norm ratio'; Wang 2026 Tables 14-15",
    "lower = a quieter (more no-op) sink value", per="layer x KV head")})
class ValueNormRatio(Probe):
    """How quiet the value read at position 0 is, relative to the other reads."""

    def setup(self) -> None:
        self.acc = HeadMeans(self.spec.n_layers, self.spec.n_kv_heads)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        norms = record.value_norms()  # (B, Hkv, S)
        ratio = norms[..., 0] / median(norms[..., 1:], dim=-1)  # (B, Hkv)
        self.acc.add(layer, ratio, item_dims=(0,))

    def rows(self) -> list[Row]:
        return self.acc.rows(self.name, "value_norm_ratio")


@register_probe("gated_value_norm_ratio", metrics={"gated_value_norm_ratio": MetricInfo(
    "Gated-read value-norm ratio", "ratio",
    "r0 of the gated read: ||g_0 v_0|| / median_{j >= 1} ||g_j v_j|| per value (KV) head and window, averaged "
    "over windows (value-slot gates; a routing-slot gate leaves the reads ungated and gets no rows)",
    "SPEC.md 'Value-norm ratio' (gated variants); Wang 2026 Tables 14-15",
    "lower = the gate quiets the position-0 read relative to the others", per="layer x KV head")})
class GatedValueNormRatio(Probe):
    """The value-norm ratio of what a value-gated head actually reads, g_j v_j."""

    def setup(self) -> None:
        self.acc = HeadMeans(self.spec.n_layers, self.spec.n_kv_heads)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        if record.value_gate is None or record.routing_gate:
            return
        norms = record.value_norms() * record.value_gate.float()  # (B, Hkv, S): ||g_j v_j|| = g_j ||v_j||, g > 0
        ratio = norms[..., 0] / median(norms[..., 1:], dim=-1)  # (B, Hkv)
        self.acc.add(layer, ratio, item_dims=(0,))

    def rows(self) -> list[Row]:
        return self.acc.rows(self.name, "gated_value_norm_ratio")
