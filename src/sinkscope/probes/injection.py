"""Value-read injection: the loss increase from junk added to the quiet reads (SPEC.md "Value-read injection").

Per batch the probe takes part in one clean forward pass and one more per condition
(junk type x cutoff x dose). In a condition's pass, at every attention layer, for every value
(KV) head and window, before the attention mixes the values and before any value gate
(``blocks.{l}.attn.hook_v``)::

    n_j = ||v_j||                                   read norms over the window's S keys
    c   = quantile(n, 0.5 | 0.25)                   cutoff (numpy's linear quantile)
    m_h = median(n)                                 the head's median read norm
    v_j <- v_j + eps * m_h * u_j   for every j with n_j < c (strict); other reads untouched

    loss_clean = mean next-token cross-entropy over every window and position (clean pass)
    loss       = the same under corruption;  loss_delta = loss - loss_clean  (nats / token)

Junk ``u_j`` (unit length), drawn from the reads the layer receives, before its own corruption:

- ``structured``: the normalised read of the same KV head at a uniformly random *other* position
  of the evaluation batch (any window, never (window, position) itself; almost always another
  window); drawn independently per read and head;
- ``same-context``: the same from a uniformly random other position of the same window;
- ``gaussian``: an isotropic normal vector, normalised;
- ``random-direction``: one random unit vector per KV head, shared by every corrupted read of the batch;
- ``own-direction``: the head's projection-gate direction w_h / ||w_h|| (the trainer's
  ``projgate`` and ``sink+proj``; read from the checkpoint given as ``directions``).

Decisions (SPEC.md leaves them open):

- Every layer is corrupted in the same pass, so layer l's reads already carry the effect of the
  junk injected below it; "drawn from the clean reads" means the quiet set, m_h and structured
  or same-context junk come from the reads layer l receives *before its own* corruption (never
  from a corrupted read), which is what keeps one layer's values at a time: nothing from the
  clean pass is kept across layers.
- The random generator is seeded per (seed, batch, layer) (batch = its first window's index)
  and draws on the CPU, so the draws do not depend on the device, the dose or the cutoff: every
  dose and cutoff of a junk type sees the same u_j, and models with the same shapes (layers,
  KV heads, head size, windows per batch, positions) get identical junk.
- A read of norm 0 gives a zero junk vector (structured and same-context).
- Structured junk draws across the batch, so the batch is part of the measurement
  (``fixed_batch``): ``sinkscope inject --eval-batch`` fixes it and the manifest records it; the
  runner never halves it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.capture.record import QUIET_CUTOFFS, read_norm_quantiles
from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import MetricInfo, Param, Probe, Row, intervenes, observes, register_probe

#: every junk type, in table order.
JUNK_TYPES = ("structured", "same-context", "gaussian", "random-direction", "own-direction")
#: what ``sinkscope inject`` runs by default: seed 000 Table 13's three (the full battery with two cutoffs).
DEFAULT_JUNK = ("structured", "same-context", "gaussian")
CUTOFF_QUANTILES = dict(QUIET_CUTOFFS)
DEFAULT_CUTOFFS = tuple(CUTOFF_QUANTILES)
DEFAULT_DOSES = (0.2, 0.4, 0.8, 1.6)
#: variants of the bundled trainer with a projection gate (the only ones with an own direction).
PROJECTION_GATE_VARIANTS = ("projgate", "sink+proj")
OWN_DIRECTION_SENTENCE = ("own-direction junk is the head's projection-gate direction w_h/||w_h||, which only "
                          "projection-gate trainer checkpoints ({}) have")


def _check_doses(doses: tuple) -> str | None:
    try:
        values = [float(d) for d in doses]
    except (TypeError, ValueError):
        return "takes numbers such as 0.2,0.4"
    if not values:
        return "needs at least one dose"
    if any(not np.isfinite(d) or d < 0 for d in values):
        return "takes finite doses >= 0"
    if len(set(values)) != len(values):
        return "lists a dose twice"
    return None


def _distinct(values: tuple) -> str | None:
    if not values:
        return "needs at least one value"
    return "lists a value twice" if len(set(values)) != len(values) else None


def condition_label(junk: str, cutoff: str, dose: float) -> str:
    """The runner's pass label of one condition, e.g. ``structured|median|0.4``."""
    return f"{junk}|{cutoff}|{dose:g}"


def draw_seed(seed: int, batch_start: int, layer: int) -> int:
    """The generator seed of one (batch, layer): the same for every junk type's doses and cutoffs."""
    return int(np.random.SeedSequence([seed, batch_start, layer]).generate_state(1, dtype=np.uint64)[0] >> 1)


def other_positions(n: int, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """For every item of ``shape`` whose own index is along dim 0 of a flat range of ``n``: a uniform other index.

    ``shape`` is (n, ...); entry [p, ...] is drawn uniformly from {0..n-1} without p. int64, CPU.
    """
    r = torch.randint(0, n - 1, shape, generator=generator)  # (n, ...)
    own = torch.arange(n).view(n, *([1] * (len(shape) - 1)))  # (n, 1, ...)
    return r + (r >= own).long()  # skips its own index


def load_gate_directions(checkpoint: str | Path) -> dict[int, Tensor]:
    """The projection gate's w_h per layer, (H, D) float32, from a trainer checkpoint's weights."""
    from safetensors.torch import load_file

    folder = Path(checkpoint)
    weights = load_file(str(folder / "model.safetensors"))
    out = {}
    for key, value in weights.items():
        parts = key.split(".")
        if key.endswith(".attn.gate_w") and "h" in parts:
            out[int(parts[parts.index("h") + 1])] = value.float()
    if not out:
        raise SinkscopeError(OWN_DIRECTION_SENTENCE.format(", ".join(PROJECTION_GATE_VARIANTS))
                             + f"; {checkpoint} has no projection gate.")
    return out


@register_probe(
    "injection",
    params=(
        Param("junk", tuple, DEFAULT_JUNK, "junk types (comma-separated): " + ", ".join(JUNK_TYPES),
              choices=JUNK_TYPES, check=_distinct),
        Param("cutoffs", tuple, DEFAULT_CUTOFFS, "quiet-read cutoffs: median, q25", choices=DEFAULT_CUTOFFS,
              check=_distinct),
        Param("doses", tuple, DEFAULT_DOSES, "doses eps (junk norm = eps x the head's median read norm)",
              check=_check_doses),
        Param("seed", int, 0, "seeds the junk draws (per batch and layer)"),
        Param("eval_batch", int, 8, "windows per evaluation batch (structured junk draws across it)",
              check=lambda b: None if b >= 1 else "must be at least 1"),
        Param("directions", str, None, "own-direction: the trainer checkpoint whose projection gates give w_h",
              optional=True),
    ),
    metrics={
        "inject_loss_clean": MetricInfo(
            "Loss, clean", "nats / token", "mean next-token cross-entropy over every window and position, "
            "uncorrupted (the same batches as every condition)", "SPEC.md 'Value-read injection'", "", per="model"),
        "inject_loss": MetricInfo(
            "Loss under injection", "nats / token",
            "the same loss with every quiet read v_j (||v_j|| < cutoff) replaced by v_j + eps m_h u_j in every "
            "layer, per junk type, cutoff and dose eps", "SPEC.md 'Value-read injection'; seed 000 §5.1",
            "", per="model"),
        "inject_loss_delta": MetricInfo(
            "Loss increase under injection", "nats / token", "inject_loss - inject_loss_clean on the same windows",
            "SPEC.md 'Value-read injection'; seed 000 §5.1, Tables 3, 9, 10, 13",
            "higher = the model is hurt more by junk in its quiet reads", per="model"),
    },
)
class Injection(Probe):
    """The loss increase when junk of a given type and dose is added to every head's quiet value reads."""

    fixed_batch = True
    not_state = ("gate_directions",)  # read from a checkpoint, the same in every share

    def setup(self) -> None:
        self.doses = tuple(float(d) for d in self.doses)
        self.conditions = [(j, c, d) for j in self.junk for c in self.cutoffs for d in self.doses]
        self.labels = {condition_label(*cond): i + 1 for i, cond in enumerate(self.conditions)}
        self.by_label = {condition_label(*cond): cond for cond in self.conditions}
        self.gate_directions: dict[int, Tensor] = {}  # layer -> w_h (H, D), own-direction only
        if "own-direction" in self.junk:
            if self.directions is None:
                raise SinkscopeError(OWN_DIRECTION_SENTENCE.format(", ".join(PROJECTION_GATE_VARIANTS))
                                     + "; this model is not one.")
            self.gate_directions = load_gate_directions(self.directions)
        n = len(self.conditions) + 1
        self.loss_sum = torch.zeros(n, dtype=torch.float64)  # clean, then each condition: summed cross-entropy
        self.loss_n = torch.zeros(n, dtype=torch.float64)  # predictions

    def options(self) -> dict:
        out = super().options()
        out["doses"] = list(self.doses)
        return out

    def passes(self) -> tuple[str | None, ...]:
        return (None, *self.labels)

    # ---- the junk ------------------------------------------------------------------------------
    def junk_vectors(self, junk: str, layer: int, v: Tensor, norms: Tensor) -> Tensor:
        """Unit junk u_j for every read, (B, S, Hkv, D) float32 on v's device.

        ``v`` (B, S, Hkv, D) float32 are the reads the layer receives, ``norms`` (B, S, Hkv) theirs.
        """
        B, S, Hkv, D = v.shape
        generator = torch.Generator().manual_seed(draw_seed(self.seed, self.batch_start, layer))
        if junk in ("structured", "same-context"):
            heads = torch.arange(Hkv, device=v.device).view(1, 1, Hkv)  # (1, 1, Hkv)
            if junk == "structured":  # another position anywhere in the batch
                if B * S < 2:
                    raise SinkscopeError("structured junk needs at least two positions in the evaluation batch.")
                flat = other_positions(B * S, (B * S, Hkv), generator).view(B, S, Hkv).to(v.device)  # (B, S, Hkv)
                source, source_norms = v.reshape(B * S, Hkv, D), norms.reshape(B * S, Hkv)
                u, n = source[flat, heads], source_norms[flat, heads]  # (B, S, Hkv, D), (B, S, Hkv)
            else:  # another position of the same window
                if S < 2:
                    raise SinkscopeError("same-context junk needs windows of at least two positions.")
                pos = other_positions(S, (S, B, Hkv), generator).permute(1, 0, 2).to(v.device)  # (B, S, Hkv)
                rows = torch.arange(B, device=v.device).view(B, 1, 1)  # (B, 1, 1)
                u, n = v[rows, pos, heads], norms[rows, pos, heads]  # (B, S, Hkv, D), (B, S, Hkv)
            return torch.where(n.unsqueeze(-1) > 0, u / n.clamp_min(torch.finfo(u.dtype).tiny).unsqueeze(-1), 0.0)
        if junk == "gaussian":
            g = torch.randn(B, S, Hkv, D, generator=generator).to(v.device)  # (B, S, Hkv, D)
        elif junk == "random-direction":
            g = torch.randn(Hkv, D, generator=generator).to(v.device).expand(B, S, Hkv, D)  # one per head
        elif junk == "own-direction":
            if layer not in self.gate_directions:
                raise SinkscopeError(f"layer {layer} has no projection gate to give an own direction.")
            g = self.gate_directions[layer].to(v.device).expand(B, S, Hkv, D)  # (B, S, Hkv, D): w_h per head
        else:  # pragma: no cover - Param choices
            raise ValueError(junk)
        return g / g.norm(dim=-1, keepdim=True)

    @intervenes(hooks.ATTN_V)
    def inject(self, layer: int, v: Tensor) -> Tensor | None:  # v: (B, S, Hkv, D)
        if self.pass_label is None:
            return None
        junk, cutoff, dose = self.by_label[self.pass_label]
        vf = v.float()  # (B, S, Hkv, D)
        norms = vf.norm(dim=-1)  # (B, S, Hkv)
        median, c = read_norm_quantiles(norms.transpose(1, 2), (0.5, CUTOFF_QUANTILES[cutoff]))  # (B, Hkv) each
        quiet = norms.double() < c.unsqueeze(1)  # (B, S, Hkv): strict <
        u = self.junk_vectors(junk, layer, vf, norms)  # (B, S, Hkv, D)
        step = dose * median.float().unsqueeze(1) * quiet.float()  # (B, S, Hkv): eps m_h on quiet reads, else 0
        return (vf + step.unsqueeze(-1) * u).to(v.dtype)  # (B, S, Hkv, D)

    # ---- the loss --------------------------------------------------------------------------------
    @observes(hooks.LOSS)
    def loss(self, layer: None, value: Tensor) -> None:  # value: (B, T-1)
        if self.loss_sum.device != value.device:  # accumulate where the loss lives (no host sync per batch)
            self.loss_sum, self.loss_n = self.loss_sum.to(value.device), self.loss_n.to(value.device)
        index = 0 if self.pass_label is None else self.labels[self.pass_label]
        self.loss_sum[index] += value.double().sum()
        self.loss_n[index] += value.numel()

    def rows(self) -> list[Row]:
        sums, counts = self.loss_sum.cpu(), self.loss_n.cpu()
        n = int(counts[0])
        mean = (sums / counts.clamp_min(1)).tolist()
        clean = mean[0] if n else float("nan")
        out = [Row(self.name, "inject_loss_clean", None, None, clean, n)]
        for i, (junk, cutoff, dose) in enumerate(self.conditions, start=1):
            conditions = (("junk", junk), ("cutoff", cutoff), ("dose", dose))
            out.append(Row(self.name, "inject_loss", None, None, mean[i], int(counts[i]), conditions))
            out.append(Row(self.name, "inject_loss_delta", None, None, mean[i] - clean, int(counts[i]), conditions))
        return out
