"""Implicit gates, head importance, load imbalance and dormant heads (SPEC.md "Implicit gate and
head importance"; Fu et al. 2026 §3.1, §4.1, §6.2). The formulas live in ``sinkscope.stats.gates``, shared
with the trainer's load-balancing loss::

    G_i       = 1 - A_sink,i = sigmoid(LSE_rest,i - LSE_sink,i)      (the head's output gate, if it has one)
    Imp^{l,h} = mean over windows and queries i >= 1 of G_i
    CV_l      = std_h Imp^{l,h} / mean_h Imp^{l,h}   (population std); the model's imbalance = mean_l CV_l
    dormant   = Imp^{l,h} < dormant_below

Two computation paths give the same numbers (tests hold them to 1e-5 on every family): an
explicit record (``--attention explicit``) subtracts the sink set's weights, ``a_i0`` and the
phantom mass ``1 - sum_j a_ij``; a fused record (the default) never materialises attention and
uses ``sigmoid(LSE_rest - LSE_sink)`` from the kernel's log-sum-exp and the logit ``s_i0`` of key
0 alone (linear memory).

The sink set (``sink_set``): ``first`` (key 0: vanilla attention; for ``sinktoken`` the learned
token), ``phantom`` (the learned phantom key: gpt-oss, ``sinklogit``, ``offbyone``, ``sink+*``)
or ``first+phantom`` (Fu et al. 2026 §6.2: a phantom that does not absorb everything), or ``data``
(Fu et al. 2026 §6.2's data-driven set, "combine high attention weight with low value norm"): per
window and head the keys j with alpha_j = mean over the queries i >= max(j, 1) that see j of
a_ij above ``sink_attention`` (0.3, SPEC's sink-rate epsilon) *and* ||v_j|| below
``sink_value_ratio`` (0.5) times the median value norm of the window's keys (that value head),
plus the phantom where the model has one (its value is 0). The seed gives no threshold; these
are chosen here. ``data`` reads whole rows: its fused path walks the queries in blocks of at
most :data:`BLOCK_BYTES` of weights exp(s_ij - LSE_i), twice (the per-key sums, then each row's
gate), so no (T, S) matrix exists (issue 42); ``--attention explicit`` has the model's weights
anyway. The row ``sink_keys`` is the mean number of keys in the set per window (phantom not
counted). ``auto`` is what
the model has, its phantom where it has one, else key 0. A phantom outside the sink set counts as
active mass (``1 - a_i0`` includes it); on a sliding-window layer queries past the window cannot
see key 0, so ``first`` gives them G = 1.

Rows: ``implicit_gate`` (mean G from the sink set), ``head_importance`` (Imp: the same number,
except on models with an output gate, whose G is the head's mean gate value over its D channels,
SPEC.md), ``load_imbalance`` (per layer; model row = the mean over layers) and ``dormant`` (1 for a
dormant head; layer row = the share of the layer's heads, model row = the mean of those shares).
Vanilla attention has ``implicit_gate = 1 - p0_mass`` on the same windows (G_i = 1 - w_i0, both
averaged over i >= 1): the cross-command check of the tests.
"""

from __future__ import annotations

import torch

from sinkscope.stats import gates
from sinkscope.capture import hooks
from sinkscope.capture.record import MASKED_BELOW, AttentionRecord
from sinkscope.errors import SinkscopeError, option
from sinkscope.probes.base import HeadMeans, Param, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row
from sinkscope.probes.loss_change import CLEAN_LOSS_PARAM, CleanLossSum

#: Fu et al. 2026 leaves the dormancy threshold open; 0.1 (a head passing under a tenth of its input).
DORMANT_BELOW = 0.1
#: the most float32 weights one query block of ``--sink-set data``'s fused path holds (bytes).
BLOCK_BYTES = 64 << 20


def _positive(value: float) -> str | None:
    return None if value > 0 else "must be positive"


def check_sink_set(sink_set: str, has_phantom: bool) -> None:
    """A sink set naming the phantom needs a model that has one (one sentence otherwise)."""
    if sink_set in ("phantom", "first+phantom") and not has_phantom:
        raise SinkscopeError(f"{option('sink_set')} {sink_set} needs a model with a learned phantom key (gpt-oss; the "
                             "trainer's sinklogit, offbyone, sink+norm, sink+proj), and this one has none; use first.")


def _threshold(value: float) -> str | None:
    return None if 0.0 <= value <= 1.0 else "must lie in [0, 1]"


@register_probe(
    "head_importance",
    params=(
        Param("sink_set", str, "auto", "auto (the model's own: phantom if it has one, else first) | first | "
              "phantom | first+phantom | data (Fu et al. 2026 §6.2: high attention and a low value norm)",
              choices=("auto",) + gates.SINK_SETS),
        Param("sink_attention", float, gates.DATA_SINK_ATTENTION,
              "sink set data: a key's mean attention alpha_j must exceed this", check=_threshold),
        Param("sink_value_ratio", float, gates.DATA_SINK_VALUE_RATIO,
              "sink set data: a key's value norm must be below this times the window's median", check=_positive),
        Param("sink_min_queries", int, gates.DATA_SINK_MIN_QUERIES,
              "sink set data: a key needs at least this many scoring queries (at most half the window's)",
              check=lambda v: None if v >= 1 else "must be at least 1"),
        Param("dormant_below", float, DORMANT_BELOW, "a head is dormant when its importance is below this",
              check=_threshold),
        CLEAN_LOSS_PARAM,
    ),
    metrics={
        "implicit_gate": MetricInfo(
            "Implicit gate", "share of row mass",
            "G_i = 1 - A_sink,i = sigmoid(LSE_rest,i - LSE_sink,i), A_sink the attention on the sink set (key 0, "
            "the phantom, or both; --sink-set), averaged over queries i >= 1 and windows; vanilla attention: "
            "1 - p0_mass",
            "SPEC.md 'Implicit gate and head importance'; Fu et al. 2026 §3.1 and Appendix B",
            "lower = more of the head's attention parked on its sink (the head passes less on)"),
        "head_importance": MetricInfo(
            "Head importance", "mean gate",
            "Imp^{l,h} = mean over windows and queries i >= 1 of G_i: the implicit gate, or for a model with "
            "output gates (Qwen3-Next, trainer outgate) the head's mean gate value over its channels",
            "SPEC.md 'Implicit gate and head importance'; Fu et al. 2026 §4.1 (Fig. 4)",
            "low = a dormant head; very unequal values within a layer = head collapse"),
        "load_imbalance": MetricInfo(
            "Head load imbalance", "CV",
            "CV_l = std_h Imp^{l,h} / mean_h Imp^{l,h} (population std over the layer's heads); model row: the "
            "mean over layers (the trainer logs the same number, sinkscope.stats.gates); n = the heads, no se "
            "(a spread across heads, not a mean over windows)",
            "SPEC.md 'Implicit gate and head importance'; Fu et al. 2026 §4.1 (Fig. 5)",
            "higher = importance concentrated on fewer heads (head collapse); 0 = balanced", per="layer"),
        "dormant": MetricInfo(
            "Dormant heads", "share of heads",
            "1 where Imp^{l,h} < dormant_below (--dormant-below, default 0.1), else 0; layer row: the share of "
            "the layer's heads; model row: the mean over layers of those shares; n = the windows on a head row, "
            "the heads on the layer and model rows; no se (a threshold on a mean, not a mean over windows)",
            "Fu et al. 2026 §4.1 (dormant heads, Sandoval-Segura et al. 2025); threshold chosen here",
            "higher = more heads that pass on almost nothing"),
        "sink_keys": MetricInfo(
            "Keys in the data-driven sink set", "keys per window",
            "--sink-set data only: the mean over windows of the number of keys j with alpha_j > sink_attention and "
            "||v_j|| < sink_value_ratio * median ||v|| (the phantom not counted)",
            "Fu et al. 2026 §6.2; thresholds chosen here (SPEC.md)", "1 with key 0 alone = the classic first-token sink"),
        "sink_set_key0": MetricInfo(
            "Windows whose data-driven sink set holds key 0", "share of windows",
            "--sink-set data only: the share of windows in which key 0 is in the head's sink set",
            "Fu et al. 2026 §6.2; SPEC.md 'Implicit gate and head importance'", "1 = key 0 is this head's sink everywhere"),
        "sink_set_empty": MetricInfo(
            "Windows whose data-driven sink set is empty", "share of windows",
            "--sink-set data only: the share of windows in which no key passes the rule (G_i = 1, or 1 - phi_i)",
            "Fu et al. 2026 §6.2; SPEC.md 'Implicit gate and head importance'", "1 = the head parks no attention on a token"),
    },
)
class HeadImportance(CleanLossSum, Probe):
    """Implicit gate, head importance, per-layer load imbalance (CV) and dormant heads (Fu et al. 2026)."""

    reads_weights_only = True  # the eager fallback's records (weights, no q/k/v) suffice

    def setup(self) -> None:
        spec = self.spec
        if self.sink_set == "auto":
            self.sink_set = gates.default_sink_set(spec.has_phantom)
        check_sink_set(self.sink_set, spec.has_phantom)
        self.data = self.sink_set == "data"
        self.first, self.phantom = (False, spec.has_phantom) if self.data else gates.sink_parts(self.sink_set)
        self.sink_keys = HeadMeans(spec.n_layers, spec.n_heads)  # sums of |S| per window (sink set data)
        self.sink_key0 = HeadMeans(spec.n_layers, spec.n_heads)  # windows with key 0 in S
        self.sink_empty = HeadMeans(spec.n_layers, spec.n_heads)  # windows with S empty
        #: where G comes from: the heads' output gates where the model has them, else the sink set.
        self.gate = "output" if spec.has_output_gate else "implicit"
        self.implicit = HeadMeans(spec.n_layers, spec.n_heads)  # sums of 1 - A_sink,i
        self.output = HeadMeans(spec.n_layers, spec.n_heads)  # sums of the mean output gate (gated models)
        self.setup_clean_loss()  # the clean loss for --ablate-dormant's second stage (clean_loss)

    def options(self) -> dict:
        """The parameters as used (``sink_set`` resolved) and the gate Imp reads."""
        options = {**super().options(), "gate": self.gate}
        if not self.data:  # the data set's thresholds mean nothing for the other sets
            options.pop("sink_attention"), options.pop("sink_value_ratio"), options.pop("sink_min_queries")
        return options

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        if self.data:
            G = self._data_gate(layer, record)  # (B, H, T)
        elif record.is_fused:  # linear memory: the kernel's LSE and the logit of key 0 only
            first_logit = record.key_logits(torch.zeros(1, dtype=torch.long))[..., 0] if self.first else None
            G = gates.gate_from_lse(record.lse(), first_logit=first_logit, sink_logit=record.sink_logits,
                                    first=self.first, phantom=self.phantom)  # (B, H, T)
        else:
            G = gates.gate_from_weights(record.weights, first=self.first, phantom=self.phantom)  # (B, H, T)
        self.implicit.add(layer, gates.query_items(G), item_dims=(0, 2))
        if record.output_gate is not None:
            g = record.output_gate.float().mean(-1).transpose(1, 2)  # (B, H, T): mean over the head's D gates
            self.output.add(layer, gates.query_items(g), item_dims=(0, 2))

    def _data_gate(self, layer: int, record: AttentionRecord) -> torch.Tensor:
        """G_i from Fu et al. 2026 §6.2's data-driven sink set (module docstring), (B, H, T)."""
        if record.weights_only:
            raise SinkscopeError(f"{option('sink_set')} data needs the value vectors, which this model's attention path does not "
                                 "expose (the eager fallback); use first, phantom or first+phantom.")
        norms = record._per_query_head(record.value_norms())  # (B, H, S)
        rules = dict(attention_above=self.sink_attention, value_below=self.sink_value_ratio,
                     min_queries=self.sink_min_queries)
        phantom = self.phantom and record.has_phantom
        if not record.is_fused:  # the model's weights exist already
            weights = record.weights.float()  # (B, H, T, S)
            keys = gates.data_sink_keys(weights, record.logits() > MASKED_BELOW, norms, **rules)  # (B, H, S)
            self._count_sink_keys(layer, keys)
            return gates.gate_from_sink_keys(weights, keys, phantom=phantom)
        B, H, T, _ = record.query.shape
        S = record.key.shape[-2]
        lse, real = record.lse(), record.real_mass()  # (B, H, T) each
        step = max(1, BLOCK_BYTES // (4 * B * H * S))  # queries per block

        def block(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
            logits = record.row_logits(rows)  # (B, H, n, S) with the model's mask
            weights = torch.exp(logits - lse[:, :, rows].unsqueeze(-1)) * real[:, :, rows].unsqueeze(-1)  # a_ij
            return weights, logits > MASKED_BELOW  # (B, H, n, S) each

        blocks = [slice(start, min(start + step, T)) for start in range(0, T, step)]
        sums = torch.zeros(B, H, S, dtype=torch.float32, device=record.query.device)  # sum_i a_ij
        seen = torch.zeros(B, H, S, dtype=torch.float32, device=record.query.device)  # n_j
        kept = None
        for rows in blocks:
            weights, visible = block(rows)
            part_sums, part_seen = gates.sink_key_sums(weights, visible, first_row=rows.start + S - T)
            sums, seen = sums + part_sums, seen + part_seen
            kept = weights if len(blocks) == 1 else None  # one block: its weights serve the gate too
        keys = gates.sink_keys_from_sums(sums, seen, norms, **rules)  # (B, H, S)
        self._count_sink_keys(layer, keys)
        gate = torch.empty(B, H, T, dtype=torch.float32, device=record.query.device)  # (B, H, T)
        for rows in blocks:
            weights = kept if kept is not None else block(rows)[0]
            gate[:, :, rows] = gates.gate_from_sink_keys(weights, keys, phantom=phantom)
        return gate

    def _count_sink_keys(self, layer: int, keys: torch.Tensor) -> None:
        """The set's size, whether it holds key 0, whether it is empty: one item per window and head."""
        self.sink_keys.add(layer, keys.sum(-1, keepdim=True).double(), item_dims=(0, 2))
        self.sink_key0.add(layer, keys[..., :1].double(), item_dims=(0, 2))  # (B, H, 1): one item per window
        self.sink_empty.add(layer, (~keys.any(-1, keepdim=True)).double(), item_dims=(0, 2))

    # ---- finalising ------------------------------------------------------------------------------
    def _importance_acc(self) -> HeadMeans:
        return self.output if self.gate == "output" else self.implicit

    def importance(self) -> tuple[list[int], torch.Tensor]:
        """(layers seen, Imp (L', H) float64 on the CPU)."""
        acc = self._importance_acc()
        layers = [layer for layer in range(self.spec.n_layers) if acc.seen[layer]]
        return layers, acc.means()[layers]

    def dormant_heads(self) -> list[tuple[int, int]]:
        """The dormant (layer, head) pairs, in order: Imp^{l,h} < ``dormant_below``."""
        layers, imp = self.importance()
        mask = gates.dormant(imp, self.dormant_below)  # (L', H)
        return [(layers[i], int(h)) for i, h in mask.nonzero().tolist()]

    def rows(self) -> list[Row]:
        acc = self._importance_acc()
        out = self.implicit.rows(self.name, "implicit_gate") + acc.rows(self.name, "head_importance")
        if self.data:
            out += self.sink_keys.rows(self.name, "sink_keys")
            out += self.sink_key0.rows(self.name, "sink_set_key0") + self.sink_empty.rows(self.name, "sink_set_empty")
        layers, imp = self.importance()
        if not layers:
            return out
        cv = gates.load_imbalance(imp)  # (L',)
        mask = gates.dormant(imp, self.dormant_below)  # (L', H)
        heads = [int((acc.counts[layer] > 0).sum()) for layer in layers]  # n of a statistic over heads
        for i, layer in enumerate(layers):
            out.append(Row(self.name, "load_imbalance", layer, None, float(cv[i]), heads[i]))
        out.append(Row(self.name, "load_imbalance", None, None, float(cv.mean()), sum(heads)))
        for i, layer in enumerate(layers):
            for head in range(self.spec.n_heads):
                out.append(Row(self.name, "dormant", layer, head, float(mask[i, head]), acc.n_of(layer)))
            out.append(Row(self.name, "dormant", layer, None, float(mask[i].double().mean()), heads[i]))
        out.append(Row(self.name, "dormant", None, None, float(mask.double().mean(dim=1).mean()), sum(heads)))
        return out
