"""Gate selectivity and the attention-weighted mean gate (SPEC.md "Gate selectivity"; Wang 2026 §4.2, Fig. 1d).

For a value gate g_j and query i, with w_ij the attention weights renormalised over the real
keys (the phantom's mass excluded where there is one):

    m_i   = sum_j w_ij g_j
    sel_i = sqrt( sum_j w_ij (g_j - m_i)^2 )

per (layer, head), averaged over queries i >= 1 (row 0 reads key 0 alone: sel_0 = 0) and
windows; layer rows are means over heads, the model row the mean over layers (Wang 2026: "we
average the row values over queries, heads, sequences, and layers"). A gate that scales every
read of a row alike (pure abstention) has sel = 0 exactly.

Both are streaming reductions: the record's ``gate_moments`` gives m_i and the variance per row,
from the weights (explicit record) or from two extra value columns of the fused kernel call
that computed the layer (``record_columns``), so no attention weights are stored. For the
trainer's ``routing-norm`` the weights are the ones the model uses, softmax_j(s_ij + log g_j).
Output gates (Qwen3-Next, ``outgate``) are query-controlled: one value per query, so within-row
selectivity is not defined for them (``output_gate`` reports their statistics).
"""

from __future__ import annotations

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

SOURCE = "SPEC.md 'Gate selectivity'; Wang 2026 §4.2, Fig. 1d"


@register_probe(
    "gate_selectivity",
    metrics={
        "gate_selectivity": MetricInfo(
            "Gate selectivity", "weighted std of g",
            "sel_i = sqrt(sum_j w_ij (g_j - m_i)^2) with m_i = sum_j w_ij g_j and w_ij the real-key weights "
            "(phantom excluded), averaged over queries i >= 1 and windows",
            SOURCE, "higher = the gate passes some attended reads and blocks others; 0 = it scales a row's reads "
                    "alike (abstention only)"),
        "gate_mean": MetricInfo(
            "Attention-weighted mean gate", "gate value",
            "m_i = sum_j w_ij g_j, the mean gate of the reads query i attends to (real keys), averaged over "
            "queries i >= 1 and windows",
            SOURCE + "; Wang 2026 appendix 'Selectivity'", "lower = the reads a query takes are attenuated more"),
    },
)
class GateSelectivity(Probe):
    """Whether a value gate discriminates among the reads a query attends to, and its mean."""

    record_columns = frozenset({"value_gate"})

    def setup(self) -> None:
        self.selectivity = HeadMeans(self.spec.n_layers, self.spec.n_heads)
        self.mean = HeadMeans(self.spec.n_layers, self.spec.n_heads)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        if record.value_gate is None or record.query.shape[-2] < 2:
            return
        m, var = record.gate_moments()  # (B, H, T) each
        self.selectivity.add(layer, var.sqrt()[:, :, 1:], item_dims=(0, 2))
        self.mean.add(layer, m[:, :, 1:], item_dims=(0, 2))

    def rows(self) -> list[Row]:
        return self.selectivity.rows(self.name, "gate_selectivity") + self.mean.rows(self.name, "gate_mean")
