"""The uniform view of one attention layer during one forward pass.

Shape letters used in every shape comment of the package:

    B batch (windows), H query heads, Hkv key/value heads (H % Hkv == 0), T queries,
    S keys (S == T: no KV cache), D head dim, L layers, C model width (channels).

Probes never touch raw attention weights. They ask an :class:`AttentionRecord` for *row
reductions* (the mass on a set of keys, the phantom mass, the log-sum-exp, weighted moments
of a per-key quantity). A record comes in two forms that answer identically (tests check
1e-5): *explicit*, holding the weights the model's own eager attention returned, and *fused*,
holding only the log-sum-exp from a fused kernel, from which the mass on key p is
``exp(s_ip - LSE_i)`` and the phantom mass ``sigmoid(b_h - LSE_i)``. Row moments of the value
gate (``gate_moments``) come, in a fused record, from crafted value columns the same kernel
call returned (DESIGN.md "Probes: streaming reductions"; ``moment_columns``). Notation follows
SPEC.md:

    s_ij  = scale * q_i . k_j + mask_ij + beta_hj         (real keys j; beta = key_bias, e.g.
                                                           routing-norm's log g_j, else 0)
    LSE_i = log sum_j exp(s_ij)
    a_ij  = exp(s_ij) / (exp(b_h) + sum_k exp(s_ik))      (phantom in the normaliser, if any)
    phi_i = sigmoid(b_h - LSE_i)                          (phantom mass)
    w_ij  = a_ij / sum_k a_ik                             (softmax over real keys only)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from sinkscope.capture.masks import hidden_keys

#: SPEC.md "Quiet mass (exposure)" and "Value-read injection": the cutoffs of a head's quiet
#: reads, as (name, quantile of the sequence's read norms); a read is quiet when its norm is
#: strictly below the cutoff.
QUIET_CUTOFFS: tuple[tuple[str, float], ...] = (("median", 0.5), ("q25", 0.25))


def read_norm_quantiles(norms: Tensor, quantiles: tuple[float, ...] | list[float]) -> Tensor:
    """Quantiles of the read norms over the key axis (numpy's default, linear), (K, *norms.shape[:-1]).

    ``norms`` (..., S) float32; quantile 0.5 is numpy's median (the mean of the two middle
    norms when S is even). Computed in float64 so that ties with a norm resolve as numpy's.
    """
    x = norms.double()
    # one call per quantile with a Python float: a tensor q is range-checked on the host (a device sync)
    return torch.stack([torch.quantile(x, float(q), dim=-1) for q in quantiles])  # (K, ...)


def quiet_reads(norms: Tensor, quantiles: tuple[float, ...] | list[float] | None = None) -> Tensor:
    """The quiet sets of SPEC.md: ``||v_j|| < c`` with c a quantile of the sequence's read norms.

    ``norms`` (B, Hkv, S) per value head and sequence; returns (B, Hkv, S, K) bool, one set per
    quantile (default :data:`QUIET_CUTOFFS`: median, 25th percentile). Strict ``<``, so a
    sequence whose reads all have the same norm has no quiet read.
    """
    if quantiles is None:
        quantiles = [q for _, q in QUIET_CUTOFFS]
    cutoffs = read_norm_quantiles(norms, quantiles)  # (K, B, Hkv)
    return norms.double().unsqueeze(-1) < cutoffs.permute(1, 2, 0).unsqueeze(2)  # (B, Hkv, S, K)


def sink_rows(sink_logits: Tensor) -> Tensor:
    """Learned phantom logits as rows, float32: (H,) per head -> (1, H, 1); (B, H, T) per query as is."""
    b = sink_logits.float()
    return b.view(1, -1, 1) if b.dim() == 1 else b  # (1, H, 1) or (B, H, T)


#: a logit at or below this is masked (an additive mask of -inf or the dtype's minimum).
MASKED_BELOW = -1e4


@dataclass
class AttentionRecord:
    """One layer's attention, as the model computed it.

    Attributes:
        layer: index of the decoder layer (0-based, in the model's own numbering).
        query: (B, H, T, D) queries after RoPE / norms, exactly as attention saw them. None (and
            ``key``, ``value`` None) in a record of the eager fallback, which holds the model's
            weights only (``weights_only``).
        key: (B, Hkv, S, D) keys after RoPE.
        value: (B, Hkv, S, D) values, before any gate.
        scale: the factor multiplying q . k (the model's own, e.g. 1/sqrt(D)).
        mask: (B, 1, T, S) additive float mask the model used (causal, sliding window), or None
            for a plain causal mask (key j visible to query i iff j <= i + S - T).
        sliding_window: window size W of a sliding-window layer (keys with i - j >= W hidden), or None.
        sink_logits: learned phantom logits: (H,) one per head, b_h (gpt-oss ``sinks``), or
            (B, H, T) one per query, b_hi, computed from the hidden state (Inkling2's
            ``sink_proj``); None without a phantom. :meth:`sink_rows` broadcasts either.
        weights: (B, H, T, S) the attention weights a_ij the model's own eager function returned
            (rows sum to 1 - phi_i where there is a phantom), float32; None in a fused record.
        kernel_lse: (B, H, T) LSE_i over real keys from a fused kernel, float32; None in an
            explicit record.
        output_gate: (B, T, H, D) multiplicative output gate in (0, 1) applied to each head's
            attention output before the output projection (Qwen3-Next; trainer ``outgate``,
            headwise gates broadcast over D), or None.
        value_gate: (B, Hkv, S) value gate g_j in (0, 1) of the bundled trainer's gated variants
            (``normgate``, ``projgate``, ``sink+*``: the read is g_j v_j; ``routing-norm``: the
            logits carry + log g_j instead), or None.
        softcap: logit soft-capping c (Gemma): the logit is c * tanh(scale * q . k / c) before
            the mask, or None.
        key_bias: (B, Hkv, S) a per-key term added to every logit of the key (the trainer's
            ``routing-norm``: log g_j, the gate in the routing slot), or None.
        routing_gate: the value gate acts in the routing slot (``key_bias`` = log g_j; the reads
            themselves are ungated), not on the reads g_j v_j.
        gate_columns: (B, H, T, 2) float32, fused records only: sum_j w_ij x_j and
            sum_j w_ij x_j^2 for the value gate's centred values x_j (``moment_columns``), two
            extra value columns of the kernel call that computed the layer's output; None when
            no probe asked for them (``Probe.record_columns``) or there is no value gate.
        quiet_columns: (B, H, T, K) float32, fused records only: sum_j w_ij 1[j quiet] for the
            quiet sets of :data:`QUIET_CUTOFFS` (``quiet_reads`` of the values), K extra value
            columns of the kernel call that computed the layer's output; None when no probe
            asked for them (``record_columns`` "quiet").
        received: (B, H, S) float32, fused records only: sum_i a_ij, the attention each key received
            summed over the queries, from the kernel call that computed the layer's output
            (``kernels.attention_with_received``); None when no probe asked for it (``record_columns``
            "received"): :meth:`received_mass` then computes it by query blocks.
    """

    layer: int
    query: Tensor
    key: Tensor
    value: Tensor
    scale: float
    mask: Tensor | None
    weights: Tensor | None
    sliding_window: int | None = None
    sink_logits: Tensor | None = None
    output_gate: Tensor | None = None
    value_gate: Tensor | None = None
    kernel_lse: Tensor | None = None
    softcap: float | None = None
    key_bias: Tensor | None = None
    routing_gate: bool = False
    gate_columns: Tensor | None = None
    quiet_columns: Tensor | None = None
    received: Tensor | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    # ---- shapes ---------------------------------------------------------------------------
    @property
    def n_heads(self) -> int:
        return (self.query if self.query is not None else self.weights).shape[1]

    @property
    def batch_size(self) -> int:
        """B, the windows of the record."""
        return (self.query if self.query is not None else self.weights).shape[0]

    def first_windows(self, n: int) -> "AttentionRecord":
        """The same record for its first ``n`` windows only (views; the caches are not carried over)."""
        return self.windows(0, n)

    def windows(self, start: int, stop: int) -> "AttentionRecord":
        """The same record for its windows ``start:stop`` only (views; the caches are not carried over).

        Every field with a batch axis is cut; a mask or per-query phantom logits shared by the batch
        (a leading 1) and per-head phantom logits (H,) are kept as they are.
        """
        B = self.batch_size
        cut = {}
        for name in ("query", "key", "value", "weights", "kernel_lse", "output_gate", "value_gate", "key_bias",
                     "gate_columns", "quiet_columns", "received", "mask"):
            value = getattr(self, name)
            if value is not None and value.shape[0] == B:
                cut[name] = value[start:stop]
        if self.sink_logits is not None and self.sink_logits.dim() == 3 and self.sink_logits.shape[0] == B:
            cut["sink_logits"] = self.sink_logits[start:stop]
        return replace(self, **cut, _cache={})

    def one_head(self, head: int, *, copy: bool = False) -> "AttentionRecord":
        """The same record for one query head only, with its key-value head (caches not carried over).

        The result has one query head and one key-value head, so its rows and reductions are those
        of ``head`` in this record (the explorer keeps a candidate head's record until it knows
        whether the head is kept). Views, or with ``copy`` the head's own tensors (so that keeping
        it does not keep the whole layer's alive; a mask, shared by the heads and the layers of a
        forward, stays a view).
        """
        H = self.n_heads
        kv = head // (H // self.n_kv_heads)
        cut: dict = {}
        for name, index in (("query", head), ("key", kv), ("value", kv), ("weights", head), ("kernel_lse", head),
                            ("value_gate", kv), ("key_bias", kv), ("gate_columns", head), ("quiet_columns", head),
                            ("received", head)):
            value = getattr(self, name)
            if value is not None:
                cut[name] = value[:, index:index + 1]
        if self.output_gate is not None:
            cut["output_gate"] = self.output_gate[:, :, head:head + 1]  # (B, T, 1, D)
        if self.mask is not None and self.mask.shape[1] == H > 1:
            cut["mask"] = self.mask[:, head:head + 1]
        if self.sink_logits is not None:
            sinks = self.sink_logits
            cut["sink_logits"] = sinks[head:head + 1] if sinks.dim() == 1 else sinks[:, head:head + 1]
        if copy:
            cut = {name: value if name == "mask" else value.clone() for name, value in cut.items()}
        return replace(self, **cut, _cache={})

    @property
    def n_kv_heads(self) -> int:
        return self.key.shape[1] if self.key is not None else self.n_heads

    @property
    def weights_only(self) -> bool:
        """A record of the eager fallback (``discover.EAGER_FALLBACK``): the model's weights, no q, k or v."""
        return self.query is None

    @property
    def has_phantom(self) -> bool:
        return self.sink_logits is not None

    @property
    def is_fused(self) -> bool:
        return self.weights is None

    def sink_rows(self) -> Tensor:
        """The phantom logit of each row, float32, broadcastable to (B, H, T): (1, H, 1) or (B, H, T)."""
        return sink_rows(self.sink_logits)

    def _causal_fill(self, s: Tensor, keys: slice, rows: slice = slice(None)) -> Tensor:
        """-inf where a key of the slice ``keys`` is after query i, or (``sliding_window`` W) at or
        before i - W: the mask None stands for (plain causal; a plain window, ``window_masks.py``).

        ``s`` holds the queries of ``rows``. Positions are built on the device: no host data is
        copied into the layer loop.
        """
        T, S = self.query.shape[-2], self.key.shape[-2]
        queries = (torch.arange(T, device=s.device)[rows] + (S - T)).unsqueeze(-1)  # (n, 1) absolute positions
        positions = torch.arange(S, device=s.device)[keys].unsqueeze(0)  # (1, S')
        return s.masked_fill(hidden_keys(queries, positions, self.sliding_window), float("-inf"))  # (.., n, S')

    def _capped(self, s: Tensor) -> Tensor:
        """c * tanh(s / c) under soft-capping, else ``s`` unchanged."""
        return s if self.softcap is None else self.softcap * torch.tanh(s / self.softcap)

    def _per_query_head(self, x: Tensor) -> Tensor:
        """A per-key quantity (B, Hkv|H, S) repeated over each KV group: (B, H, S)."""
        if x.shape[1] != self.n_heads:
            x = x.repeat_interleave(self.n_heads // x.shape[1], dim=1)  # (B, H, S)
        return x

    def _biased(self, s: Tensor, keys: slice | None = None, heads: Tensor | None = None) -> Tensor:
        """``s`` (B, H', T, K) plus ``key_bias`` of those keys (all keys when ``keys`` is None) and
        query heads (all when ``heads`` is None; else the H' heads of that index)."""
        if self.key_bias is None:
            return s
        bias = self._per_query_head(self.key_bias.float())  # (B, H, S)
        if keys is not None:
            bias = bias[..., keys]  # (B, H, K)
        if heads is not None:
            bias = bias[:, heads]  # (B, H', K)
        return s + bias.unsqueeze(2)  # (B, H', T, K)

    # ---- row reductions ---------------------------------------------------------------------
    def logits(self) -> Tensor:
        """s_ij = scale * q_i . k_j + mask_ij, float32, (B, H, T, S); GQA keys repeated per group."""
        if "logits" not in self._cache:
            groups = self.n_heads // self.n_kv_heads
            k = self.key.float().repeat_interleave(groups, dim=1)  # (B, H, S, D)
            s = self._capped(torch.matmul(self.query.float(), k.transpose(-1, -2)) * self.scale)  # (B, H, T, S)
            s = self._biased(s)  # (B, H, T, S)
            if self.mask is not None:
                s = s + self.mask.float()  # (B, 1, T, S) broadcast over heads
            else:
                s = self._causal_fill(s, slice(None))
            self._cache["logits"] = s
        return self._cache["logits"]

    def row_logits(self, rows: slice, *, heads: Tensor | None = None, keys: slice = slice(None),
                   causal: bool = True) -> Tensor:
        """s_ij for the queries of ``rows`` (a slice of the T queries) and the keys of ``keys`` (all by
        default), float32, (B, H, n, K); with ``heads`` (an index of query heads) only those, (B, H', n, K).

        The same numbers as ``logits()[:, heads][:, :, rows, keys]`` without the (T, S) matrix: a
        probe that reads whole rows walks the queries in blocks (``head_importance --sink-set
        data``), and the explorer reads a few heads' visible keys only (``probes/explorer.py``).
        ``causal`` False leaves the keys a mask None stands for (after the query, outside the
        window) unfilled: the caller hides them itself (the explorer, on the entries it keeps).
        """
        groups = self.n_heads // self.n_kv_heads
        k = self.key[:, :, keys].float().repeat_interleave(groups, dim=1)  # (B, H, K, D)
        q = self.query[:, :, rows].float()  # (B, H, n, D)
        if heads is not None:
            k, q = k[:, heads], q[:, heads]  # (B, H', K, D), (B, H', n, D)
        s = self._capped(torch.matmul(q, k.transpose(-1, -2)) * self.scale)  # (B, H', n, K)
        s = self._biased(s, keys, heads)  # (B, H', n, K)
        if self.mask is not None:
            mask = self.mask[:, :, rows, keys]  # (B, 1 | H, n, K): one mask for every head, or one per head
            if heads is not None and mask.shape[1] > 1:
                mask = mask[:, heads]  # (B, H', n, K)
            return s + mask.float()
        return self._causal_fill(s, keys, rows) if causal else s

    def key_logits(self, keys: int | slice) -> Tensor:
        """s_ij for a key position or a slice of them only, float32, (B, H, T, K): linear memory."""
        keys = _as_slice(keys)
        groups = self.n_heads // self.n_kv_heads
        k = self.key[:, :, keys].float().repeat_interleave(groups, dim=1)  # (B, H, K, D)
        s = self._capped(torch.matmul(self.query.float(), k.transpose(-1, -2)) * self.scale)  # (B, H, T, K)
        s = self._biased(s, keys)  # (B, H, T, K)
        if self.mask is not None:
            return s + self.mask[..., keys].float()  # (B, 1, T, K) broadcast over heads
        return self._causal_fill(s, keys)

    def key_visible(self, k: int) -> Tensor:
        """Whether query t can see key k, bool (B, H, T): its logit is not masked (causal, window).

        ``p0_mass`` (``p0_out_of_reach``) and ``sink_rate`` (the in-reach split) share key 0's.
        """
        cached = ("key_visible", k)
        if cached not in self._cache:
            self._cache[cached] = self.key_logits(k)[..., 0] > MASKED_BELOW  # (B, H, T)
        return self._cache[cached]

    def lse(self) -> Tensor:
        """LSE_i = log sum_j exp(s_ij) over real keys, (B, H, T)."""
        if self.kernel_lse is not None:
            return self.kernel_lse
        if "lse" not in self._cache:
            self._cache["lse"] = torch.logsumexp(self.logits(), dim=-1)  # (B, H, T)
        return self._cache["lse"]

    def real_mass(self) -> Tensor:
        """sum_j a_ij: the share of each row on real keys, (B, H, T); 1 without a phantom."""
        if "real_mass" not in self._cache:
            if self.is_fused:
                self._cache["real_mass"] = 1 - self.phantom_mass()  # (B, H, T)
            else:
                self._cache["real_mass"] = self.weights.sum(-1)  # (B, H, T)
        return self._cache["real_mass"]

    def phantom_mass(self) -> Tensor:
        """phi_i = sigmoid(b_h - LSE_i), (B, H, T); zeros where the model has no phantom."""
        if not self.has_phantom:
            like = self.query if self.query is not None else self.weights
            B, H, T, _ = like.shape
            return torch.zeros(B, H, T, dtype=torch.float32, device=like.device)
        return torch.sigmoid(self.sink_rows() - self.lse())  # (B, H, T)

    def key_mass(self, keys: int | slice, *, over: str = "real") -> Tensor:
        """Mass each query puts on a set of key positions, (B, H, T).

        Args:
            keys: a key position or a slice of positions.
            over: ``"real"`` for w_ij (normalised over real keys: SPEC's p0 = w_i0),
                ``"all"`` for a_ij (phantom included in the normaliser).
        """
        if over not in ("real", "all"):
            raise ValueError(f"over must be 'real' or 'all', not {over!r}")
        if self.is_fused:  # w_ij = exp(s_ij - LSE_i) over real keys, a_ij = w_ij (1 - phi_i)
            sl = _as_slice(keys)
            cached = ("key_mass", sl.start, sl.stop, sl.step)  # p0_mass and sink_rate share key 0's
            if cached not in self._cache:
                self._cache[cached] = torch.exp(self.key_logits(sl) - self.lse().unsqueeze(-1)).sum(-1)  # (B, H, T)
            w = self._cache[cached]
            return w if over == "real" else w * self.real_mass()
        mass = self.weights[..., keys]  # (B, H, T) or (B, H, T, |keys|)
        if mass.dim() == 4:
            mass = mass.sum(-1)  # (B, H, T)
        return mass if over == "all" else mass / self.real_mass()

    def received_mass(self, block_bytes: int = 64 * 2 ** 20) -> Tensor:
        """sum_i a_ij: the attention each key receives, summed over the queries (phantom in the normaliser),
        (B, H, S) float32 (H2O's score, ``--protect top-p0``'s mass).

        The kernel's own column sums when the call made them (``received``), else the model's weights
        summed, else the logits walked in query blocks of at most ``block_bytes``: no (T, S) matrix.
        """
        if self.received is not None:
            return self.received
        if "received" not in self._cache:
            if not self.is_fused:
                self._cache["received"] = self.weights.float().sum(2)  # (B, H, S)
            else:
                B, H, T, _ = self.query.shape
                S = self.key.shape[-2]
                lse, real = self.lse(), self.real_mass()  # (B, H, T) each
                step = max(1, block_bytes // (4 * B * H * S))
                total = torch.zeros(B, H, S, dtype=torch.float32, device=self.query.device)
                for start in range(0, T, step):
                    rows = slice(start, min(start + step, T))
                    a = torch.exp(self.row_logits(rows) - lse[:, :, rows].unsqueeze(-1))  # (B, H, n, S): w_ij
                    total += torch.matmul(real[:, :, rows].unsqueeze(-2), a).squeeze(-2)  # (B, H, S)
                self._cache["received"] = total
        return self._cache["received"]

    def weighted_moments(self, per_key: Tensor) -> tuple[Tensor, Tensor]:
        """First and second moment of a per-key quantity under w, each (B, H, T).

        m_i = sum_j w_ij x_j and sum_j w_ij x_j^2, for ``per_key`` of shape (B, H, S) or
        (B, Hkv, S) (repeated over each KV group).
        """
        if self.is_fused:
            raise NotImplementedError("weighted moments of an arbitrary per-key quantity need an explicit record "
                                      "(--attention explicit); the value gate's come from gate_moments()")
        x = self._per_query_head(per_key.float())  # (B, H, S)
        w = self.weights / self.real_mass().unsqueeze(-1)  # (B, H, T, S)
        first = torch.matmul(w, x.unsqueeze(-1)).squeeze(-1)  # (B, H, T)
        second = torch.matmul(w, (x * x).unsqueeze(-1)).squeeze(-1)  # (B, H, T)
        return first, second

    def value_norms(self) -> Tensor:
        """||v_j|| per value head and key, float32, (B, Hkv, S)."""
        return self.value.float().norm(dim=-1)

    @staticmethod
    def quiet_indicator_columns(value: Tensor) -> Tensor:
        """The crafted value columns behind ``quiet_mass``: 1[j quiet] per cutoff, (B, Hkv, S, K) float32.

        ``value`` (B, Hkv, S, D) as the kernel reads it; the sets are :func:`quiet_reads` of its
        norms for :data:`QUIET_CUTOFFS`.
        """
        return quiet_reads(value.float().norm(dim=-1)).float()  # (B, Hkv, S, K)

    def quiet_mass(self) -> Tensor:
        """Mass of each row on the quiet reads, phantom in the normaliser, (B, H, T, K) float32.

            quiet_i = sum_{j quiet} a_ij = (1 - phi_i) sum_{j quiet} w_ij

        one column per cutoff of :data:`QUIET_CUTOFFS` (SPEC.md "Quiet mass (exposure)"). An
        explicit record reduces its weights; a fused one reads the K value columns its kernel
        call returned (``quiet_columns``; the capture appends them when a probe declares
        ``record_columns = frozenset({"quiet"})``).
        """
        if self.is_fused:
            if self.quiet_columns is None:
                raise NotImplementedError(
                    "this fused record carries no quiet-set columns: declare record_columns = frozenset({'quiet'}) "
                    "on the probe, or use --attention explicit")
            return self.quiet_columns.float() * self.real_mass().unsqueeze(-1)  # (B, H, T, K)
        columns = self._per_query_head(self.quiet_indicator_columns(self.value))  # (B, H, S, K)
        return torch.matmul(self.weights.float(), columns)  # (B, H, T, K): a_ij summed over quiet j

    # ---- the value gate -------------------------------------------------------------------------
    @staticmethod
    def moment_columns(gate: Tensor) -> Tensor:
        """The crafted value columns behind ``gate_moments``: (x_j, x_j^2), (B, Hkv, S, 2) float32.

        x_j = g_j - g_0 is the gate centred on its value at the first key of the sequence and
        head. Centring changes no moment (the weights of a row sum to 1) but makes a gate that
        is constant within its rows give x = 0 exactly, so its selectivity is exactly 0, and it
        keeps E[x^2] - E[x]^2 away from cancellation.
        """
        g = gate.float()  # (B, Hkv, S)
        x = g - g[..., :1]  # (B, Hkv, S)
        return torch.stack([x, x * x], dim=-1)  # (B, Hkv, S, 2)

    def gate_moments(self) -> tuple[Tensor, Tensor]:
        """The value gate's weighted mean and variance within each row, each (B, H, T) float32.

            m_i   = sum_j w_ij g_j
            var_i = sum_j w_ij (g_j - m_i)^2 = E_w[x^2] - E_w[x]^2,  x_j = g_j - g_0

        with w_ij the real-key weights (phantom excluded; SPEC.md "Gate selectivity", Wang 2026
        §4.2). An explicit record reduces its weights; a fused one reads the two value columns
        its kernel call returned (``gate_columns``), which the capture computes only when a
        probe asked for them (``Probe.record_columns``). var is clamped at 0 (rounding).
        """
        if self.value_gate is None:
            raise ValueError(f"layer {self.layer} has no value gate")
        g = self.value_gate.float()  # (B, Hkv, S)
        if self.is_fused:
            if self.gate_columns is None:
                raise NotImplementedError(
                    "this fused record carries no gate moments: declare record_columns = frozenset({'value_gate'}) "
                    "on the probe, or use --attention explicit")
            first, second = self.gate_columns.float().unbind(-1)  # (B, H, T) each
        else:
            columns = self._per_query_head(self.moment_columns(g))  # (B, H, S, 2)
            w = self.weights / self.real_mass().unsqueeze(-1)  # (B, H, T, S): w_ij, real keys only
            first, second = torch.matmul(w, columns).unbind(-1)  # (B, H, T) each
        g0 = self._per_query_head(g[..., :1])  # (B, H, 1)
        return g0 + first, (second - first * first).clamp_min(0.0)  # (B, H, T) each


def _as_slice(keys: int | slice) -> slice:
    """A key position as the one-element slice that indexes it (a view, no index tensor)."""
    if isinstance(keys, slice):
        return keys
    if keys < 0:
        raise ValueError(f"key positions are counted from 0, not {keys}")
    return slice(keys, keys + 1)
