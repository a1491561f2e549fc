"""Position-0 mass (SPEC.md "Position-0 mass"; seed 000 Table 15).

    p0_i = w_i0 = a_i0 / sum_j a_ij

the share of query i's real-key attention that lands on the first key, per (layer, head),
averaged over queries i >= 1 (row 0 is trivially all on position 0) and sequences. On a
sliding-window layer key 0 is invisible to queries i >= W, which then contribute 0.

Not every row average skips row 0: the exposure probe's quiet and phantom mass
(``probes/exposure.py``, SPEC.md "Quiet mass (exposure)") average over every query i >= 0, as
seed 000's Tables 3 and 11 do.
"""

from __future__ import annotations

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, MetricInfo, Probe, Row, observes, register_probe


@register_probe("p0_mass", metrics={"p0_mass": MetricInfo(
    "Position-0 mass", "share of real-key mass",
    "p0 = w_i0 = a_i0 / sum_j a_ij: the share of query i's attention on real keys that lands on "
    "key 0, averaged over queries i >= 1 and windows",
    "SPEC.md 'Position-0 mass'; seed 000 Table 15",
    "higher = more attention parked on the first token")})
class P0Mass(Probe):
    """Share of each head's real-key attention on position 0."""

    def setup(self) -> None:
        self.acc = HeadMeans(self.spec.n_layers, self.spec.n_heads)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        p0 = record.key_mass(0, over="real")  # (B, H, T)
        self.acc.add(layer, p0[:, :, 1:], item_dims=(0, 2))

    def rows(self) -> list[Row]:
        return self.acc.rows(self.name, "p0_mass")
