"""Implicit gates, head importance and load imbalance: the one implementation of Fu et al. 2026's numbers.

SPEC.md "Implicit gate and head importance" (Fu et al. 2026 §3.1, §4.1, §4.2 and Appendix B), used by
the ``head_importance`` probe (``sinkscope heads``) *and* by the bundled trainer's sink-aware
load-balancing loss and its evaluation log (``train/model.py``, ``train/loop.py``), so the
imbalance a run reports and the imbalance training optimised are the same function::

    A_sink,i  = sum over the sink set of query i's attention weights a_ij
                (key 0: ``first``; the phantom: ``phantom``; both: ``first+phantom``)
    G_i       = 1 - A_sink,i                                   the implicit gate of query i
              = sigmoid(LSE_rest,i - LSE_sink,i)               fused form (never materialises a_ij)
    Imp^{l,h} = mean over windows and queries i >= 1 of G_i    head importance
    CV_l      = std_h Imp^{l,h} / mean_h Imp^{l,h}             load imbalance of layer l
    imbalance = mean_l CV_l                                    the model's imbalance
    L_lb      = mean_l CV_l^2                                  the trainer's load-balancing term

``LSE_sink`` is the log-sum-exp of the sink set's logits (``s_i0``, ``b_h``, or both) and
``LSE_rest`` that of every other key the row normalises over (the real keys j >= 1, plus the
phantom when it is not in the sink set), so ``sigmoid(LSE_rest - LSE_sink)`` is exactly the
share of the row outside the sink set. Fu et al. 2026's two forms are the special cases
``sigmoid(LSE_not0 - s_i0)`` (vanilla attention, ``first``) and ``sigmoid(LSE - b_h)`` (sink
attention, ``phantom``). For an explicit output gate (Qwen3-Next, the trainer's ``outgate``) G_i
is the head's mean gate value instead (SPEC.md), averaged the same way.

Choices made here (Fu et al. 2026's equations 5-7 are not in the seed; SPEC.md asks to document them):

- queries i >= 1 only (SPEC.md "Averages"; query 0 sees key 0 alone, so its G is 0 by
  construction for ``first``); a window of one token keeps its only query;
- the CV uses the population standard deviation (divide by H), so a layer of equally important
  heads has CV exactly 0; the mean is clamped at 1e-12 so a layer of dead heads gives 0, not NaN;
- the trainer's loss is the mean over layers of CV^2 (differentiable; lambda 1e-4 by default in
  the paper, ``--lb-lambda`` here).

Everything is plain torch on tensors of any float dtype and keeps the autograd graph.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: the sink sets ``--sink-set`` accepts (SPEC.md; Fu et al. 2026 §6.2 for ``first+phantom`` and ``data``).
FIXED_SINK_SETS = ("first", "phantom", "first+phantom")  # named keys: the fused LSE form applies
SINK_SETS = FIXED_SINK_SETS + ("data",)
#: ``data`` (Fu et al. 2026 §6.2: "combine high attention weight with low value norm"; the seed gives no
#: threshold, so these are chosen here): a key is a sink when its attention alpha_j (Gu et al.'s
#: mean over the queries that see it, SPEC.md "Sink rate") exceeds 0.3, SPEC's sink-rate epsilon,
#: and its value norm is below half the median value norm of its window and value head.
DATA_SINK_ATTENTION = 0.3
DATA_SINK_VALUE_RATIO = 0.5
#: ... and when at least this many queries scored it (resolved 2026-12): alpha_j of a key near the
#: window's end is the attention of one or two queries (SmolLM2: position 126 of 128 was selected).
#: Capped at half the queries of the window's best-scored key (T - 1, or W - 1 on a sliding layer),
#: so that a short window or a sliding layer keeps its early keys eligible.
DATA_SINK_MIN_QUERIES = 16
#: the first query position averaged (SPEC.md "Averages").
FIRST_QUERY = 1


def sink_parts(sink_set: str) -> tuple[bool, bool]:
    """``(first, phantom)``: whether key 0 and whether the phantom belong to ``sink_set``.

    ``data`` chooses its keys per window (:func:`data_sink_keys`), so it names neither here.
    """
    if sink_set not in SINK_SETS:
        raise ValueError(f"sink_set must be one of {', '.join(SINK_SETS)}, not {sink_set!r}")
    return sink_set in ("first", "first+phantom"), sink_set in ("phantom", "first+phantom")


def data_sink_keys(weights: Tensor, visible: Tensor, value_norms: Tensor, *,
                   attention_above: float = DATA_SINK_ATTENTION,
                   value_below: float = DATA_SINK_VALUE_RATIO,
                   min_queries: int = DATA_SINK_MIN_QUERIES) -> Tensor:
    """Fu et al. 2026 §6.2's sink set of each window and head: high attention and a low value norm.

        n_j     = the queries i >= max(j, 1) that see key j
        alpha_j = mean over those n_j queries of a_ij
        sink    = alpha_j > attention_above  and  ||v_j|| < value_below * median_k ||v_k||
                  and  n_j >= min(min_queries, ceil(max_k n_k / 2))

    Args:
        weights: a_ij (B, H, T, S), any phantom in the normaliser.
        visible: whether query i sees key j, bool (B|1, H|1, T, S) (causal mask, window).
        value_norms: ||v_j|| per query head (KV heads repeated), (B, H, S); the median is over
            the window's S keys (torch's lower median for an even count).
    Returns:
        bool (B, H, S): the keys in the sink set. The same as :func:`sink_key_sums` over blocks of
        queries followed by :func:`sink_keys_from_sums` (the fused path's linear-memory form).
    """
    T, S = weights.shape[-2:]
    sums, seen = sink_key_sums(weights, visible, first_row=S - T)
    return sink_keys_from_sums(sums, seen, value_norms, attention_above=attention_above, value_below=value_below,
                               min_queries=min_queries)


def sink_key_sums(weights: Tensor, visible: Tensor, *, first_row: int) -> tuple[Tensor, Tensor]:
    """Per key, over a block of queries: sum_i a_ij and n_j over the counted queries i >= max(j, 1) that see j.

    ``weights`` (B, H, n, S) and ``visible`` (B|1, H|1, n, S) hold n consecutive queries whose
    first sits at absolute position ``first_row``. Returns (sums (B, H, S), counts (B|1, H|1, S)),
    both float32; blocks add up to the whole window's (:func:`data_sink_keys`).
    """
    n, S = weights.shape[-2:]
    rows = torch.arange(n, device=weights.device) + first_row  # (n,) absolute query positions
    counted = visible & (rows >= FIRST_QUERY).view(-1, 1)  # (.., n, S): queries i >= 1 only
    counted = counted & (rows.view(-1, 1) >= torch.arange(S, device=weights.device).view(1, -1))  # i >= j
    return (weights * counted).sum(-2), counted.sum(-2).to(weights.dtype)


def sink_keys_from_sums(sums: Tensor, seen: Tensor, value_norms: Tensor, *,
                        attention_above: float = DATA_SINK_ATTENTION,
                        value_below: float = DATA_SINK_VALUE_RATIO,
                        min_queries: int = DATA_SINK_MIN_QUERIES) -> Tensor:
    """The sink set (bool (B, H, S)) from a window's :func:`sink_key_sums` and value norms (B, H, S)."""
    alpha = sums / seen.clamp_min(1)  # (B, H, S)
    median = value_norms.median(dim=-1, keepdim=True).values  # (B, H, 1)
    most = seen.amax(-1, keepdim=True)  # (B|1, H|1, 1): the best-scored key's queries (T - 1; W - 1 when sliding)
    enough = seen >= torch.ceil(most / 2).clamp(min=1, max=int(min_queries))  # (B|1, H|1, S); on the device
    return (alpha > attention_above) & enough & (value_norms < value_below * median)  # (B, H, S)


def gate_from_sink_keys(weights: Tensor, keys: Tensor, *, phantom: bool) -> Tensor:
    """G_i = 1 - sum_{j in keys} a_ij (- phi_i with ``phantom``), (B, H, T); ``keys`` (B, H, S) bool."""
    gate = 1.0 - (weights * keys.unsqueeze(-2).to(weights.dtype)).sum(-1)  # (B, H, T)
    if phantom:
        gate = gate - (1.0 - weights.sum(-1))  # (B, H, T): minus phi_i
    return gate


def default_sink_set(has_phantom: bool) -> str:
    """What a model has: its phantom where it has one (gpt-oss, sinklogit), else its first key."""
    return "phantom" if has_phantom else "first"


def gate_from_weights(weights: Tensor, *, first: bool, phantom: bool) -> Tensor:
    """G_i = 1 - A_sink,i from explicit attention weights, (B, H, T).

    ``weights`` (B, H, T, S) are a_ij with any phantom in the normaliser (rows sum to
    1 - phi_i: Hugging Face's gpt-oss eager weights, the trainer's explicit path), so the
    phantom mass is ``1 - sum_j a_ij`` and the mass on key 0 is ``a_i0``.
    """
    gate = torch.ones_like(weights[..., 0])  # (B, H, T)
    if first:
        gate = gate - weights[..., 0]  # (B, H, T): minus a_i0
    if phantom:
        gate = gate - (1.0 - weights.sum(-1))  # (B, H, T): minus phi_i
    return gate


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x <= 0, accurate at both ends (Maechler 2012); -inf at x = 0."""
    x = x.clamp(max=0.0)
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def gate_from_lse(lse: Tensor, *, first_logit: Tensor | None, sink_logit: Tensor | None, first: bool,
                  phantom: bool) -> Tensor:
    """G_i = sigmoid(LSE_rest,i - LSE_sink,i), the fused form (module docstring), (B, H, T).

    Args:
        lse: LSE_i over the real keys, (B, H, T) (a fused kernel's log-sum-exp).
        first_logit: s_i0, the logit of key 0 with the model's mask (-inf or the dtype's minimum
            where key 0 is hidden, e.g. past a sliding window), (B, H, T); needed when ``first``.
        sink_logit: the model's phantom logit, b_h (H,) per head or b_hi (B, H, T) per query
            (Inkling2), or None without a phantom. A phantom
            outside the sink set still takes part in the normaliser (it belongs to ``rest``).
        first, phantom: the sink set (:func:`sink_parts`).

    Computed in the inputs' precision (at least float32). Near G = 0 (a row almost all on the
    sink) the absolute error is that of LSE itself, about one ulp of |LSE| (2e-6 at LSE = 30 in
    float32), since G then rests on the small difference LSE - s_i0.
    """
    dtype = torch.promote_types(lse.dtype, torch.float32)
    lse = lse.to(dtype)
    b = None if sink_logit is None else (sink_logit.to(dtype).view(1, -1, 1) if sink_logit.dim() == 1
                                         else sink_logit.to(dtype))  # (1, H, 1) or (B, H, T)
    if phantom and b is None:  # a layer without a phantom in a model with one (MiMo's full layers): no phantom mass
        if not first:
            return torch.ones_like(lse)  # (B, H, T): nothing in the sink set, every row fully active
        phantom = False
    rest, sink = lse, None  # (B, H, T)
    if first:
        s0 = first_logit.to(dtype)  # (B, H, T)
        rest = lse + log1mexp(s0 - lse)  # (B, H, T): LSE over the real keys j >= 1
        sink = s0
    if phantom:
        sink = b.expand_as(lse) if sink is None else torch.logaddexp(sink, b)  # (B, H, T)
    elif b is not None:
        rest = torch.logaddexp(rest, b)  # (B, H, T): the phantom is not a sink here, it counts as active
    return torch.sigmoid(rest - sink)  # (B, H, T)


def query_items(gate: Tensor) -> Tensor:
    """The gates Imp averages: queries i >= 1 of (B, H, T) (all of a one-token window)."""
    return gate[:, :, FIRST_QUERY:] if gate.shape[-1] > FIRST_QUERY else gate  # (B, H, T')


def head_importance(gate: Tensor) -> Tensor:
    """Imp^{l,h} = mean over windows and queries i >= 1 of G_i: (B, H, T) -> (H,)."""
    return query_items(gate).mean(dim=(0, 2))  # (H,)


def load_imbalance(importance: Tensor) -> Tensor:
    """CV of the importance across heads (last axis), std / mean with the population std: (..., H) -> (...,)."""
    mean = importance.mean(dim=-1)  # (...,)
    std = importance.std(dim=-1, correction=0)  # (...,)
    return std / mean.clamp_min(1e-12)  # (...,)


def load_balance_loss(importance: Tensor) -> Tensor:
    """Fu et al. 2026's sink-aware load-balancing term: mean over layers of CV(Imp^{l,.})^2, (L, H) -> ()."""
    cv = load_imbalance(importance)  # (L,)
    return (cv * cv).mean()


def dormant(importance: Tensor, below: float) -> Tensor:
    """Which heads are dormant: Imp^{l,h} < ``below`` (strict), bool of the same shape."""
    return importance < below
