"""Exposure to value-read injection: quiet mass and phantom mass (SPEC.md "Quiet mass (exposure)").

Per value head and sequence the cutoff c is the median or the 25th percentile (numpy's linear
quantile) of the read norms ||v_j|| over the sequence's S keys; the quiet set is
{j : ||v_j|| < c} (strict). For every query head h (reading KV head h // (H / Hkv)) and query i::

    quiet_i = sum_{j quiet} a_ij      (a: phantom in the normaliser, so quiet + phantom + rest = 1)
    phi_i   = sigmoid(b_h - LSE_i)    (phantom mass, 0 without a phantom)

Averaging convention: both are averaged over **every** query i = 0 .. T-1 and every window, as
Wang 2026 Tables 3 and 11 do, not over i >= 1 as p0_mass and phantom_mass are (row 0 is in the
average here: its only real key is position 0, quiet or not). So ``exposure_phantom_mass``
differs from ``phantom_mass`` by the weight of row 0. Per-layer values are means over heads,
the model value the mean over layers.

The quiet set is taken over the values before any gate (the trainer's gated variants), i.e. the
reads the injection corrupts. Both forms: an explicit record multiplies its weights by the
indicator of the quiet set; a fused record gets sum_j w_ij 1[j quiet] as extra value columns of
the kernel call that computed the layer's output (``record_columns = {"quiet"}``), times
1 - phi_i. The two agree to 1e-5 (tests).
"""

from __future__ import annotations

from sinkscope.capture import hooks
from sinkscope.capture.record import QUIET_CUTOFFS, AttentionRecord
from sinkscope.probes.base import HeadMeans, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

_SOURCE = "SPEC.md 'Quiet mass (exposure)'; Wang 2026 Tables 3 and 11"
_EVERY_QUERY = ("averaged over every query i >= 0 (row 0 included, as Wang 2026's tables; p0_mass and phantom_mass "
                "use i >= 1) and windows")


def quiet_metric(cutoff: str) -> str:
    """The metric name of the quiet mass at a cutoff: ``quiet_mass_median``, ``quiet_mass_q25``."""
    return f"quiet_mass_{cutoff}"


@register_probe(
    "exposure",
    metrics={
        **{quiet_metric(name): MetricInfo(
            f"Quiet mass ({name})", "share of row mass",
            f"sum over quiet keys j of a_ij (phantom in the normaliser), the quiet set being the reads with "
            f"||v_j|| < the {'median' if q == 0.5 else f'{q:g} quantile'} of the sequence's read norms of the "
            f"value head; {_EVERY_QUERY}",
            _SOURCE, "higher = more of the row is exposed to junk injected into quiet reads")
           for name, q in QUIET_CUTOFFS},
        "exposure_phantom_mass": MetricInfo(
            "Phantom mass (every query)", "share of row mass",
            f"phi_i = sigmoid(b_h - LSE_i), {_EVERY_QUERY}; 0 without a phantom",
            _SOURCE, "higher = more of the row withheld from every read (not exposed)"),
    },
)
class Exposure(Probe):
    """The share of each attention row on quiet reads (median and q25 cutoffs) and on the phantom."""

    record_columns = frozenset({"quiet"})

    def setup(self) -> None:
        L, H = self.spec.n_layers, self.spec.n_heads
        self.quiet = {name: HeadMeans(L, H) for name, _ in QUIET_CUTOFFS}
        self.phantom = HeadMeans(L, H)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        mass = record.quiet_mass()  # (B, H, T, K)
        for k, (name, _) in enumerate(QUIET_CUTOFFS):
            self.quiet[name].add(layer, mass[..., k], item_dims=(0, 2))
        self.phantom.add(layer, record.phantom_mass(), item_dims=(0, 2))

    def rows(self) -> list[Row]:
        out: list[Row] = []
        for name, _ in QUIET_CUTOFFS:
            out += self.quiet[name].rows(self.name, quiet_metric(name))
        return out + self.phantom.rows(self.name, "exposure_phantom_mass")
