"""Every attention variant against an independent reference, sliding windows, the phantom kernel,
force-sink under both norms, and the variant flags that cannot compose.

The reference (:func:`reference_attention`) recomputes a layer's attention output in float64
numpy from the materialised weights alone (c_attn, c_proj, the sink logits, the gate parameters,
W_g) with the formulas of SPEC.md "Trainer variants"; it never calls the model's own helpers
(``gate_logit``, ``output_gate``, ``sink_logits``, ``visible``), so a wrong sign or a wrong
gate in the model cannot hide in both. Checked to catch (each applied by hand, then reverted):
the projection gate's bias with the wrong sign, the output gate applied as 1 - g, and
sigmoid(-z) for the output gate.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sinkscope.models.trainer_config import SINK_LOGIT_RANGE, VARIANTS, GPTConfig, Variant
from sinkscope.train.model import GPT

VOCAB, T, B = 64, 16, 3
L, H, C = 2, 4, 32
D = C // H
CASES = [(v, "elementwise") for v in VARIANTS] + [("outgate", "headwise")]
CASE_IDS = [v if m == "elementwise" else f"{v}-{m}" for v, m in CASES]


def make(variant="baseline", mode="elementwise", seed=0, **overrides) -> GPT:
    torch.manual_seed(seed)
    fields = dict(vocab_size=VOCAB, block_size=32, n_layer=L, n_head=H, n_embd=C, variant=variant, outgate_mode=mode)
    return GPT(GPTConfig(**{**fields, **overrides}))


@torch.no_grad()
def perturb(model: GPT, seed: int = 2) -> GPT:
    """Move every parameter off its init so each gate and logit is mid-range and matters."""
    g = torch.Generator().manual_seed(seed)
    for block in model.transformer.h:
        attn = block.attn
        attn.c_attn.weight.mul_(4.0)
        if hasattr(attn, "sink_logit"):
            attn.sink_logit.copy_(torch.randn(H, generator=g))
        if hasattr(attn, "gate_tau"):
            attn.gate_tau.copy_(0.45 + 0.1 * torch.randn(H, generator=g))
        if hasattr(attn, "gate_w"):
            attn.gate_w.copy_(torch.randn(H, D, generator=g))
            attn.gate_b.copy_(0.5 + 0.5 * torch.randn(H, generator=g))  # clearly non-zero: its sign matters
        if hasattr(attn, "c_gate"):
            attn.c_gate.weight.copy_(0.5 * torch.randn(attn.c_gate.weight.shape, generator=g) + 0.05)
    if model.sink_token is not None:
        model.sink_token.copy_(torch.randn(C, generator=g))
    return model


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def reference_attention(attn, x: np.ndarray, variant: str, mode: str, window: int | None) -> np.ndarray:
    """A layer's attention output (B, T', C) from its weights, float64, formulas of SPEC.md.

    x is the layer's (normed) input (B, T', C). Wang 2026 Table 5 / SPEC.md "Trainer variants":
    s_ij = q_i.k_j / sqrt(D) over visible keys (j <= i; on a sliding layer i - j < W, the sink
    token's key 0 always visible); phantom: a_ij = e^{s_ij} / (e^{b_h} + sum_k e^{s_ik}) with
    b_h = clamp(learned, -10, 15) or 0 (offbyone); norm gate g_j = sigmoid(beta (||v_j||/sqrt(D)
    - tau_h)); projection gate g_j = sigmoid(w_h . v_j + c_h); value slot: read g_j v_j;
    routing slot: logits s_ij + log g_j; output gate (Qiu et al. 2025 G1): sigmoid(x W_g^T) multiplies
    the head output (per channel, or one per head).
    """
    spec = VARIANTS[variant]
    Bx, Tx, _ = x.shape
    W = _np(attn.c_attn.weight)  # (3C, C)
    q, k, v = x @ W[:C].T, x @ W[C:2 * C].T, x @ W[2 * C:].T  # (B, T, C) each
    q = q.reshape(Bx, Tx, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D)
    k = k.reshape(Bx, Tx, H, D).transpose(0, 2, 1, 3)  # (B, H, S, D)
    v = v.reshape(Bx, Tx, H, D).transpose(0, 2, 1, 3)  # (B, H, S, D)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)  # (B, H, T, S)
    i, j = np.arange(Tx)[:, None], np.arange(Tx)[None, :]
    visible = j <= i
    if window is not None:
        visible &= ((i - j) < window) | ((j == 0) & spec.sink_token)
    g = None
    if spec.value_gate == "norm":
        tau = _np(attn.gate_tau)  # (H,)
        g = _sigmoid(attn.beta * (np.linalg.norm(v, axis=-1) / math.sqrt(D) - tau[None, :, None]))  # (B, H, S)
    elif spec.value_gate == "proj":
        w, c = _np(attn.gate_w), _np(attn.gate_b)  # (H, D), (H,)
        g = _sigmoid(np.einsum("bhsd,hd->bhs", v, w) + c[None, :, None])  # (B, H, S)
    if spec.routing:
        s = s + np.log(g)[:, :, None, :]  # (B, H, T, S)
    e = np.where(visible, np.exp(s - s.max(-1, keepdims=True)), 0.0)  # (B, H, T, S), shifted by m_i
    denominator = e.sum(-1, keepdims=True)  # (B, H, T, 1)
    if spec.phantom is not None:
        b = np.zeros(H) if spec.phantom == "fixed" else np.clip(_np(attn.sink_logit), *SINK_LOGIT_RANGE)  # (H,)
        denominator = denominator + np.exp(b[None, :, None, None] - s.max(-1, keepdims=True))
    a = e / denominator  # (B, H, T, S)
    reads = v if g is None or spec.routing else g[..., None] * v  # (B, H, S, D)
    y = a @ reads  # (B, H, T, D)
    if spec.output_gate:
        z = x @ _np(attn.c_gate.weight).T  # (B, T, H*D) or (B, T, H)
        gate = _sigmoid(z).reshape(Bx, Tx, H, -1).transpose(0, 2, 1, 3)  # (B, H, T, D|1)
        y = y * gate
    y = y.transpose(0, 2, 1, 3).reshape(Bx, Tx, C)  # (B, T, C)
    return y @ _np(attn.c_proj.weight).T  # (B, T, C)


def layer_io(model: GPT, idx: torch.Tensor, attention: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of every attention module in one forward pass."""
    seen = []
    hooks = [block.attn.register_forward_hook(lambda _m, args, out: seen.append((args[0], out[0])))
             for block in model.transformer.h]
    try:
        with torch.no_grad():
            model(idx, attention=attention)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))  # (B, T)


# ---- each variant against the independent reference -------------------------------------------------


@pytest.mark.parametrize("pattern", ["full", "sliding,full"])
@pytest.mark.parametrize("variant,mode", CASES, ids=CASE_IDS)
def test_attention_matches_independent_reference(variant, mode, pattern):
    model = perturb(make(variant, mode, layer_pattern=pattern, window=5))
    if variant in ("sinklogit", "sink+norm", "sink+proj"):  # one logit beyond each bound: the clamp bites
        with torch.no_grad():
            model.transformer.h[0].attn.sink_logit[:2] = torch.tensor([18.0, -13.0])
    idx = tokens()
    for path in ("fused", "explicit"):
        for layer, (x, out) in enumerate(layer_io(model, idx, path)):
            window = model.config.layer_window(layer)
            expected = reference_attention(model.transformer.h[layer].attn, _np(x), variant, mode, window)
            error = np.abs(_np(out) - expected).max()
            assert error < 2e-5, (path, layer, error)


def test_reference_sees_each_gate():
    """The reference is not vacuous: each gate moves the output by far more than the tolerance."""
    for variant, mode in [("projgate", "elementwise"), ("outgate", "elementwise"), ("outgate", "headwise")]:
        model = perturb(make(variant, mode))
        attn = model.transformer.h[0].attn
        x = _np(layer_io(model, tokens(), "fused")[0][0])
        with torch.no_grad():
            if variant == "projgate":
                attn.gate_b.neg_()  # the bias with the other sign
            else:
                attn.c_gate.weight.neg_()  # sigmoid(-z) = 1 - sigmoid(z)
        flipped = reference_attention(attn, x, variant, mode, None)
        with torch.no_grad():
            if variant == "projgate":
                attn.gate_b.neg_()
            else:
                attn.c_gate.weight.neg_()
        assert np.abs(flipped - reference_attention(attn, x, variant, mode, None)).max() > 1e-3


# ---- the learned-sinks note: sliding windows and the clamp ------------------------------------------------------


def test_layer_pattern_and_window_config():
    config = GPTConfig(n_layer=5, layer_pattern="sliding,full", window=7)
    assert [config.layer_window(l) for l in range(5)] == [7, None, 7, None, 7]
    assert GPTConfig(n_layer=3).layer_window(2) is None
    assert [GPTConfig(n_layer=3, layer_pattern="sliding").layer_window(l) for l in range(3)] == [128] * 3
    with pytest.raises(ValueError, match="layer_pattern"):
        GPTConfig(layer_pattern="sliding,local")
    with pytest.raises(ValueError, match="window"):
        GPTConfig(window=0)
    with pytest.raises(ValueError, match="norm"):
        GPTConfig(norm="batchnorm")


@pytest.mark.parametrize("variant", ["baseline", "sinklogit", "sinktoken", "routing-norm"])
def test_sliding_records_and_probes_honour_the_window(variant):
    W = 4
    model = perturb(make(variant, layer_pattern="sliding,full", window=W))
    tap = _Recorder()
    with torch.no_grad():
        model(tokens(), tap=tap)
    sliding, full = tap.records
    assert sliding.sliding_window == W and full.sliding_window is None
    S = sliding.weights.shape[-1]
    i, j = torch.arange(S).view(S, 1), torch.arange(S).view(1, S)
    hidden = (j > i) | ((i - j) >= W)
    if variant == "sinktoken":
        hidden &= j != 0  # the sink token stays visible
    assert torch.all(sliding.weights[:, :, hidden] == 0)
    assert torch.all(torch.isinf(sliding.mask[0, 0][hidden])) and torch.all(sliding.mask[0, 0][~hidden] == 0)
    assert torch.all(sliding.weights[:, :, ~hidden] > 0)
    # the probes' mass on key 0 follows the window: zero once key 0 is out of reach
    p0 = sliding.key_mass(0, over="real")  # (B, H, T)
    if variant == "sinktoken":
        assert p0[:, :, W:].min() > 0
    else:
        assert torch.all(p0[:, :, W:] == 0) and p0[:, :, 1:W].min() > 0
    assert full.key_mass(0, over="real")[:, :, W:].min() > 0
    # fused record quantities agree with the explicit weights on the sliding layer
    assert torch.allclose(torch.softmax(sliding.logits(), -1) * sliding.real_mass().unsqueeze(-1), sliding.weights,
                          atol=1e-6) or variant == "routing-norm"


@pytest.mark.parametrize("variant", ["sinklogit", "sink+proj"])
def test_sink_logit_clamp_bounds_forward_and_gradient(variant):
    model = perturb(make(variant, layer_pattern="sliding,full", window=5))
    logits = model.transformer.h[0].attn.sink_logit
    with torch.no_grad():
        logits.copy_(torch.tensor([20.0, -14.0, 3.0, -2.0]))
    before = logits.detach().clone()
    idx = tokens()
    for path in ("fused", "explicit"):
        model.zero_grad(set_to_none=True)
        out, loss = model(idx, tokens(5), attention=path)
        loss.backward()
        grad = logits.grad
        assert torch.equal(grad[:2], torch.zeros(2)) and torch.all(grad[2:] != 0), (path, grad)
        clamped = perturb(make(variant, layer_pattern="sliding,full", window=5))
        with torch.no_grad():
            clamped.transformer.h[0].attn.sink_logit.copy_(torch.tensor([15.0, -10.0, 3.0, -2.0]))
            assert torch.allclose(clamped(idx, attention=path)[0], out, atol=1e-6)
    assert torch.equal(logits.detach(), before)  # the parameter itself is never clamped


# ---- the phantom on the causal kernel ---------------------------------------------------------------


def _phantom_reference(q, k, v, b, window=None):
    """softmax over [phantom, real keys] with the phantom's value 0, float64 (B, H, T, D)."""
    Tq = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    i, j = torch.arange(Tq).view(-1, 1), torch.arange(Tq).view(1, -1)
    hidden = (j > i) if window is None else (j > i) | (i - j >= window)
    s = s.masked_fill(hidden, float("-inf"))
    column = b.view(1, -1, 1, 1).expand(q.shape[0], -1, Tq, 1)  # (B, H, T, 1)
    a = torch.softmax(torch.cat([column, s], dim=-1), dim=-1)[..., 1:]  # (B, H, T, S)
    return a @ v


@pytest.mark.parametrize("window", [None, 5])
def test_phantom_kernel_construction_is_exact(window, monkeypatch):
    """Wang 2026's dummy query row: the causal kernel on T+1 rows equals the phantom softmax exactly
    (float64: to 1e-12), and full layers call SDPA with is_causal and no mask (flash-eligible)."""
    model = make("sinklogit", layer_pattern="full" if window is None else "sliding", window=window or 128)
    attn = model.transformer.h[0].attn
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, H, T, D, generator=g, dtype=torch.float64) * 2 for _ in range(3))
    with torch.no_grad():
        attn.sink_logit.copy_(torch.tensor([-3.0, 0.0, 1.5, 4.0]))
    calls = []
    original = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append({"mask": kwargs.get("attn_mask") is not None, "causal": kwargs.get("is_causal", False),
                      "shape": tuple(args[0].shape)})
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    with torch.no_grad():
        y, importance = attn.attend_fused(q, k, v, None, True)
    expected = _phantom_reference(q, k, v, attn.sink_logit.detach().double(), window)
    assert (y - expected).abs().max().item() < 1e-12
    real = _phantom_reference(q, k, torch.ones_like(v[..., :1]), attn.sink_logit.detach().double(), window)
    assert (importance - real[..., 0]).abs().max().item() < 1e-7  # sum_j a_ij, same call (returned in float32)
    assert len(calls) == 1
    if window is None:
        assert calls[0] == {"mask": False, "causal": True, "shape": (2, H, T + 1, 16)}  # dummy row, width 16
    else:
        assert calls[0]["mask"] and not calls[0]["causal"]


# ---- force-sink under both norms ----------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("variant", ["baseline", "sinktoken"])
def test_force_sink_partition_is_exact(norm, variant):
    """The P0-sink study: k channels live only at position 0, the other C - k everywhere else, exactly,
    in the residual stream and in every norm's output (the attention's, the MLP's, the head's)."""
    k = 4
    model = perturb(make(variant, force_sink_k=k, norm=norm))
    assert all(isinstance(m, torch.nn.RMSNorm if norm == "rmsnorm" else torch.nn.LayerNorm)
               for m in (model.transformer.ln_f, model.transformer.h[0].ln_1))
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for layer, block in enumerate(model.transformer.h):
        hooks.append(block.attn.register_forward_pre_hook(lambda _m, a, l=layer: seen.__setitem__(f"ln1.{l}", a[0])))
        hooks.append(block.mlp.register_forward_pre_hook(lambda _m, a, l=layer: seen.__setitem__(f"ln2.{l}", a[0])))
        hooks.append(block.ln_1.register_forward_hook(lambda _m, _a, out, l=layer: seen.__setitem__(f"raw.{l}", out)))
        hooks.append(block.register_forward_hook(lambda _m, _a, out, l=layer: seen.__setitem__(f"resid.{l}", out[0])))
    hooks.append(model.lm_head.register_forward_pre_hook(lambda _m, a: seen.__setitem__("lnf", a[0])))
    with torch.no_grad():
        model(tokens())
    for hook in hooks:
        hook.remove()
    for name, h in seen.items():
        if name.startswith("raw") or name == "lnf" and variant == "sinktoken":
            continue  # lm_head never sees the sink token's position
        assert torch.all(h[:, 0, k:] == 0), name
        assert torch.all(h[:, 1:, :k] == 0), name
        assert h[:, 0, :k].abs().min() > 0 and h[:, 1:, k:].abs().amax(-1).min() > 0, name
    if variant == "baseline":
        assert torch.all(seen["lnf"][:, 0, k:] == 0) and torch.all(seen["lnf"][:, 1:, :k] == 0)
    raw = seen["raw.1"]  # the norm's own output, before the mask: LayerNorm's centring leaks, RMSNorm's does not
    leak = raw[:, 1:, :k].abs().max().item()
    assert (leak > 1e-3) if norm == "layernorm" else (leak == 0.0)


# ---- variant flags ------------------------------------------------------------------------------------


def test_variant_flags_that_cannot_compose_are_refused():
    with pytest.raises(ValueError, match="do not compose"):
        Variant(phantom="learned", value_gate="norm", routing=True)
    with pytest.raises(ValueError, match="routing needs a value_gate"):
        Variant(routing=True)
    with pytest.raises(ValueError, match="phantom must be"):
        Variant(phantom="soft")
    with pytest.raises(ValueError, match="value_gate must be"):
        Variant(value_gate="ratio")
    assert all(isinstance(v, Variant) for v in VARIANTS.values())  # the registry itself passes


class _Recorder:
    def __init__(self):
        self.records = []

    def on_attention(self, record):
        self.records.append(record)

    def on_residual(self, layer, hidden):
        pass
