"""The loss change from zeroing chosen heads (Fu et al. 2026 §4.1: do "dormant" heads really do nothing?).

Per batch two forward passes over the same windows: the clean one, and one where every listed
head's output is zeroed through the intervention seam (``blocks.{l}.attn.hook_z``, after any output
gate, before W_O, so exactly that head's contribution ``z_h W_O[h]`` leaves the residual stream)::

    loss_clean   = mean over windows and positions i = 0 .. T-2 of -log p(x_{i+1} | x_<=i)
    loss_ablated = the same with the heads zeroed
    loss_delta   = loss_ablated - loss_clean          (nats per token; > 0: the heads mattered)

The loss is the ``loss`` hook point's next-token cross-entropy at every position (as SPEC.md's
injection outcome), so it includes the prediction made at position 0. ``heads`` lists
``LAYER.HEAD`` pairs; ``sinkscope heads --ablate-dormant`` fills it with the heads its first
stage found dormant (``commands/heads.py``), and ``sinkscope measure --probe head_ablation
--param head_ablation.heads=3.1,5.0`` takes any set. With no head listed only the clean pass
runs and the ablated loss equals it.

As ``heads --ablate-dormant``'s second stage the clean loss is the first stage's (``clean_sum``,
``clean_n``; ``probes/loss_change.py``): the first stage's pass is the clean pass of the same
windows, so only the ablated pass runs here, and with no dormant head none at all. Both stages
run sinkscope's attention function, so the change is never two kernels' round-off (SPEC.md "The
loss change of a second stage").
"""

from __future__ import annotations

from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.errors import SinkscopeError
from sinkscope.errors import check_heads
from sinkscope.probes.base import Param, intervenes, register_probe
from sinkscope.store.results import MetricInfo, Row
from sinkscope.probes.loss_change import CLEAN_PARAMS, LossChange

#: the label of the pass with the heads zeroed (None is the clean pass).
ABLATED = "ablated"


def parse_heads(heads, n_layers: int, n_heads: int, attention_layers) -> dict[int, list[int]]:
    """``("3.1", "3.0", "5.2")`` -> ``{3: [0, 1], 5: [2]}``; a head outside the model is one sentence."""
    out: dict[int, list[int]] = {}
    for item in heads:
        layer, head = (int(x) for x in str(item).split("."))
        if layer not in attention_layers or not 0 <= head < n_heads:
            raise SinkscopeError(f"the head {item} is not an attention head of this model ({n_layers} layers, "
                                 f"attention in {', '.join(map(str, attention_layers))}; heads 0 to {n_heads - 1}).")
        out.setdefault(layer, [])
        if head not in out[layer]:
            out[layer].append(head)
    return {layer: sorted(hs) for layer, hs in sorted(out.items())}


@register_probe(
    "head_ablation",
    params=(Param("heads", tuple, (), "heads to zero, as LAYER.HEAD pairs (comma-separated)",
                  check=lambda v: check_heads(v, example="3.1")),
            *CLEAN_PARAMS),
    metrics={
        "loss_clean": MetricInfo(
            "Loss, clean", "nats / token", "mean next-token cross-entropy over windows and positions; n = the windows; no se (only the loss summed over every prediction is kept)",
            "Fu et al. 2026 §4.1; the loss hook point", "", per="model"),
        "loss_ablated": MetricInfo(
            "Loss, heads zeroed", "nats / token",
            "the same loss with the listed heads' outputs zeroed at hook_z (before W_O); no se (as loss_clean)",
            "Fu et al. 2026 §4.1 (Sandoval-Segura et al. 2025: zeroing inactive heads)", "", per="model"),
        "loss_delta": MetricInfo(
            "Loss change from zeroing the heads", "nats / token", "loss_ablated - loss_clean on the same windows; no se (no per-window loss is kept)",
            "Fu et al. 2026 §4.1", "near 0 = the zeroed heads did nothing; > 0 = they mattered", per="model"),
        "ablated_heads": MetricInfo(
            "Heads zeroed", "heads", "the number of heads whose output was zeroed (a count: no se)", "Fu et al. 2026 §4.1", "",
            per="model"),
    },
)
class HeadAblation(LossChange):
    """The loss with and without the listed heads (zeroed at hook_z), on the same windows."""

    changed_pass = ABLATED

    def setup(self) -> None:
        spec = self.spec
        self.targets = parse_heads(self.heads, spec.n_layers, spec.n_heads, spec.attention_layers)
        self.n_ablated = sum(len(hs) for hs in self.targets.values())
        self.setup_loss(bool(self.targets))

    @intervenes(hooks.ATTN_Z)
    def zero(self, layer: int, z: Tensor) -> Tensor | None:  # z: (B, T, H, D)
        if self.pass_label != ABLATED or layer not in self.targets:
            return None
        z = z.clone()
        z[:, :, self.targets[layer]] = 0  # (B, T, H, D): the listed heads' outputs
        return z

    def rows(self) -> list[Row]:
        clean, ablated, n = self.losses()
        return [Row(self.name, "loss_clean", None, None, clean, n),
                Row(self.name, "loss_ablated", None, None, ablated, n),
                Row(self.name, "loss_delta", None, None, ablated - clean, n),
                Row(self.name, "ablated_heads", None, None, float(self.n_ablated), n)]
