"""``sinkscope circuit``: how a model makes position 0 special (SPEC.md "The position-zero circuit"; the P0-sink study, §2-3).

Probes (one module each under ``probes/``, named as the probe), all reading named hook points only,
so every family the spine supports and every trainer checkpoint runs them the same way:

1. ``p0_norm``: per layer the L2 norm of ``hook_resid_post`` at position 0 against the median
   over the other positions, the first layer whose ratio exceeds ``--norm-ratio`` (2), and the
   directional convergence: the mean pairwise cosine of the position-0 state across windows
   beside the same at ``--later-position`` (64, capped to the window);
2. ``attn_out_norm``: the first attention layer's norm per position of the weighted sum of
   values before W_O (``hook_z``, per head and pooled: the headline, the P0-sink study, Table 2) and, beside
   it, of the attention output after W_O (``hook_attn_out``);
3. ``mlp_pca_up`` (gated MLPs: the up projection ``hook_pre_linear``, the P0-sink study's choice) or
   ``mlp_pca`` (``hook_pre``): PCA of layer 0's MLP pre-activation with position 0 marked, its
   scatter sample and separation score, again after subtracting ``--subtract-head 0.H`` heads;
4. ``p0_outliers``: the channels whose position-0 value stands out, before and after the first
   pre-norm of each layer;
5. ``bos_experiment``: Sink_0^eps per layer with and without BOS, and the loss change when the
   first token is repeated r times (``--repeats``; ``--no-bos-experiments`` skips them).

Decisions where SPEC.md leaves things open (also under "Decisions" in docs/commands/circuit.md):

- The windows are the run's (``--bos`` as everywhere). Norms, cosines, PCA and outliers are
  measured on them as drawn; the P0-sink study, Fig. 2(c) reads cosines without BOS, so pass ``--bos
  none`` for its setting (with BOS at position 0 the position-0 cosine is 1 by construction).
- The BOS experiments build their own inputs from each window: the content K is the window
  without its first token, shortened by r_max - 1 so every pass fits in seq-len tokens;
  "with" is [BOS] * r + K, "without" is K_0 * r + K[1:]; the loss covers the targets K[1:]
  only (same tokens everywhere). The BOS id is the tokenizer's ``bos_token_id`` (else the
  windows' BOS); none: only "without".
- The PCA uses a streaming covariance (2 F^2 doubles per pass; F = the MLP width) and is fitted
  separately on the pass with heads subtracted. Subtraction zeroes the heads at ``hook_z`` of
  layer 0, which removes exactly their ``hook_result`` from the residual the layer-0 MLP reads;
  heads of other layers are refused. Gemma 3 (a norm after attention) is refused for
  subtraction, since removing a head there is not a subtraction from the residual stream;
  GPT-NeoX blocks with a parallel residual read resid_pre in the MLP, so subtraction changes
  nothing there. Models whose MLP has no such point (mixture-of-experts: gpt-oss, Qwen3-Next)
  get no PCA.
- z-scores of outlier channels pool every other position of every window (population std).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError, option
from sinkscope.commands.spec import seq_lens, Command, RunOptions

if TYPE_CHECKING:
    from sinkscope.capture.families import ModelSpec


@dataclass
class CircuitOptions(RunOptions):
    """``RunOptions`` plus the circuit's settings.

    Attributes:
        later_position: the later position whose cosine is shown beside position 0's (64,
            capped to seq_len - 1).
        norm_ratio: the norm ratio that counts as "separated" (2).
        subtract_head: layer-0 heads (``0.H``) to subtract before the MLP PCA, together.
        scatter_positions: positions >= 1 per window in the scatter sample.
        scatter_windows: windows whose other positions enter the scatter (position 0: every window).
        outlier_top: outlier channels reported per layer.
        bos_experiments: run the BOS experiments (extra passes: 2 x len(repeats) per batch).
        repeats: r values of the repeated-first-token experiment (1 is the reference).
        sink_epsilon: eps of Sink_0^eps.
        bos_token_id: the BOS id of the experiments; None = the tokenizer's (filled in by the pipeline).
    """

    later_position: int = 64
    norm_ratio: float = 2.0
    subtract_head: tuple[str, ...] = ()
    scatter_positions: int = 32
    scatter_windows: int = 64
    outlier_top: int = 5
    bos_experiments: bool = True
    repeats: tuple[int, ...] = (1, 2, 4, 8)
    sink_epsilon: float = 0.3
    bos_token_id: int | None = None


def _check(options: CircuitOptions) -> None:
    from sinkscope.errors import check_heads, check_repeats

    if options.later_position < 1:
        raise SinkscopeError(f"{option('later_position')} must be at least 1 (got {options.later_position}).")
    if options.norm_ratio <= 0:
        raise SinkscopeError(f"{option('norm_ratio')} must be positive (got {options.norm_ratio}).")
    problem = check_heads(tuple(options.subtract_head))
    if problem:
        raise SinkscopeError(f"{option('subtract_head')} {problem}.")
    if any(not str(h).startswith("0.") for h in options.subtract_head):
        raise SinkscopeError(f"{option('subtract_head')} takes heads of layer 0 (0.H): the layer-0 MLP reads only layer 0's "
                             "head outputs.")
    if options.scatter_positions < 0 or options.scatter_windows < 0 or options.outlier_top < 1:
        raise SinkscopeError(f"{option('scatter_positions')} and {option('scatter_windows')} must be >= 0 and {option('outlier_top')} >= 1.")
    problem = check_repeats(tuple(options.repeats))
    if problem:
        raise SinkscopeError(f"{option('repeats')} {problem}.")
    if not 0.0 < options.sink_epsilon < 1.0:
        raise SinkscopeError(f"{option('sink_epsilon')} must lie in (0, 1) (got {options.sink_epsilon}).")
    if options.bos_experiments and options.seq_len is not None and min(seq_lens(options.seq_len)) < max(options.repeats) + 2:
        raise SinkscopeError(f"the BOS experiments need {option('seq_len')} >= {max(options.repeats) + 2} for repeats up to "
                             f"{max(options.repeats)}; lower {option('repeats')} or pass {option('bos_experiments', False)}.")


def _check_model(options: CircuitOptions, spec: ModelSpec) -> None:
    if options.subtract_head:
        if spec.attn_out_normalised:
            raise SinkscopeError(f"{spec.family} normalises the attention output before adding it to the residual "
                                 f"stream, so removing a head is not a subtraction; run without {option('subtract_head')}.")
        if spec.mlp_kind is None:
            raise SinkscopeError(f"{spec.family} has no MLP pre-activation point (a mixture-of-experts or fused MLP), "
                                 f"so there is no PCA to subtract heads from; run without {option('subtract_head')}.")
        from sinkscope.probes.mlp_pca import parse_subtracted

        parse_subtracted(options.subtract_head, 0, spec.n_heads)


def pca_probe(spec: ModelSpec) -> str | None:
    """``mlp_pca_up`` for gated MLPs (the P0-sink study reads the up projection), ``mlp_pca`` otherwise; None: no PCA."""
    if spec.mlp_kind is None:
        return None
    return "mlp_pca_up" if spec.mlp_kind == "gated" else "mlp_pca"


def _probes(options: CircuitOptions, spec: ModelSpec) -> list[tuple[str, dict]]:
    out: list[tuple[str, dict]] = [
        ("p0_norm", {"position": options.later_position, "threshold": options.norm_ratio}),
        ("attn_out_norm", {"layer": spec.attention_layers[0] if spec.attention_layers else 0}),
    ]
    pca = pca_probe(spec)
    if pca is not None:
        out.append((pca, {"layer": 0, "heads": tuple(options.subtract_head),
                          "scatter_positions": options.scatter_positions,
                          "scatter_windows": options.scatter_windows}))
    out.append(("p0_outliers", {"top": options.outlier_top}))
    if options.bos_experiments:
        out.append(("bos_experiment", {"bos_id": options.bos_token_id, "repeats": tuple(options.repeats),
                                       "epsilon": options.sink_epsilon,
                                       "layer_start": 2 if spec.n_layers > 2 else None}))
    return out


CIRCUIT = register_command(Command(
    name="circuit",
    summary="the position-zero circuit: norms, direction, attention-output norm, MLP PCA, outlier channels, BOS",
    options=CircuitOptions,
    probes=_probes,
    check=_check,
    check_model=_check_model,
))
