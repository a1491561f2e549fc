"""Phantom (learned sink) mass and the sink logits themselves (SPEC.md "Phantom mass").

    phi_i = exp(b_h) / (exp(b_h) + sum_k exp(s_ik)) = sigmoid(b_h - LSE_i)

per (layer, head), averaged over queries i >= 1 and sequences; 0 by construction for a model
without a phantom. ``sink_logit`` reports b_h (gpt-oss ``sinks``) and is absent where the
model has none. Where the sink logit is computed per query from the hidden state (Inkling2's
``sink_proj``: b_hi, an extra softmax column) phi_i = sigmoid(b_hi - LSE_i) the same way, and
``sink_logit`` is the mean of b_hi over queries i >= 1 and windows (resolved here: SPEC.md names
only the per-head form). For Hugging Face's gpt-oss eager attention phi_i also equals 1 - sum_j a_ij
(it drops the sink column after the softmax); the tests check both.
"""

from __future__ import annotations

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row


@register_probe(
    "phantom_mass",
    metrics={
        "phantom_mass": MetricInfo(
            "Phantom mass", "share of row mass",
            "phi_i = exp(b_h) / (exp(b_h) + sum_k exp(s_ik)) = sigmoid(b_h - LSE_i), the attention on the "
            "learned phantom key (value 0), averaged over queries i >= 1 and windows; 0 without a phantom",
            "SPEC.md 'Phantom mass'; the learned-sinks note (gpt-oss sinks)",
            "higher = more attention withheld through the phantom"),
        "sink_logit": MetricInfo(
            "Learned sink logit", "logit",
            "b_h, the learned per-head logit of the phantom key (gpt-oss `sinks`); for a logit computed per "
            "query (Inkling2's sink_proj) its mean over queries i >= 1 and windows",
            "SPEC.md 'Phantom mass'; the learned-sinks note",
            "higher = the phantom absorbs more mass"),
    },
)
class PhantomMass(Probe):
    """Attention on a learned phantom key, and the phantom logits themselves."""

    reads_weights_only = True  # the eager fallback's records (weights, no q/k/v) suffice

    def setup(self) -> None:
        self.mass = HeadMeans(self.spec.n_layers, self.spec.n_heads)
        self.logit = HeadMeans(self.spec.n_layers, self.spec.n_heads)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        phi = record.phantom_mass()  # (B, H, T)
        self.mass.add(layer, phi[:, :, 1:], item_dims=(0, 2))
        if record.has_phantom and record.sink_logits.dim() == 1:
            self.logit.set(layer, record.sink_logits.float())  # (H,): a parameter, one value per head
        elif record.has_phantom:
            self.logit.add(layer, record.sink_logits.float()[:, :, 1:], item_dims=(0, 2))  # (B, H, T) per query

    def rows(self) -> list[Row]:
        return self.mass.rows(self.name, "phantom_mass") + self.logit.rows(self.name, "sink_logit")
