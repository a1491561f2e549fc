"""The bundled trainer's model: a GPT-2-style decoder with every attention variant of SPEC.md.

One file, nanoGPT style. SPEC.md "Trainer variants" defines the decoder and its init, the
variants (``VARIANTS``; Wang 2026 Table 5 and Qiu et al. 2025's output gate) with their formulas, and the
training-objective options of ``GPT.forward`` (``tnlm``, ``force_sink_k``, ``lb_lambda``); its
"Training data (resolved)" adds the learned-sinks note's sliding layers (``layer_pattern``, ``window``; the
phantom and ``sinktoken``'s token stay visible to every query) and the sink clamp
(``SINK_LOGIT_RANGE``). Here the projection gate's bias is c_h, not to be confused with the sink
logit b_h.

Every variant runs on two paths that compute the same function (tests hold them to 1e-5):
``explicit``, materialised logits and weights in float32 (the reference), and ``fused``,
``F.scaled_dot_product_attention`` with the phantom as SPEC.md's extra key column (value 0) and
extra q/k coordinate (q: sqrt(D), phantom key: b_h, real keys: 0; scale 1/sqrt(D)), q, k and v
zero-padded to one width, a multiple of 8. A full layer with a phantom uses Wang 2026's dummy query
row: one extra row before the real queries and the *causal* kernel on T+1 rows and S+1 keys, so
real query i (row i + 1) sees the phantom and keys 0..i with no explicit mask (flash kernels
apply); a sliding layer passes its boolean mask. routing-norm puts log g_j in the extra key
coordinate. A probe run that observes ``blocks.{l}.attn`` takes the path it asks for (the fused
record: :meth:`CausalSelfAttention.attend_recorded`, linear memory); the hook points
(``capture/hooks.py``) leave through ``taps.py``.

Shape letters as in ``capture/record.py``: B batch, H heads, T queries, S keys (S == T), D head
dim, C width (channels), L layers, V vocabulary.
"""

from __future__ import annotations

import math
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sinkscope.capture import hooks as hp
from sinkscope.capture.families import ModelSpec
from sinkscope.stats import gates
from sinkscope.capture.record import QUIET_CUTOFFS, AttentionRecord
from sinkscope.models.trainer_config import GPTConfig, SINK_LOGIT_RANGE
from sinkscope.train import taps

#: ``ModelSpec.family`` of the trainer's model (it has no transformers ``model_type``).
MODEL_TYPE = "sinkscope-gpt"

#: fused kernels want the head dim of an augmented q/k to be a multiple of this.
HEAD_DIM_MULTIPLE = 8


# ---- helpers --------------------------------------------------------------------------------


def _fp32(t: Tensor):
    """A region where autocast is off: gate maths and the explicit path run in float32."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def visible_keys(T: int, device=None, *, window: int | None = None, keep_first: bool = False) -> Tensor:
    """Which real key j query i sees, (T, S) bool with S == T (True = visible).

    Causal: j <= i. On a sliding layer also i - j < ``window``; ``keep_first`` keeps key 0
    visible to every query anyway (``sinktoken``'s learned token, an abstention slot).
    """
    i = torch.arange(T, device=device).view(T, 1)  # (T, 1)
    j = torch.arange(T, device=device).view(1, T)  # (1, S)
    seen = j <= i  # (T, S)
    if window is not None:
        near = (i - j) < window  # (T, S)
        if keep_first:
            near = near | (j == 0)  # (T, S)
        seen = seen & near  # (T, S)
    return seen


def _additive(visible: Tensor) -> Tensor:
    """0 where visible, -inf elsewhere, (1, 1, T, S) float32: the record's ``mask``."""
    T, S = visible.shape
    return torch.zeros(T, S, device=visible.device).masked_fill(~visible, float("-inf")).view(1, 1, T, S)


def load_balance_loss(importance: Tensor) -> Tensor:
    """Fu et al. 2026's load-balancing term: mean over layers of CV(Imp^{l,.})^2 (``sinkscope.stats.gates``).

    ``importance`` is (L, H): Imp^{l,h} = mean over sequences and queries i >= 1 of the head's
    gate G_i. CV = std / mean across the heads of a layer, with the population std (divide by
    H), so a layer whose heads are equally important contributes exactly 0. The CV is the one
    ``sinkscope heads`` reports (``gates.load_imbalance``); differentiable.
    """
    return gates.load_balance_loss(importance)


def lm_loss(logits: Tensor, targets: Tensor, *, tnlm: bool = False) -> Tensor:
    """Mean next-token cross-entropy; targets of -1 are ignored.

    ``tnlm`` (the P0-sink study's TNLM loss) drops the term at position 0, the prediction made *at* the
    first token of the window. With a BOS-first data pipeline that is the BOS position, as in
    the P0-sink study; without one it is whatever token the window starts on (the CPU tier's random
    windows), whose prediction is a bigram from a context of one token. For ``sinktoken`` the
    sink's own output is already dropped, so position 0 is the first real token.
    """
    if tnlm:
        logits, targets = logits[:, 1:], targets[:, 1:]  # (B, T-1, V), (B, T-1)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


# ---- the modules ----------------------------------------------------------------------------


def make_norm(config: GPTConfig) -> nn.Module:
    """The pre-norm of ``config.norm``: LayerNorm or RMSNorm over C, no bias, eps 1e-5."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return nn.LayerNorm(config.n_embd, bias=False)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention with the variant's phantom, value gate or output gate."""

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        C, H, D = config.n_embd, config.n_head, config.head_dim
        self.n_head, self.head_dim = H, D
        self.variant = config.variant_spec
        self.beta = config.norm_gate_beta
        self.window = config.layer_window(layer)  # None on a full layer
        self.keep_first = self.variant.sink_token  # the sink token stays visible on sliding layers
        self.c_attn = nn.Linear(C, 3 * C, bias=False)  # W_Q, W_K, W_V side by side
        self.c_proj = nn.Linear(C, C, bias=False)  # W_O
        if self.variant.phantom == "learned":
            self.sink_logit = nn.Parameter(torch.zeros(H))  # b_h: (H,), init 0 (SPEC.md)
        if self.variant.value_gate == "norm":
            self.gate_tau = nn.Parameter(torch.full((H,), config.norm_gate_tau_init))  # tau_h: (H,)
        if self.variant.value_gate == "proj":
            self.gate_w = nn.Parameter(torch.empty(H, D))  # w_h: (H, D), drawn in GPT._init_weights
            self.gate_b = nn.Parameter(torch.full((H,), config.proj_gate_bias_init))  # c_h: (H,)
        if self.variant.output_gate:
            width = C if config.outgate_mode == "elementwise" else H
            self.c_gate = nn.Linear(C, width, bias=False)  # W_g: H*D (elementwise) or H (headwise) gates

    # -- the variant's extra pieces --------------------------------------------------------------

    def sink_logits(self) -> Tensor | None:
        """b_h as the forward pass uses it, (H,); zeros for offbyone; None without a phantom.

        The learned logit is clamped to ``SINK_LOGIT_RANGE`` (the learned-sinks note: gpt-oss clamps to
        [-10, 15]) without touching the parameter, so no gradient flows while it is outside.
        """
        if self.variant.phantom == "learned":
            return self.sink_logit.clamp(*SINK_LOGIT_RANGE)  # (H,)
        if self.variant.phantom == "fixed":
            return torch.zeros(self.n_head, device=self.c_attn.weight.device)  # (H,)
        return None

    def visible(self, T: int, device, cache: Tensor | None = None) -> Tensor:
        """The real keys each query of this layer sees, (T, S) bool (see :func:`visible_keys`).

        ``cache`` (T, S) bool, when given, is a bounded cache's visibility (``GPT.forward``'s
        ``visible``): the layer's own rule and it together.
        """
        seen = visible_keys(T, device, window=self.window, keep_first=self.keep_first)  # (T, S)
        return seen if cache is None else seen & cache  # (T, S)

    def gate_logit(self, v: Tensor) -> Tensor | None:
        """The value gate's pre-sigmoid z_j, float32 (B, H, S), so g_j = sigmoid(z_j); or None."""
        kind = self.variant.value_gate
        if kind is None:
            return None
        H = self.n_head
        with _fp32(v):
            vf = v.float()  # (B, H, S, D)
            if kind == "norm":  # beta (||v_j|| / sqrt(D) - tau_h)
                norm = vf.norm(dim=-1) / math.sqrt(self.head_dim)  # (B, H, S)
                return self.beta * (norm - self.gate_tau.float().view(1, H, 1))  # (B, H, S)
            # projection gate: w_h . v_j + c_h
            z = torch.einsum("bhsd,hd->bhs", vf, self.gate_w.float())  # (B, H, S)
            return z + self.gate_b.float().view(1, H, 1)  # (B, H, S)

    def output_gate(self, x: Tensor) -> Tensor | None:
        """sigmoid(x W_g) per head, float32 (B, H, T, D) or headwise (B, H, T, 1); or None."""
        if not self.variant.output_gate:
            return None
        B, T, _ = x.shape
        z = self.c_gate(x)  # (B, T, H*D) or (B, T, H)
        with _fp32(z):
            g = torch.sigmoid(z.float())  # (B, T, H*D) or (B, T, H)
        return g.view(B, T, self.n_head, -1).transpose(1, 2)  # (B, H, T, D) or (B, H, T, 1)

    # -- the two attention paths -------------------------------------------------------------------

    def attend_explicit(
        self, q: Tensor, k: Tensor, v: Tensor, z: Tensor | None, cache: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Materialised attention in float32: head outputs (B, H, T, D) and weights a_ij (B, H, T, S).

        a_ij has the phantom in its normaliser (rows sum to 1 - phi_i); for routing-norm it is
        softmax_j(s_ij + log g_j). ``z`` is the value gate's logit (B, H, S) or None.
        """
        B, H, T, D = q.shape
        with _fp32(q):
            qf, kf, vf = q.float(), k.float(), v.float()  # (B, H, T, D) each
            s = torch.matmul(qf, kf.transpose(-1, -2)) * (1.0 / math.sqrt(D))  # (B, H, T, S)
            s = s.masked_fill(~self.visible(T, q.device, cache), float("-inf"))  # (B, H, T, S): causal (+ window, cache)
            if z is not None and self.variant.routing:
                s = s + F.logsigmoid(z).unsqueeze(2)  # (B, H, T, S): s_ij + log g_j
            b = self.sink_logits()
            if b is not None:
                phantom = b.float().view(1, H, 1, 1).expand(B, H, T, 1)  # (B, H, T, 1)
                att = torch.softmax(torch.cat([phantom, s], dim=-1), dim=-1)[..., 1:]  # (B, H, T, S)
            else:
                att = torch.softmax(s, dim=-1)  # (B, H, T, S)
            if z is not None and not self.variant.routing:
                vf = torch.sigmoid(z).unsqueeze(-1) * vf  # (B, H, S, D): the read g_j v_j
            y = torch.matmul(att, vf)  # (B, H, T, D)
        return y.to(v.dtype), att

    def attend_recorded(
        self, q: Tensor, k: Tensor, v: Tensor, z: Tensor | None, gate_columns: bool, quiet_columns: bool = False,
        cache: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Fused attention for probe runs: outputs (B, H, T, D), LSE_i (B, H, T), gate columns, quiet columns.

        One ``attention_with_lse`` call in float32 over the real keys (no weights kept):

            value columns  [g_j v_j | x_j | x_j^2]  (value-slot gate; routing-norm: v_j), x_j = g_j - g_0
            logits         s_ij (+ log g_j for routing-norm: q gets sqrt(D) in one extra
                           coordinate and key j gets log g_j there, with the scale 1/sqrt(D))

        q, k and v are zero-padded to one width, a multiple of 8 (the CPU kernel wants equal
        head sizes; zero coordinates change no logit). The kernel's LSE is over real keys, so
        with a phantom the output is scaled by 1 - phi_i = 1 - sigmoid(b_h - LSE_i); the gate
        columns are moments under w_ij (real keys only) and need no such factor. A sliding layer
        (or a ``cache`` visibility) passes its (T, S) mask; a full layer the plain causal kernel. With ``quiet_columns`` the
        indicators of the quiet reads (``AttentionRecord.quiet_indicator_columns`` of the values
        before any gate, one per cutoff) follow as more value columns: sum_j w_ij 1[j quiet].
        """
        from sinkscope.capture.kernels import attention_with_lse

        B, H, T, D = q.shape
        with _fp32(q):
            qf, kf, vf = q.float(), k.float(), v.float()  # (B, H, T|S, D)
            g = None if z is None else torch.sigmoid(z)  # (B, H, S)
            if g is not None and not self.variant.routing:
                vf = g.unsqueeze(-1) * vf  # (B, H, S, D): the read g_j v_j
            n_gate = 2 if gate_columns and g is not None else 0
            if n_gate:
                vf = torch.cat([vf, AttentionRecord.moment_columns(g)], dim=-1)  # (B, H, S, D+2)
            n_quiet = len(QUIET_CUTOFFS) if quiet_columns else 0
            if n_quiet:
                vf = torch.cat([vf, AttentionRecord.quiet_indicator_columns(v)], dim=-1)  # (B, H, S, D+[2]+K)
            if self.variant.routing:
                qf = torch.cat([qf, qf.new_full((B, H, T, 1), math.sqrt(D))], dim=-1)  # (B, H, T, D+1)
                kf = torch.cat([kf, F.logsigmoid(z).unsqueeze(-1)], dim=-1)  # (B, H, S, D+1): log g_j
            width = max(qf.shape[-1], vf.shape[-1])
            width += -width % HEAD_DIM_MULTIPLE
            qf, kf, vpad = (F.pad(t, (0, width - t.shape[-1])) for t in (qf, kf, vf))  # (B, H, T|S, W)
            masked = self.window is not None or cache is not None
            mask = _additive(self.visible(T, q.device, cache)) if masked else None  # (1, 1, T, S)
            out, lse = attention_with_lse(qf, kf, vpad, 1.0 / math.sqrt(D), mask)  # (B, H, T, W), (B, H, T)
            y = out[..., :D]  # (B, H, T, D): real-key outputs
            b = self.sink_logits()
            if b is not None:
                y = y * (1.0 - torch.sigmoid(b.float().view(1, H, 1) - lse)).unsqueeze(-1)  # (B, H, T, D)
        columns = out[..., D:D + 2] if n_gate else None  # (B, H, T, 2)
        quiet = out[..., D + n_gate:D + n_gate + n_quiet] if n_quiet else None  # (B, H, T, K)
        return y.to(v.dtype), lse, columns, quiet

    def attend_fused(
        self, q: Tensor, k: Tensor, v: Tensor, z: Tensor | None, want_importance: bool, cache: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``F.scaled_dot_product_attention``: head outputs (B, H, T, D) and, if asked, G_i (B, H, T).

        The implicit gate G_i = 1 - A_sink,i comes out of the same kernel call as one crafted
        value column (DESIGN.md "Probes"): 1 on every real key (phantom 0) gives
        sum_j a_ij = 1 - phi_i; the indicator of key 0 gives a_i0, and G_i = 1 - a_i0.
        The phantom and the routing term ride in one extra q/k coordinate; a full layer with a
        phantom runs the causal kernel with Wang 2026's dummy query row (module docstring).
        """
        B, H, T, D = q.shape
        scale = 1.0 / math.sqrt(D)  # explicit: the extra coordinate and the padding must not change it
        if z is not None and not self.variant.routing:
            with _fp32(v):
                v = (torch.sigmoid(z).unsqueeze(-1) * v.float()).to(v.dtype)  # (B, H, S, D): g_j v_j
        if want_importance:
            probe = torch.ones(T, 1, device=v.device, dtype=v.dtype)  # (S, 1): phantom variants
            if not self.variant.has_phantom:
                probe = torch.zeros_like(probe)  # (S, 1)
                probe[0] = 1.0  # (S, 1): indicator of key 0
            v = torch.cat([v, probe.expand(B, H, T, 1)], dim=-1)  # (B, H, S, D+1)
        b = self.sink_logits()  # (H,) or None
        if b is not None or self.variant.routing:
            # q gets sqrt(D) in one extra coordinate; real keys get log g_j there (routing) or 0.
            q = torch.cat([q, q.new_full((B, H, T, 1), math.sqrt(D))], dim=-1)  # (B, H, T, D+1)
            extra = F.logsigmoid(z).to(k.dtype) if self.variant.routing else k.new_zeros(B, H, T)  # (B, H, S)
            k = torch.cat([k, extra.unsqueeze(-1)], dim=-1)  # (B, H, S, D+1)
        if b is not None:  # the phantom: key 0 of the kernel, logit b_h, value 0
            k_sink = F.pad(b.to(k.dtype).view(1, H, 1, 1).expand(B, H, 1, 1), (D, 0))  # (B, H, 1, D+1)
            k = torch.cat([k_sink, k], dim=2)  # (B, H, S+1, D+1)
            v = torch.cat([v.new_zeros(B, H, 1, v.shape[-1]), v], dim=2)  # (B, H, S+1, Dv)
        width = max(q.shape[-1], v.shape[-1])
        width += -width % HEAD_DIM_MULTIPLE  # one width, a multiple of 8, for q, k and v (flash kernels)
        q, k, v = (F.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))  # (B, H, T|S(+1), W)
        if self.window is not None or cache is not None:  # sliding or a cache: a boolean mask; the phantom stays visible
            mask = self.visible(T, q.device, cache)  # (T, S)
            if b is not None:
                mask = torch.cat([mask.new_ones(T, 1), mask], dim=1)  # (T, S+1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # (B, H, T, W)
        elif b is not None:  # Wang 2026's dummy query row: the causal kernel keeps the phantom visible
            q = torch.cat([q.new_zeros(B, H, 1, width), q], dim=2)  # (B, H, T+1, W)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)[:, :, 1:]  # (B, H, T, W)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # (B, H, T, W)
        y = out[..., :D]  # (B, H, T, D): the real head outputs
        if not want_importance:
            return y, None
        mass = out[..., D].float()  # (B, H, T): sum_j a_ij (phantom) or a_i0 (vanilla)
        importance = mass if self.variant.has_phantom else 1.0 - mass  # (B, H, T)
        return y, importance

    # -- forward -----------------------------------------------------------------------------------

    def forward(
        self, x: Tensor, *, layer: int, explicit: bool, hooks: hp.HookSink | None, want_importance: bool,
        cache: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of the (pre-normed) stream ``x`` (B, T, C); ``cache`` (T, S) bool narrows what each query sees.

        Emits the hook points ``blocks.{layer}.attn`` (the record: explicit, or fused from
        :meth:`attend_recorded` when ``explicit`` is False; training with the load-balancing
        loss records explicitly),
        ``attn.hook_v`` (values before any gate, replaceable: the gate then reads the
        replacement), ``attn.hook_z`` (per-head output after any output gate, replaceable) and
        ``attn.hook_result`` (z_h W_O[h]) when ``hooks`` asks for them.

        Returns the layer's output (B, T, C) and, if ``want_importance``, Imp^{l,h} (H,): the
        mean of G_i over sequences and queries i >= 1.
        """
        B, T, C = x.shape
        H, D = self.n_head, self.head_dim
        q, k, v = self.c_attn(x).split(C, dim=2)  # (B, T, C) each
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, D).transpose(1, 2)  # (B, H, S, D)
        v = taps.replace(hooks, hp.ATTN_V, layer, v.view(B, T, H, D))  # (B, S, H, D), before any gate
        taps.emit(hooks, hp.ATTN_V, layer, v)
        v = v.transpose(1, 2)  # (B, H, S, D)
        z = self.gate_logit(v)  # (B, H, S) float32, or None
        gate_out = self.output_gate(x)  # (B, H, T, D|1) float32, or None
        record = hooks is not None and hp.ATTN in hooks.observed

        lse = columns = quiet = att = None
        if explicit or (record and want_importance):
            y, att = self.attend_explicit(q, k, v, z, cache)  # (B, H, T, D), (B, H, T, S)
            phantom = self.variant.has_phantom  # the sink set: the phantom, else key 0 (gates.default_sink_set)
            G = gates.gate_from_weights(att, first=not phantom, phantom=phantom)  # (B, H, T)
        elif record:  # a probe run: linear memory, the gate's moments from the same kernel call
            asked = getattr(hooks, "record_columns", ())
            y, lse, columns, quiet = self.attend_recorded(
                q, k, v, z, "value_gate" in asked, "quiet" in asked, cache)  # (B, H, T, D), (B, H, T), (B, H, T, 2|K)|None
            G = None
        else:
            implicit = want_importance and gate_out is None  # outgate's G is its explicit gate
            y, G = self.attend_fused(q, k, v, z, implicit, cache)  # (B, H, T, D), (B, H, T) | None
        if gate_out is not None:
            y = y * gate_out.to(y.dtype)  # (B, H, T, D)
            G = gate_out.mean(dim=-1)  # (B, H, T): the explicit gate, averaged over the head's D

        if record:
            b = self.sink_logits()
            hooks.emit(
                hp.ATTN,
                layer,
                AttentionRecord(
                    layer=layer,
                    query=q.detach(),  # (B, H, T, D)
                    key=k.detach(),  # (B, H, S, D)
                    value=v.detach(),  # (B, H, S, D), before any gate
                    scale=1.0 / math.sqrt(D),
                    # (1, 1, T, S): causal (+ window); a fused record of a full layer: None (plain causal)
                    mask=_additive(self.visible(T, x.device, cache))
                    if att is not None or self.window is not None or cache is not None else None,
                    weights=None if att is None else att.detach(),  # (B, H, T, S), or None (fused)
                    kernel_lse=lse,  # (B, H, T) over real keys, fused records only
                    sliding_window=self.window,
                    sink_logits=None if b is None else b.detach().float(),  # (H,)
                    value_gate=None if z is None else torch.sigmoid(z).detach(),  # (B, H, S)
                    key_bias=F.logsigmoid(z).detach() if self.variant.routing else None,  # (B, H, S): log g_j
                    routing_gate=self.variant.routing,
                    gate_columns=columns,  # (B, H, T, 2) or None
                    quiet_columns=quiet,  # (B, H, T, K) or None
                    output_gate=None
                    if gate_out is None
                    else gate_out.detach().transpose(1, 2).expand(B, T, H, D),  # (B, T, H, D)
                ),
            )

        y = taps.replace(hooks, hp.ATTN_Z, layer, y.transpose(1, 2))  # (B, T, H, D): z, what W_O reads
        taps.emit(hooks, hp.ATTN_Z, layer, y)
        if hooks is not None and hp.ATTN_RESULT in hooks.observed:  # z_h W_O[h]; W_O is (C, H*D)
            taps.emit(hooks, hp.ATTN_RESULT, layer, torch.einsum("bthd,chd->bthc", y, self.c_proj.weight.view(C, H, D)))
        out = self.c_proj(y.reshape(B, T, C))  # (B, T, C): heads side by side, projected
        if not want_importance:
            return out, None
        return out, gates.head_importance(G)  # (H,): mean over sequences and queries i >= 1


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x: Tensor, *, layer: int = 0, hooks: hp.HookSink | None = None) -> Tensor:
        pre = self.c_fc(x)  # (B, T, 4C): the activation's input
        taps.emit(hooks, hp.MLP_PRE, layer, pre)
        return self.c_proj(self.gelu(pre))  # (B, T, C)


class Block(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then + mlp(ln(x)); force-sink mask after each add and norm."""

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(
        self, x: Tensor, *, layer: int, explicit: bool, hooks: hp.HookSink | None, want_importance: bool,
        keep: Tensor | None, cache: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """One block; emits the residual-stream hook points (``capture/hooks.py``) ``hooks`` asks for.

        x is resid_pre (B, T, C); force-sink (``keep``) re-applies its mask after every norm and
        every add, so the partition holds exactly under LayerNorm's centring too. ``hook_attn_out``
        is the attention output before that mask; ``hook_resid_mid`` the stream the MLP reads.
        """
        taps.emit(hooks, hp.RESID_PRE, layer, x)
        normed = _masked(self.ln_1(x), keep)  # (B, T, C): ln1's output, the attention's input
        taps.emit(hooks, hp.LN1_NORMALIZED, layer, normed)
        a, importance = self.attn(
            normed, layer=layer, explicit=explicit, hooks=hooks, want_importance=want_importance, cache=cache
        )  # (B, T, C), (H,) | None
        taps.emit(hooks, hp.ATTN_OUT, layer, a)
        x = _masked(x + a, keep)  # (B, T, C): resid_mid
        taps.emit(hooks, hp.RESID_MID, layer, x)
        normed = _masked(self.ln_2(x), keep)  # (B, T, C): ln2's output, the MLP's input
        x = _masked(x + self.mlp(normed, layer=layer, hooks=hooks), keep)  # (B, T, C): resid_post
        x = taps.replace(hooks, hp.RESID_POST, layer, x)  # (B, T, C): what the next block reads
        taps.emit(hooks, hp.RESID_POST, layer, x)
        return x, importance


def _masked(x: Tensor, keep: Tensor | None) -> Tensor:
    """``x * keep`` (force-sink's 0/1 mask, (T, C)), or ``x`` when force-sink is off."""
    return x if keep is None else x * keep  # (B, T, C)


class GPT(nn.Module):
    """The decoder. ``forward(idx, targets)`` returns ``(logits (B, T, V), loss or None)``."""

    #: parameters never decayed, whatever their dim (Wang 2026 Appendix A, SPEC.md): sink logits,
    #: norm-gate thresholds, projection-gate directions and biases.
    NO_DECAY = ("sink_logit", "gate_tau", "gate_w", "gate_b")

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        C = config.n_embd
        # Module constructors draw their default inits from the global RNG, and how many draws
        # depends on the variant. Building under fork_rng and then drawing every weight in a
        # fixed order (_init_weights) gives every variant built after the same torch.manual_seed
        # identical shared weights (paired seeds, SPEC.md).
        with torch.random.fork_rng(devices=[]):
            self.transformer = nn.ModuleDict(
                dict(
                    wte=nn.Embedding(config.vocab_size, C),
                    wpe=nn.Embedding(config.block_size, C),
                    h=nn.ModuleList([Block(config, layer) for layer in range(config.n_layer)]),
                    ln_f=make_norm(config),
                )
            )
            self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied input and output embeddings
        if config.variant_spec.sink_token:
            # The sink token is one learned vector that sits before position 0 and takes no
            # position embedding (a learned vector plus a learned position is one learned
            # vector), so real tokens keep positions 0..T-1 and the extra cost is C (Table 5).
            self.sink_token = nn.Parameter(torch.empty(C))  # (C,)
        else:
            self.register_parameter("sink_token", None)
        self._init_weights()
        #: detached loss terms of the last forward with targets: "ce", and "lb" when lb_lambda > 0.
        self.last_loss_terms: dict[str, Tensor] = {}
        #: Imp^{l,h} (L, H) of the last forward called with ``importance=True``, detached.
        self.last_importance: Tensor | None = None

    @torch.no_grad()
    def _init_weights(self) -> None:
        """N(0, 0.02), and N(0, 0.02/sqrt(2L)) for the attention and MLP output projections.

        Shared weights are drawn first in a fixed order; the variant's extra weights are drawn
        after them inside fork_rng, so the global RNG leaves __init__ in the same state for
        every variant (a trainer drawing batches from it stays paired too).
        """
        std, proj_std = 0.02, 0.02 / math.sqrt(2 * self.config.n_layer)
        nn.init.normal_(self.transformer.wte.weight, 0.0, std)
        nn.init.normal_(self.transformer.wpe.weight, 0.0, std)
        for block in self.transformer.h:
            nn.init.normal_(block.attn.c_attn.weight, 0.0, std)
            nn.init.normal_(block.attn.c_proj.weight, 0.0, proj_std)
            nn.init.normal_(block.mlp.c_fc.weight, 0.0, std)
            nn.init.normal_(block.mlp.c_proj.weight, 0.0, proj_std)
        with torch.random.fork_rng(devices=[]):
            if self.sink_token is not None:
                nn.init.normal_(self.sink_token, 0.0, std)
            for block in self.transformer.h:
                if hasattr(block.attn, "gate_w"):
                    nn.init.normal_(block.attn.gate_w, 0.0, std)  # w_h . v_j starts ~ 0: gate = sigmoid(c_h)
                if hasattr(block.attn, "c_gate"):
                    nn.init.normal_(block.attn.c_gate.weight, 0.0, std)  # output gate starts ~ 0.5

    # ---- bookkeeping ---------------------------------------------------------------------------

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Parameter count (tied embeddings counted once); optionally without wte and wpe."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: decay on tensors of dim >= 2 except the ``NO_DECAY`` ones, none on the rest.

        The embedding (tied with the LM head) and the output-gate projection W_g are ordinary
        weight matrices and are decayed; LayerNorm gains, the sink token, sink logits, gate
        thresholds, directions and biases are not.
        """
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            if p.dim() >= 2 and name.rsplit(".", 1)[-1] not in self.NO_DECAY:
                decay.append(p)
            else:
                no_decay.append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    def model_spec(self) -> ModelSpec:
        """The sizes probes need (a record's positions include the sink token for ``sinktoken``)."""
        c = self.config
        return ModelSpec(
            family=MODEL_TYPE,
            n_layers=c.n_layer,
            n_heads=c.n_head,
            n_kv_heads=c.n_head,
            head_dim=c.head_dim,
            hidden_size=c.n_embd,
            attention_layers=tuple(range(c.n_layer)),
            has_phantom=c.variant_spec.has_phantom,
            has_output_gate=c.variant_spec.output_gate,
            has_value_gate=c.variant_spec.value_gate is not None,
            vocab_size=c.vocab_size,
            mlp_width=4 * c.n_embd,
        )

    def force_sink_mask(self, T: int, like: Tensor) -> Tensor | None:
        """The P0-sink study's force-sink mask (T, C) of 0/1, or None when ``force_sink_k`` is 0.

        The first k channels are kept only at position 0 (the sink token's position for
        ``sinktoken``) and zeroed elsewhere; the other C - k are zeroed at position 0.
        """
        k = self.config.force_sink_k
        if k == 0:
            return None
        keep = torch.zeros(T, self.config.n_embd, device=like.device, dtype=like.dtype)  # (T, C)
        keep[0, :k] = 1.0  # position 0: the k sink channels only
        keep[1:, k:] = 1.0  # other positions: everything but the sink channels
        return keep

    # ---- forward -------------------------------------------------------------------------------

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        *,
        attention: str = "fused",
        hooks: hp.HookSink | None = None,
        tap: taps.Tap | None = None,
        tnlm: bool = False,
        lb_lambda: float = 0.0,
        importance: bool = False,
        visible: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, V) for token ids ``idx`` (B, T) and, with ``targets`` (B, T), the loss.

        Args:
            attention: ``"fused"`` (SDPA) or ``"explicit"`` (materialised weights, float32).
            hooks: receives the named hook points it observes (``capture/hooks.py``: residual
                stream, ln1 output, attention record, hook_v, hook_z, hook_result, attn_out,
                mlp.hook_pre) and replaces the intervenable ones (hook_v before any value gate,
                hook_z); the attention record follows ``attention`` (fused: kernel LSE and, when
                asked, the gate's moment columns; explicit: the weights). For ``sinktoken`` every
                point includes the sink token at position 0 (T + 1 positions).
            tap: the older form of ``hooks``: one :class:`AttentionRecord` per layer through
                ``on_attention`` and each block's output stream through ``on_residual``.
            tnlm: drop the cross-entropy term at position 0 (the P0-sink study; see :func:`lm_loss`).
            lb_lambda: weight of the sink-aware load-balancing loss (Fu et al. 2026; 1e-4 in the
                paper and SPEC.md; 0 = off): ``lb_lambda * load_balance_loss(Imp)``, where
                Imp^{l,h} is the mean over sequences and queries i >= 1 of G_i = 1 - A_sink,i:
                A_sink is the phantom mass for phantom variants and the mass on position 0
                otherwise (the sink token for ``sinktoken``, the routing weights for
                routing-norm); for ``outgate`` G_i is the head's mean output-gate value.
                Differentiable on both paths (the fused path reads it from one extra value
                column of the same kernel call). Only computed when ``targets`` is given.
            importance: also compute Imp^{l,h} (as for ``lb_lambda``) without any loss term and
                keep it, detached, in ``self.last_importance`` (L, H); the trainer's evaluation
                logs its per-layer CV from there (``sinkscope.stats.gates.load_imbalance``).
            visible: (T', T') bool, which keys each query may see, on top of every layer's own rule
                (causal, a sliding window): a bounded cache's visibility (``cache.visible``), for
                ``sinkscope stream --mode mask`` (SPEC.md "Streaming"). T' counts the positions the
                layers see: T + 1 for ``sinktoken``, whose learned token is position 0 there.
        """
        if attention not in ("fused", "explicit"):
            raise ValueError(f"attention must be 'fused' or 'explicit', not {attention!r}")
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of length {T} is longer than block_size {self.config.block_size}")
        if tap is not None:
            hooks = taps.TapHooks(tap)
        explicit = attention == "explicit" or tap is not None  # the older tap always saw the weights
        want_importance = (lb_lambda > 0 and targets is not None) or importance

        pos = torch.arange(T, device=idx.device)  # (T,)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        if self.sink_token is not None:
            sink = self.sink_token.to(x.dtype).view(1, 1, -1).expand(B, 1, -1)  # (B, 1, C)
            x = torch.cat([sink, x], dim=1)  # (B, T+1, C)
        keep = self.force_sink_mask(x.shape[1], x)  # (T', C) or None
        if visible is not None and tuple(visible.shape) != (x.shape[1], x.shape[1]):
            raise ValueError(f"visible must be ({x.shape[1]}, {x.shape[1]}), not {tuple(visible.shape)}")
        if keep is not None:
            x = x * keep  # (B, T', C)

        importances = []
        for layer, block in enumerate(self.transformer.h):
            x, imp = block(
                x, layer=layer, explicit=explicit, hooks=hooks, want_importance=want_importance, keep=keep,
                cache=visible,
            )  # (B, T', C), (H,) | None
            if imp is not None:
                importances.append(imp)

        if importance:
            self.last_importance = torch.stack(importances).detach()  # (L, H)
        x = _masked(self.transformer.ln_f(x), keep)  # (B, T', C)
        if self.sink_token is not None:
            x = x[:, 1:]  # (B, T, C): the sink token's output never reaches the LM head
        logits = self.lm_head(x)  # (B, T, V)

        if targets is None:
            return logits, None
        loss = lm_loss(logits, targets, tnlm=tnlm)  # ()
        self.last_loss_terms = {"ce": loss.detach()}
        if want_importance:
            lb = load_balance_loss(torch.stack(importances))  # () from (L, H)
            self.last_loss_terms["lb"] = lb.detach()
            loss = loss + lb_lambda * lb  # ()
        return logits, loss
