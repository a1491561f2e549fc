"""Output-gate statistics (SPEC.md "Output-gate statistics"; Qiu et al. 2025).

A query-controlled gate (Qwen3-Next; the trainer's ``outgate``, elementwise or headwise)
multiplies head h's attention output at position i by gate values o_i in (0, 1), one per
channel of the head (elementwise) or one per head (headwise). Per (layer, head), over windows:

    out_gate_mean       = mean of o over every position i >= 0 and channel
    out_gate_first      = mean of o at position 0
    out_gate_rest       = mean of o at positions i >= 1
    out_gate_sparsity   = share of gate values o < 0.1

Qiu et al. 2025 reports a mean gate score (0.116 for the elementwise G1 gate, 0.172 headwise) and
SPEC.md a first-token gate (~0.07 for Qwen's released 1B gated models). Position 0 is kept in
the mean (it is reported on its own beside it). A headwise gate counts one value per head and
position (not one per channel it is broadcast to). Selectivity within a row (``gate_selectivity``)
is not defined here: the gate depends on the query, not on the key read.
"""

from __future__ import annotations

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

SOURCE = "SPEC.md 'Output-gate statistics'; Qiu et al. 2025"
#: a gate value below this counts as closed (Qiu et al. 2025's sparsity).
SPARSE_BELOW = 0.1


@register_probe(
    "output_gate",
    metrics={
        "out_gate_mean": MetricInfo(
            "Mean output gate", "gate value",
            "mean of the output gate o over every position i >= 0, channel and window",
            SOURCE, "lower = the head's output is shut more often (Qiu et al. 2025: 0.116 for the G1 gate)"),
        "out_gate_first": MetricInfo(
            "Output gate at position 0", "gate value",
            "mean of the output gate o at position 0 (over channels and windows)",
            SOURCE, "low = the first token's query shuts the head (SPEC.md: ~0.07 for Qwen's gated 1B)"),
        "out_gate_rest": MetricInfo(
            "Output gate at positions >= 1", "gate value",
            "mean of the output gate o at positions i >= 1 (over channels and windows)",
            SOURCE, "compare with out_gate_first"),
        "out_gate_sparsity": MetricInfo(
            "Output-gate sparsity", "share of gate values",
            f"share of output-gate values o < {SPARSE_BELOW} over every position, channel and window",
            SOURCE, "higher = a sparser gate (Qiu et al. 2025: sparsity, not nonlinearity, removes the sink)"),
    },
)
class OutputGate(Probe):
    """Mean, first-token and sparsity statistics of a query-controlled output gate."""

    def setup(self) -> None:
        L, H = self.spec.n_layers, self.spec.n_heads
        self.mean, self.first, self.rest, self.sparse = (HeadMeans(L, H) for _ in range(4))

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        if record.output_gate is None:
            return
        o = record.output_gate
        if o.stride(-1) == 0:  # a headwise gate broadcast over the head's channels: one value each
            o = o[..., :1]  # (B, T, H, 1)
        o = o.float().transpose(1, 2)  # (B, H, T, D|1)
        self.mean.add(layer, o, item_dims=(0, 2, 3))
        self.sparse.add(layer, (o < SPARSE_BELOW).float(), item_dims=(0, 2, 3))
        self.first.add(layer, o[:, :, 0], item_dims=(0, 2))
        if o.shape[2] > 1:
            self.rest.add(layer, o[:, :, 1:], item_dims=(0, 2, 3))

    def rows(self) -> list[Row]:
        return (self.mean.rows(self.name, "out_gate_mean") + self.first.rows(self.name, "out_gate_first")
                + self.rest.rows(self.name, "out_gate_rest") + self.sparse.rows(self.name, "out_gate_sparsity"))
