"""Gate statistics over the reads (SPEC.md "Routing-slot gate statistics"; Wang 2026 Table 8).

Per value head, over every read j (key position, BOS included) of every window:

    read_gate_mean        = mean_j g_j                 (unweighted: every read counts once)
    read_gate_below_half  = share of reads with g_j < 0.5

Wang 2026 reports these for the norm gate in the routing slot (``routing-norm``), where the gate
"opens almost fully"; they are defined for every value gate, so ``selectivity`` reports them
for all of them (compare ``gate_mean``, the same gate weighted by the attention the reads get).
Layer rows are means over heads, the model row the mean over layers (Wang 2026 averages Table 8
over layers). The ``head`` column indexes value heads.
"""

from __future__ import annotations

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

SOURCE = "SPEC.md 'Routing-slot gate statistics'; Wang 2026 Table 8"


@register_probe(
    "read_gate",
    metrics={
        "read_gate_mean": MetricInfo(
            "Mean gate over reads", "gate value",
            "mean over every read j (key position) and window of the value gate g_j, unweighted",
            SOURCE, "near 1 = the gate stays open (Wang 2026: the routing-slot gate opens almost fully)",
            per="layer x KV head"),
        "read_gate_below_half": MetricInfo(
            "Reads with g < 0.5", "share of reads",
            "share of reads j (key positions, every window) whose value gate g_j < 0.5",
            SOURCE, "higher = more reads attenuated by at least half", per="layer x KV head"),
    },
)
class ReadGate(Probe):
    """The value gate over every read, unweighted: its mean and the share below one half."""

    def setup(self) -> None:
        self.mean = HeadMeans(self.spec.n_layers, self.spec.n_kv_heads)
        self.below = HeadMeans(self.spec.n_layers, self.spec.n_kv_heads)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        if record.value_gate is None:
            return
        g = record.value_gate.float()  # (B, Hkv, S)
        self.mean.add(layer, g, item_dims=(0, 2))
        self.below.add(layer, (g < 0.5).float(), item_dims=(0, 2))

    def rows(self) -> list[Row]:
        return self.mean.rows(self.name, "read_gate_mean") + self.below.rows(self.name, "read_gate_below_half")
