"""Synthetic attention records and their float64 reference, for the probe unit tests.

A record is built from random q, k, v drawn with numpy (rounded to float32, the dtype the
record holds, so both sides start from the same numbers). The reference side computes the
logits, the causal (optionally sliding-window) visibility, the softmax with an optional phantom
and every derived quantity itself, in numpy float64, following docs/SPEC.md "Notation"::

    s_ij  = scale * q_i . k_j (+ beta_j)      LSE_i = log sum_{j visible} exp(s_ij)
    a_ij  = exp(s_ij) / (exp(b) + sum_k exp(s_ik))     phi_i = sigmoid(b - LSE_i)
    w_ij  = exp(s_ij - LSE_i)

It never calls an ``AttentionRecord`` method. ``expected_means`` applies SPEC.md "Averages"
(per-head mean over items and windows, layer mean over heads, model mean over layers, ``n`` the
items behind each number, ``se`` over windows with ``n_w - 1``) to per-item arrays, and
``assert_rows`` compares a probe's rows against it.

This file is a helper imported by the tests beside it (pytest puts their folder on ``sys.path``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from sinkscope.capture.families import ModelSpec
from sinkscope.capture.record import AttentionRecord


def spec(n_layers: int = 2, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 8, *,
         attention_layers: tuple[int, ...] | None = None, has_phantom: bool = False,
         has_output_gate: bool = False, has_value_gate: bool = False) -> ModelSpec:
    """A hand-built ModelSpec of a small synthetic model."""
    return ModelSpec(family="synthetic", n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                     head_dim=head_dim, hidden_size=n_heads * head_dim,
                     attention_layers=tuple(range(n_layers)) if attention_layers is None else attention_layers,
                     has_phantom=has_phantom, has_output_gate=has_output_gate, has_value_gate=has_value_gate)


def visibility(T: int, S: int, window: int | None = None) -> np.ndarray:
    """(T, S) bool: query i (absolute position i + S - T) sees key j (causal, and i - j < W when windowed)."""
    rows = np.arange(T)[:, None] + (S - T)  # (T, 1)
    cols = np.arange(S)[None, :]  # (1, S)
    seen = cols <= rows
    if window is not None:
        seen &= rows - cols < window
    return seen


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def f32(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to float32 and back to float64 (the values the record holds)."""
    return np.asarray(x, dtype=np.float32).astype(np.float64)


@dataclass
class Synthetic:
    """One synthetic layer: the record a probe reads and the float64 reference of its attention.

    Attributes:
        record: the AttentionRecord (explicit: ``weights`` = a; fused: ``kernel_lse`` = LSE).
        q: (B, H, T, D), k, v: (B, Hkv, S, D) float64 (float32-representable).
        s: (B, H, T, S) logits, -inf where hidden.
        visible: (T, S) bool.
        lse: (B, H, T) LSE_i over the visible real keys.
        b: (B|1, H, T|1) phantom logits as rows, or None.
        a: (B, H, T, S) a_ij, phantom in the normaliser.
        w: (B, H, T, S) w_ij, real keys only.
        phi: (B, H, T) phantom mass (0 without a phantom).
        groups: H // Hkv (query head h reads value head h // groups).
    """

    record: AttentionRecord
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    s: np.ndarray
    visible: np.ndarray
    lse: np.ndarray
    b: np.ndarray | None
    a: np.ndarray
    w: np.ndarray
    phi: np.ndarray
    groups: int


def make_layer(layer: int = 0, *, B: int = 3, H: int = 4, Hkv: int = 2, T: int = 12, D: int = 8, seed: int = 0,
               window: int | None = None, sink: str | None = None, fused: bool = False,
               mask: str | None = None, sink_strength: np.ndarray | None = None,
               key_bias: np.ndarray | None = None, weights_only: bool = False, **fields) -> Synthetic:
    """A random attention layer with a key-0 sink of per-head strength, as a record plus its reference.

    Args:
        layer: the record's layer index.
        B, H, Hkv, T, D: windows, query heads, value heads, queries (= keys), head dim.
        seed: numpy seed of q, k, v and the phantom logits.
        window: sliding window W (keys with i - j >= W hidden); the record then carries the mask.
        sink: None, ``"head"`` (a learned phantom logit b_h, (H,)) or ``"query"`` (b_hi, (B, H, T)).
        fused: a fused record (``kernel_lse``, no weights) instead of an explicit one.
        mask: None (plain causal, no mask tensor, unless ``window``), ``"inf"`` (an additive mask of
            -inf) or ``"min"`` (of float32's minimum, as Hugging Face builds it).
        sink_strength: (H,) how much each head's queries favour key 0 (default 0 .. 2).
        key_bias: (B, Hkv, S) a per-key logit term (routing-norm's log g_j), or None.
        weights_only: an eager-fallback record (weights only: no q, k, v, mask).
        **fields: further AttentionRecord fields (value_gate, output_gate, gate_columns, ...).
    """
    rng = np.random.default_rng(seed)
    S, groups = T, H // Hkv
    strength = np.linspace(0.0, 2.0, H) if sink_strength is None else np.asarray(sink_strength, dtype=np.float64)
    q = rng.normal(size=(B, H, T, D))
    k = rng.normal(size=(B, Hkv, S, D))
    v = rng.normal(size=(B, Hkv, S, D))
    q[..., 0] += 3.0 * strength[None, :, None]  # queries of strong heads align with key 0's first channel
    k[:, :, 0, 0] += 3.0
    q, k, v = f32(q), f32(k), f32(v)
    scale = 1.0 / math.sqrt(D)

    k_rep = np.repeat(k, groups, axis=1)  # (B, H, S, D)
    s = scale * np.einsum("bhtd,bhsd->bhts", q, k_rep)  # (B, H, T, S)
    if key_bias is not None:
        s = s + np.repeat(f32(key_bias), groups, axis=1)[:, :, None, :]  # (B, H, T, S)
    seen = visibility(T, S, window)  # (T, S)
    s = np.where(seen, s, -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)  # (B, H, T)
    w = np.exp(s - lse[..., None])  # (B, H, T, S)

    b = None
    sink_logits = None
    if sink == "head":
        sink_logits = f32(rng.normal(size=H) + 1.0)  # (H,)
        b = sink_logits[None, :, None]  # (1, H, 1)
    elif sink == "query":
        sink_logits = f32(rng.normal(size=(B, H, T)) + 1.0)  # (B, H, T)
        b = sink_logits
    elif sink is not None:
        raise ValueError(sink)
    phi = np.zeros_like(lse) if b is None else sigmoid(b - lse)  # (B, H, T)
    a = w * (1.0 - phi)[..., None]  # (B, H, T, S): a_ij = w_ij (1 - phi_i)

    mask_tensor = None
    if window is not None or mask is not None:
        fill = -np.inf if mask in (None, "inf") else float(np.finfo(np.float32).min)
        mask_tensor = torch.from_numpy(np.where(seen, 0.0, fill)).float().expand(B, 1, T, S).clone()  # (B, 1, T, S)

    t = lambda x: torch.from_numpy(np.ascontiguousarray(x)).float()  # noqa: E731
    record = AttentionRecord(
        layer=layer,
        query=None if weights_only else t(q),
        key=None if weights_only else t(k),
        value=None if weights_only else t(v),
        scale=float("nan") if weights_only else scale,
        mask=None if weights_only else mask_tensor,
        weights=None if fused else t(a),
        kernel_lse=t(lse) if fused else None,
        sliding_window=window,
        sink_logits=None if sink_logits is None else t(sink_logits),
        key_bias=None if key_bias is None else t(key_bias),
        **fields)
    return Synthetic(record, q, k, v, s, seen, lse, b, a, w, phi, groups)


# ---- the pooling convention (SPEC.md "Averages") -----------------------------------------------------


@dataclass
class Expected:
    """One expected row: value, n and se (NaN where undefined)."""

    value: float
    n: int
    se: float = math.nan


def _se(window_means: np.ndarray) -> float:
    """sd over windows (n - 1) / sqrt(n); NaN for fewer than 2 windows."""
    n = len(window_means)
    return float(np.std(window_means, ddof=1) / math.sqrt(n)) if n >= 2 else math.nan


def expected_means(items: dict[int, np.ndarray], *, window_se: bool = True) -> dict[tuple, Expected]:
    """Rows of a per-head mean over items and windows, from per-item values.

    Args:
        items: layer -> (B, H, N) per-item values (B windows, H heads, N items per window and head).
        window_se: whether the rows carry the standard error over the B windows.
    Returns:
        {(layer, head) | (layer, None) | (None, None): Expected}, ``n`` the B windows on every row
        (SPEC.md "Tables"), ``se`` over them on every row (the model row's over each window's mean
        over the layers of its layer means).
    """
    out: dict[tuple, Expected] = {}
    layer_values, layer_windows = [], []
    for layer in sorted(items):
        x = np.asarray(items[layer], dtype=np.float64)  # (B, H, N)
        B, H, N = x.shape
        per_window = x.mean(axis=2)  # (B, H)
        for h in range(H):
            out[(layer, h)] = Expected(float(x[:, h].mean()), B, _se(per_window[:, h]) if window_se else math.nan)
        layer_values.append(float(x.mean(axis=(0, 2)).mean()))
        layer_windows.append(per_window.mean(axis=1))  # (B,): each window's mean over the layer's heads
        out[(layer, None)] = Expected(layer_values[-1], B, _se(layer_windows[-1]) if window_se else math.nan)
    if layer_values:
        model_windows = np.mean(layer_windows, axis=0)  # (B,): each window's mean over the layers
        out[(None, None)] = Expected(float(np.mean(layer_values)), len(model_windows),
                                     _se(model_windows) if window_se else math.nan)
    return out


def fixed_rows(values: dict[int, np.ndarray]) -> dict[tuple, Expected]:
    """Rows of one fixed value per head (a learned parameter): n = 1 on every row (read once), no se."""
    out: dict[tuple, Expected] = {}
    layer_values = []
    for layer in sorted(values):
        heads = np.asarray(values[layer], dtype=np.float64)
        for h, value in enumerate(heads):
            out[(layer, h)] = Expected(float(value), 1)
        layer_values.append(float(heads.mean()))
        out[(layer, None)] = Expected(layer_values[-1], 1)
    out[(None, None)] = Expected(float(np.mean(layer_values)), 1)
    return out


def by_key(rows, metric: str) -> dict[tuple, object]:
    """The rows of ``metric`` keyed by (layer, head); each key must be unique."""
    out = {}
    for row in rows:
        if row.metric == metric:
            key = (row.layer, row.head)
            assert key not in out, f"two {metric} rows for {key}"
            out[key] = row
    return out


def assert_rows(rows, metric: str, expected: dict[tuple, Expected], *, tol: float = 1e-5, check_se: bool = True,
                check_n: bool = True) -> None:
    """The rows of ``metric`` are exactly the keys of ``expected``, with its values, n and se."""
    got = by_key(rows, metric)
    assert set(got) == set(expected), (metric, sorted(set(got) ^ set(expected), key=str))
    for key, want in expected.items():
        row = got[key]
        assert abs(row.value - want.value) <= tol * max(1.0, abs(want.value)), (metric, key, row.value, want.value)
        if check_n:
            assert row.n == want.n, (metric, key, row.n, want.n)
        if check_se:
            if math.isnan(want.se):
                assert math.isnan(row.se), (metric, key, row.se)
            else:
                assert abs(row.se - want.se) <= tol * max(1.0, abs(want.se)), (metric, key, row.se, want.se)
