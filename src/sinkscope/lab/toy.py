"""The toy superposition task (SPEC.md "The toy superposition task"; Wang 2026 appendix "Construction").

Data (``ToyData``): ``N`` random unit features in R^64 (orthonormalised when ``N <= 64``), load
``N / 64`` in {1, 2, 4, 8}; the first 16 are relevant. A sequence holds 64 items; each is a
relevant feature (uniform over the 16) with probability 0.15, otherwise an irrelevant one (uniform
over the other ``N - 16``). The target is the 16-bit set of relevant features present. Keys:
``blind`` (channel-blind) gives each item a random tag, a row of a fixed bank of 4,096 random
vectors drawn uniformly from its own generator, independent of the item (so it carries no content); ``visible`` (routing-visible) uses the item itself.

Model (``ToyModel``): one learned query ``q``, key and value projections ``W_K``, ``W_V`` (64 x 64),
one head, no MLP, no norm; logits ``s_t = q . (W_K k_t) / sqrt(64)``; a linear readout of the head's
output with a bias, trained with multi-label BCE (Adam, lr 1e-3, 4,000 steps of 256 sequences).
Variants: ``baseline`` (softmax over the items); ``offbyone`` (a phantom key with logit 0 and value
0); ``normgate`` (``g_t = sigmoid(8 (||v_t|| / sqrt(64) - tau))``, ``v_t <- g_t v_t``, ``tau``
learned, init 0, as the trainer's norm gate); ``oracle`` (the baseline with every irrelevant
item's read set to zero by ground truth, in training and evaluation).

Choices the seed leaves open (documented here): ``error`` is the mean BCE per label (nats) on a
fixed held-out set of 4,096 sequences shared by the variants of a (condition, load, seed); the
variants of one (condition, load, seed) also train on the same batches (paired); ``label_error``,
the fraction of wrong labels at threshold 0, is reported beside it. The share of headroom closed
is ``(base - var) / (base - oracle)`` of the seed-mean errors per (condition, load); it is
undefined (NaN) where the oracle is not below the baseline (no headroom).

Training (``train_group``): the 3 seeds x 4 variants of one (condition, load) are one module of
stacked parameters (``ToyStack``, leading dimensions (S, V)) trained by one Adam on the sum of the
12 models' losses: each slice gets exactly its own model's gradient and Adam is elementwise, so
this is 12 separate trainings, on the same batches (each seed's own generators, drawn in the same
order). Its forward computes ToyModel's function in a cheaper order: ``q . W_K k = (W_K^T q) . k``
(a table over the keys' rows), ``W_O sum_t a_t W_V x_t = (W_O W_V) sum_t a_t x_t`` with the read a
weighted bag of dictionary rows (``bag_readout``: n T d per model at every load, where the
per-feature (n x N) @ (N x d) read of ``ToyModel.forward`` costs n N d forward and 2 n N d
backward), and the softmax, phantom, gate and mask of every column in one function with its own
backward (``read_weights``). ``ToyModel.forward`` (fast path) and ``ToyModel.reference`` (explicit
definition) stay the definitions the stack is tested against. The (condition, load) groups run in
``jobs`` processes (default: one per CPU) of ``threads`` torch threads (default 1): the ops are
small, more threads do not pay and stall badly on a shared machine.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sinkscope.errors import SinkscopeError, option

D = 64  # feature dimension d
VARIANTS = ("baseline", "offbyone", "normgate", "oracle")
CONDITIONS = ("blind", "visible")
TAG_BANK = 4096  # random tag vectors the channel-blind keys are drawn from
CONDITION_LABELS = {"blind": "channel-blind keys", "visible": "routing-visible keys"}


@dataclass
class ToyOptions:
    """Everything ``sinkscope toy`` takes (defaults: Wang 2026's construction)."""

    loads: tuple[int, ...] = (1, 2, 4, 8)  # N / d
    conditions: tuple[str, ...] = CONDITIONS
    variants: tuple[str, ...] = VARIANTS
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 4000
    batch_size: int = 256
    lr: float = 1e-3
    n_items: int = 64  # T
    n_relevant: int = 16
    p_relevant: float = 0.15
    beta: float = 8.0  # norm-gate sharpness
    eval_seqs: int = 4096
    out: str = "reports/toy"
    threads: int | None = None  # torch threads per training process; None = 1 (small ops: more do not pay)
    jobs: int | None = None  # training processes, one (condition, load) group each; None = one per CPU
    overwrite: bool = False  # replace the toy task's earlier output in `out` (never a folder holding other files)

    def __post_init__(self):
        from sinkscope.store.files import expand_paths

        expand_paths(self, out="--out")


class ToyData:
    """Dictionary and sequence generator of one (load, seed); see the module docstring."""

    def __init__(self, n_features: int, seed: int, *, n_relevant: int = 16, p_relevant: float = 0.15,
                 n_items: int = 64, d: int = D):
        import torch

        if n_features <= n_relevant:
            raise SinkscopeError(f"the toy task needs more features ({n_features}) than relevant ones ({n_relevant}).")
        self.n_features, self.n_relevant, self.p_relevant, self.n_items, self.d = (
            n_features, n_relevant, p_relevant, n_items, d)
        g = torch.Generator().manual_seed(1_000_003 * seed + n_features)
        raw = torch.randn(n_features, d, generator=g, dtype=torch.float64)  # (N, d)
        if n_features <= d:  # orthonormal rows: no interference (the control)
            q, _ = torch.linalg.qr(raw.T)  # (d, N), orthonormal columns
            dictionary = q.T
        else:
            dictionary = raw / raw.norm(dim=1, keepdim=True)
        self.dictionary = dictionary.float()  # (N, d), unit rows
        # channel-blind tags: rows of a fixed bank of random vectors, drawn per item independently
        # of the item (a bank, not a fresh vector per item, so a step costs a gather, not n T d normals)
        self.tag_bank = torch.randn(TAG_BANK, d, generator=g) / math.sqrt(d)  # (K, d)

    def sample(self, n: int, items_gen, keys_gen, condition: str) -> "ToyBatch":
        """``n`` sequences: item ids (n, T), relevant mask (n, T), tags (n, T, d) or None, targets (n, R)."""
        return _batch(*self.draw(n, items_gen, keys_gen, condition), self.p_relevant, self.n_relevant)

    def draw(self, n: int, items_gen, keys_gen, condition: str, out: tuple | None = None) -> tuple:
        """The random draws behind ``sample``, in its order: uniforms, relevant ids, irrelevant ids (n, T)
        from ``items_gen``; tags (n, T) from ``keys_gen`` (channel-blind) or None. ``out``: four
        tensors (or None for the tags) to draw into instead of new ones."""
        import torch

        if condition not in CONDITIONS:
            raise SinkscopeError(f"unknown toy condition {condition!r}; use {' or '.join(CONDITIONS)}.")
        T, R = self.n_items, self.n_relevant
        uniform, rel_id, irr_id, tags = out or (None, None, None, None)
        uniform = torch.rand(n, T, generator=items_gen, out=uniform)  # (n, T): relevant where < p
        rel_id = torch.randint(0, R, (n, T), generator=items_gen, out=rel_id)  # (n, T)
        irr_id = torch.randint(R, self.n_features, (n, T), generator=items_gen, out=irr_id)  # (n, T)
        if condition == "blind":  # a random tag per item, drawn from its own stream: no content
            tags = torch.randint(0, self.tag_bank.shape[0], (n, T), generator=keys_gen, out=tags)  # (n, T): bank rows
        else:
            tags = None
        return uniform, rel_id, irr_id, tags

    def values(self, batch: "ToyBatch"):
        """The items' vectors (n, T, d)."""
        return self.dictionary[batch.ids]

    def keys(self, batch: "ToyBatch"):
        """The keys (n, T, d): the tags (channel-blind) or the items themselves (routing-visible)."""
        return self.values(batch) if batch.tags is None else self.tag_bank[batch.tags]


@dataclass
class ToyBatch:
    ids: object  # (n, T) int64 feature ids
    relevant: object  # (n, T) bool
    tags: object  # (n, T) int64 rows of the tag bank, or None when the keys are the items
    targets: object  # (n, R) float {0, 1}


@dataclass
class ToyStackData:
    """The S seeds' ToyData of one load, stacked: what ToyStack reads."""

    dictionary: object  # (S, N, d)
    tag_bank: object  # (S, K, d)
    dictionary_t: object  # (S, d, N): the same, transposed (contiguous)
    tag_bank_t: object  # (S, d, K)

    @classmethod
    def of(cls, datas: list[ToyData]) -> "ToyStackData":
        import torch

        dictionary = torch.stack([data.dictionary for data in datas])  # (S, N, d)
        tag_bank = torch.stack([data.tag_bank for data in datas])  # (S, K, d)
        return cls(dictionary, tag_bank, dictionary.transpose(1, 2).contiguous(), tag_bank.transpose(1, 2).contiguous())


def _batch(uniform, rel_id, irr_id, tags, p_relevant: float, n_relevant: int) -> ToyBatch:
    """A ToyBatch from the draws (any leading dimensions ``L``, items last): relevant = uniform < p,
    ids = relevant ? rel_id : irr_id, targets[..., r] = [some relevant item is feature r]."""
    import torch

    relevant = uniform < p_relevant  # (L, T)
    ids = torch.where(relevant, rel_id, irr_id)  # (L, T)
    targets = torch.zeros(*ids.shape[:-1], n_relevant)  # (L, R): relevant items counted at their ids
    targets.scatter_add_(-1, rel_id, relevant.float())
    return ToyBatch(ids, relevant, tags, (targets > 0).float())


def sample_stack(datas: list[ToyData], n: int, gens: list[tuple], condition: str) -> ToyBatch:
    """``datas[s].sample(n, *gens[s], condition)`` for every seed s, stacked: ids (S, n, T), ..., targets (S, n, R).

    The same draws from the same generators in the same order (into one buffer per draw); the
    rest is done once for all seeds.
    """
    import torch

    S, T = len(datas), datas[0].n_items
    uniform = torch.empty(S, n, T)  # (S, n, T)
    rel_id, irr_id = torch.empty(S, n, T, dtype=torch.long), torch.empty(S, n, T, dtype=torch.long)  # (S, n, T)
    tags = torch.empty(S, n, T, dtype=torch.long) if condition == "blind" else None  # (S, n, T)
    for s, (data, gen) in enumerate(zip(datas, gens)):
        data.draw(n, *gen, condition, out=(uniform[s], rel_id[s], irr_id[s], None if tags is None else tags[s]))
    return _batch(uniform, rel_id, irr_id, tags, datas[0].p_relevant, datas[0].n_relevant)


def _module(variant: str, d: int, n_out: int, beta: float):
    import torch
    from torch import nn

    class ToyModel(nn.Module):
        """One learned query over the items, one head, a linear readout (module docstring)."""

        def __init__(self):
            super().__init__()
            self.variant = variant
            self.q = nn.Parameter(torch.randn(d) / math.sqrt(d))  # (d,)
            self.w_k = nn.Linear(d, d, bias=False)
            self.w_v = nn.Linear(d, d, bias=False)
            self.readout = nn.Linear(d, n_out)
            self.tau = nn.Parameter(torch.zeros(())) if variant == "normgate" else None

        def _mix(self, s, v_norm, relevant):
            """Read weights (n, T): attention x gate x oracle mask."""
            if self.variant == "offbyone":  # phantom: logit 0, value 0
                s = torch.cat([s, torch.zeros_like(s[:, :1])], dim=1)  # (n, T+1)
                a = torch.softmax(s, dim=1)[:, :-1]  # (n, T)
            else:
                a = torch.softmax(s, dim=1)  # (n, T)
            if self.variant == "normgate":
                a = a * torch.sigmoid(beta * (v_norm / math.sqrt(d) - self.tau))  # g_t
            if self.variant == "oracle":
                a = a * relevant.float()  # irrelevant reads zeroed by ground truth
            return a

        def forward(self, data, batch):
            """The fast path: every per-item quantity is a function of the feature (or tag) id, so
            the projections act on the dictionary's N rows (and the tag bank's), not on n x T items."""
            vd = self.w_v(data.dictionary)  # (N, d): W_V x for every feature
            if batch.tags is None:
                s = (self.w_k(data.dictionary) @ self.q / math.sqrt(d))[batch.ids]  # (n, T)
            else:
                s = (data.tag_bank @ (self.w_k.weight.T @ self.q) / math.sqrt(d))[batch.tags]  # (n, T): q . W_K tag
            a = self._mix(s, vd.norm(dim=-1)[batch.ids], batch.relevant)  # (n, T)
            counts = torch.zeros(a.shape[0], vd.shape[0], dtype=a.dtype).scatter_add(1, batch.ids, a)  # (n, N)
            return self.readout(counts @ vd)  # (n, R)

        def reference(self, values, keys, relevant):
            """The explicit path on item vectors (n, T, d): the definition, for tests."""
            s = self.w_k(keys) @ self.q / math.sqrt(d)  # (n, T)
            v = self.w_v(values)  # (n, T, d)
            a = self._mix(s, v.norm(dim=-1), relevant)  # (n, T)
            return self.readout(torch.einsum("nt,ntd->nd", a, v))  # (n, R)

    return ToyModel()


def bag_readout(a, ids, dictionary, m):
    """z[s, v, n] = m[s, v] @ sum_t a[s, v, n, t] x[s, ids[s, n, t]]: each (seed, variant, sequence) a
    weighted bag of its seed's dictionary rows, mapped by its model's (R x d) ``m``.
    a (S, V, n, T), ids (S, n, T), dictionary (S, N, d), m (S, V, R, d) -> (S, V, n, R).

    Forward: the bag r = sum_t a_t x_t by ``embedding_bag`` (sum mode, per-sample weights), n T d
    per model whatever the load, then r m^T. Backward (the dictionary is fixed): dm = g^T r and
    da[s, v, n, t] = g[s, v, n] . (m x)[s, v, ids[s, n, t]], gathered from g @ (m X^T), n R N per
    model (``embedding_bag``'s own per-sample-weight backward is a slow scalar loop).
    """
    return _functions().BagReadout.apply(a, ids, dictionary, m)


def read_weights(s, phantom: tuple[int, ...], gate=None, gate_col=None, mask=None, mask_col=None):
    """The read weights a (S, V, n, T) of every column v from its logits s (S, V, n, T):

        a_t = e^{s_t} / (sum_j e^{s_j} + [v in phantom] e^0)  x  gate_t (column gate_col)  x  mask_t (column mask_col)

    i.e. a softmax over the items, with a phantom key (logit 0, value 0) in the normaliser of the
    ``phantom`` columns, times the norm gate (S, n, T) on one column and the oracle's mask on
    another. Backward, with p the (phantom-)softmax and g' = g x gate x mask:
    ds_t = p_t (g'_t - sum_j p_j g'_j) (the phantom's logit is fixed), dgate_t = g_t p_t.
    """
    return _functions().ReadWeights.apply(s, gate, mask, tuple(phantom), gate_col, mask_col)


def _functions():
    """The toy's autograd functions (built on first use: torch is imported lazily)."""
    global _FUNCTIONS
    if _FUNCTIONS is None:
        _FUNCTIONS = _build_functions()
    return _FUNCTIONS


_FUNCTIONS = None
_DOTS_CHUNK = 1 << 17  # floats of bag_readout's (n, N) dot products computed at once (512 KB)


def _build_functions():
    import types

    import torch
    import torch.nn.functional as F

    class BagReadout(torch.autograd.Function):
        """:func:`bag_readout`."""

        @staticmethod
        def forward(ctx, a, ids, dictionary, m):
            S, V, n, T = a.shape
            N, d = dictionary.shape[1:]
            rows = (ids + torch.arange(S).view(S, 1, 1) * N).int()  # (S, n, T): rows of the S N stacked dictionary rows
            rows = rows.unsqueeze(1).expand(S, V, n, T).reshape(S * V * n, T)  # (S V n, T): one bag each
            r = F.embedding_bag(rows, dictionary.reshape(S * N, d), per_sample_weights=a.reshape(S * V * n, T),
                                mode="sum").view(S, V, n, d)  # (S, V, n, d): sum_t a_t x_t
            ctx.save_for_backward(ids, dictionary, m, r)
            return torch.matmul(r, m.transpose(-1, -2))  # (S, V, n, R)

        @staticmethod
        def backward(ctx, grad):
            ids, dictionary, m, r = ctx.saved_tensors
            S, V, n, _ = grad.shape
            T = ids.shape[2]
            N = dictionary.shape[1]
            grad_m = torch.matmul(grad.transpose(-1, -2), r)  # (S, V, R, d): g^T r
            mapped = torch.einsum("svrd,snd->svrn", m, dictionary)  # (S, V, R, N): m x per feature
            grad_a = torch.empty(S, V, n, T, dtype=grad.dtype)  # (S, V, n, T)
            step = max(1, min(V, _DOTS_CHUNK // (n * N)))  # variants at a time: the (n, N) dots stay in cache
            for s in range(S):
                for v in range(0, V, step):
                    dots = torch.matmul(grad[s, v:v + step], mapped[s, v:v + step])  # (c, n, N): g . m x
                    torch.gather(dots, 2, ids[s].expand(dots.shape[0], n, T), out=grad_a[s, v:v + step])
            return grad_a, None, None, grad_m

    class ReadWeights(torch.autograd.Function):
        """:func:`read_weights`."""

        @staticmethod
        def forward(ctx, s, gate, mask, phantom, gate_col, mask_col):
            top = s.amax(dim=-1, keepdim=True)  # (S, V, n, 1): a shift that cancels
            p = torch.exp(s - top)  # (S, V, n, T)
            total = p.sum(dim=-1, keepdim=True)  # (S, V, n, 1)
            for v in phantom:  # the phantom's e^{0 - top}
                total[:, v] += torch.exp(-top[:, v])
            p /= total  # (S, V, n, T): the (phantom-)softmax
            a = p.clone()
            if gate_col is not None:
                a[:, gate_col] *= gate
            if mask_col is not None:
                a[:, mask_col] *= mask
            ctx.save_for_backward(p, gate, mask)
            ctx.cols = (gate_col, mask_col)
            return a

        @staticmethod
        def backward(ctx, grad):
            p, gate, mask = ctx.saved_tensors
            gate_col, mask_col = ctx.cols
            g = grad.clone()  # (S, V, n, T): becomes g' = g x gate x mask
            grad_gate = None
            if gate_col is not None:
                grad_gate = grad[:, gate_col] * p[:, gate_col]  # (S, n, T)
                g[:, gate_col] *= gate
            if mask_col is not None:
                g[:, mask_col] *= mask
            grad_s = p * (g - (p * g).sum(dim=-1, keepdim=True))  # (S, V, n, T)
            return grad_s, grad_gate, None, None, None, None

    return types.SimpleNamespace(BagReadout=BagReadout, ReadWeights=ReadWeights)


def _stack(variants: tuple[str, ...], n_seeds: int, d: int, n_out: int, beta: float):
    """``n_seeds`` x ``len(variants)`` ToyModels as one module of stacked parameters.

    Slice ``[s, v]`` of every parameter is the model of seed ``s`` and variant ``v``, and slice
    [s, v] of the forward's logits is that model's ToyModel.forward (the same function, computed
    in another order: see ``forward``). Summing the S V models' losses gives each slice its own
    gradient, so one autograd graph and one Adam step serve them all (Adam is elementwise).
    """
    import torch
    from torch import nn

    S, V = n_seeds, len(variants)
    col = {name: i for i, name in enumerate(variants)}
    phantom = tuple(v for v, name in enumerate(variants) if name == "offbyone")  # columns with a phantom key

    class ToyStack(nn.Module):
        """Stacked ToyModels (see :func:`_stack`); parameters (S, V, ...), ToyModel's layout."""

        def __init__(self):
            super().__init__()
            self.variants = variants
            self.q = nn.Parameter(torch.zeros(S, V, d))  # (S, V, d)
            self.w_k = nn.Parameter(torch.zeros(S, V, d, d))  # (S, V, d, d): W_K, Linear's (out, in)
            self.w_v = nn.Parameter(torch.zeros(S, V, d, d))  # (S, V, d, d): W_V
            self.readout_w = nn.Parameter(torch.zeros(S, V, n_out, d))  # (S, V, R, d): W_O
            self.readout_b = nn.Parameter(torch.zeros(S, V, n_out))  # (S, V, R)
            self.tau = nn.Parameter(torch.zeros(S)) if "normgate" in col else None  # (S,): the norm gates' tau

        def load_models(self, models) -> None:
            """Copy ToyModels in: ``models[s][v]`` into slice [s, v] (tau from the normgate models)."""
            with torch.no_grad():
                for s, row in enumerate(models):
                    for v, model in enumerate(row):
                        self.q[s, v] = model.q
                        self.w_k[s, v] = model.w_k.weight
                        self.w_v[s, v] = model.w_v.weight
                        self.readout_w[s, v] = model.readout.weight
                        self.readout_b[s, v] = model.readout.bias
                        if model.tau is not None and variants[v] == "normgate":
                            self.tau[s] = model.tau

        def model(self, s: int, v: int):
            """Slice [s, v] as its own ToyModel (a copy with the same weights)."""
            model = _module(variants[v], d, n_out, beta)
            with torch.no_grad():
                model.q.copy_(self.q[s, v])
                model.w_k.weight.copy_(self.w_k[s, v])
                model.w_v.weight.copy_(self.w_v[s, v])
                model.readout.weight.copy_(self.readout_w[s, v])
                model.readout.bias.copy_(self.readout_b[s, v])
                if model.tau is not None:
                    model.tau.copy_(self.tau[s])
            return model

        def _scores(self, data, batch):
            """Logits s (S, V, n, T) = q . W_K k_t / sqrt(d) = k_t . u, u = W_K^T q / sqrt(d), read
            from a table of u . row over the rows the keys come from (the tag bank, or the dictionary)."""
            u = (self.w_k * self.q.unsqueeze(-1)).sum(dim=-2) / math.sqrt(d)  # (S, V, d): W_K^T q / sqrt(d)
            rows_t, index = (data.dictionary_t, batch.ids) if batch.tags is None else (data.tag_bank_t, batch.tags)
            table = torch.matmul(u, rows_t)  # (S, V, K): u . row for every row
            n, T = index.shape[1:]
            flat = index.reshape(S, 1, n * T).expand(S, V, n * T)  # (S, V, n T)
            return torch.gather(table, 2, flat).reshape(S, V, n, T)  # (S, V, n, T)

        def _gate(self, data, batch):
            """The norm gates g_t = sigmoid(beta (||W_V x_t|| / sqrt(d) - tau)) (S, n, T), tau per seed,
            from ||W_V x|| over the dictionary's N rows."""
            w_v = self.w_v[:, col["normgate"]]  # (S, d, d)
            norms = torch.matmul(data.dictionary, w_v.transpose(1, 2)).norm(dim=-1)  # (S, N)
            n, T = batch.ids.shape[1:]
            v_norm = torch.gather(norms, 1, batch.ids.reshape(S, n * T)).reshape(S, n, T)  # (S, n, T)
            return torch.sigmoid(beta * (v_norm / math.sqrt(d) - self.tau.view(S, 1, 1)))

        def forward(self, data, batch):
            """Logits (S, V, n, R) = W_O W_V r + b, r = sum_t a_t x_t the read in the input space.

            ToyModel.forward's function (W_O sum_t a_t W_V x_t = (W_O W_V) sum_t a_t x_t, and
            q . W_K k = (W_K^T q) . k) in the order that costs least: the read is a weighted bag of
            dictionary rows (:func:`bag_readout`), n T d per model whatever the load, where the
            per-feature (n x N) @ (N x d) read costs n N d in the forward and twice more backward.
            """
            gate = self._gate(data, batch) if "normgate" in col else None  # (S, n, T)
            mask = batch.relevant.float() if "oracle" in col else None  # (S, n, T)
            a = read_weights(self._scores(data, batch), phantom, gate, col.get("normgate"), mask,
                             col.get("oracle"))  # (S, V, n, T)
            m = torch.matmul(self.readout_w, self.w_v)  # (S, V, R, d): W_O W_V
            return bag_readout(a, batch.ids, data.dictionary, m) + self.readout_b.unsqueeze(2)  # (S, V, n, R)

    return ToyStack()


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """torch's intra-op threads set to ``threads`` inside the block and restored after it (None: unchanged).

    Restoring matters in-process (the API, recipes, tests): a thread count changes float
    reduction order, so a later computation in the same process would not repeat bit for bit.
    """
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads:
            torch.set_num_threads(before)


def train_cell(options: ToyOptions, condition: str, load: int, seed: int) -> list[dict]:
    """Train every variant of one (condition, load, seed) on the same batches; one row per variant."""
    return train_group(options, condition, load, (seed,))


def train_group(options: ToyOptions, condition: str, load: int, seeds: tuple[int, ...]) -> list[dict]:
    """Train every (seed, variant) of one (condition, load) as one stacked module; rows by seed, then variant.

    Each seed's variants share one initialisation (a ToyModel drawn after ``torch.manual_seed(seed)``)
    and train on that seed's batches (its own generators, drawn in the same order as alone); the
    loss is the sum over the S V models of their mean BCE, so every slice gets its own gradient,
    and one Adam over the stacked parameters is S V separate Adams. Runs in ``options.threads``
    torch threads (None: 1), restored after.
    """
    with torch_threads(options.threads or 1):
        return _train_group(options, condition, load, tuple(seeds))


def _train_group(options: ToyOptions, condition: str, load: int, seeds: tuple[int, ...]) -> list[dict]:
    import torch
    import torch.nn.functional as F

    datas = [ToyData(load * D, seed, n_relevant=options.n_relevant, p_relevant=options.p_relevant,
                     n_items=options.n_items) for seed in seeds]
    stacked = ToyStackData.of(datas)
    model = _stack(options.variants, len(seeds), D, options.n_relevant, options.beta)
    model.load_models([[_initial(options, seed)] * len(options.variants) for seed in seeds])
    optim = torch.optim.Adam(model.parameters(), lr=options.lr, fused=True)  # one kernel per tensor
    cells = [f"{condition}-{load}-{seed}" for seed in seeds]
    gens = [(torch.Generator().manual_seed(hash_seed("items", cell)),
             torch.Generator().manual_seed(hash_seed("keys", cell))) for cell in cells]
    for _ in range(options.steps):
        batch = sample_stack(datas, options.batch_size, gens, condition)
        logits = model(stacked, batch)  # (S, V, n, R)
        optim.zero_grad(set_to_none=True)
        logits.backward(bce_grad(logits.detach(), batch.targets.unsqueeze(1)))
        optim.step()
    gens = [(torch.Generator().manual_seed(hash_seed("eval-items", cell)),
             torch.Generator().manual_seed(hash_seed("eval-keys", cell))) for cell in cells]
    batch = sample_stack(datas, options.eval_seqs, gens, condition)
    rows = []
    with torch.no_grad():
        logits = model(stacked, batch)  # (S, V, n, R)
        for s, seed in enumerate(seeds):
            targets = batch.targets[s]  # (n, R)
            for v, variant in enumerate(options.variants):
                rows.append({"condition": condition, "load": load, "variant": variant, "seed": seed,
                             "error": float(F.binary_cross_entropy_with_logits(logits[s, v], targets)),
                             "label_error": float(((logits[s, v] > 0).float() != targets).float().mean())})
    return rows


def bce_grad(logits, targets):
    """d/dz of the sum over the models of each one's mean BCE with logits over its n R labels:
    (sigmoid(z) - y) / (n R). logits (S, V, n, R), targets broadcastable to them."""
    import torch

    return (torch.sigmoid(logits) - targets) / (logits.shape[-2] * logits.shape[-1])


def _initial(options: ToyOptions, seed: int):
    """The initialisation every variant of a seed shares: a ToyModel drawn after ``torch.manual_seed(seed)``."""
    import torch

    torch.manual_seed(seed)
    return _module(options.variants[0], D, options.n_relevant, options.beta)


def hash_seed(*parts) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:6], "little")


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard error over seeds per (condition, load, variant), and the headroom closed."""
    from sinkscope.stats.paired import mean_se

    out = []
    for (condition, load, variant), group in rows.groupby(["condition", "load", "variant"], sort=False):
        mean, se = mean_se(group["error"])
        out.append({"condition": condition, "load": load, "variant": variant, "error": mean, "se": se,
                    "label_error": float(group["label_error"].mean()), "n": len(group)})
    frame = pd.DataFrame(out)
    closed = []
    for row in frame.itertuples():
        same = frame[(frame.condition == row.condition) & (frame.load == row.load)].set_index("variant")["error"]
        if "baseline" in same and "oracle" in same and same["baseline"] - same["oracle"] > 0:
            closed.append((same["baseline"] - row.error) / (same["baseline"] - same["oracle"]))
        else:
            closed.append(math.nan)
    frame["headroom_closed"] = closed
    return frame


#: the files the toy task writes (its folder holds nothing else).
TOY_FILES = ("toy.csv", "toy_summary.csv", "toy.md", "toy.png")
TOY_WRITER = "toy"
_TOY_TITLE = "# Toy superposition task ("


def toy_legacy(out: Path):
    """``legacy`` for ``fileio.foreign_entries``: a toy folder written before inventories.

    Recognised by its ``toy.md`` (the page's own title); its files are then ``TOY_FILES``. None
    for any other folder: a user's ``toy.csv`` alone is never taken for the toy task's.
    """
    try:
        with open(Path(out) / "toy.md", encoding="utf-8") as handle:
            title = handle.read(len(_TOY_TITLE))
    except (OSError, UnicodeDecodeError):
        return None
    return (lambda rel: rel in TOY_FILES) if title == _TOY_TITLE else None


def check_toy_dir(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` the toy task may not replace (before training, and again before the swap).

    Absent or empty: written. The toy task's earlier output: replaced with ``overwrite``. Anything
    else (a file sinkscope did not write, another writer's folder, the current folder): refused.
    """
    from sinkscope.store.files import check_not_cwd, check_replaceable, read_inventory

    out = Path(out)
    check_not_cwd(out, "the toy task replaces its folder whole: give it", "reports/toy")
    inventory = read_inventory(out) if out.is_dir() and not out.is_symlink() else None
    if inventory is not None and inventory["writer"] != TOY_WRITER:
        raise SinkscopeError(f"{option('out')} {out} was written by sinkscope's {inventory['writer'] or 'unknown'} writer, not by "
                             f"the toy task; choose another {option('out')}.")
    check_replaceable(out, overwrite, kind="toy task", legacy=toy_legacy(out) if out.is_dir() else None,
                      hint="pass --overwrite to replace it")


def run_toy(options: ToyOptions, log=None, executor_options=None) -> Path:
    """Every (condition, load, seed) cell; writes toy.csv, toy_summary.csv, toy.md and toy.png.

    The folder is written whole into a hidden sibling and swapped into place at the end
    (``fileio.replace_folder``): a crash leaves the old output or the new one. ``--out`` is
    checked first (:func:`check_toy_dir`) and locked for the whole run. ``engine``
    (``executors.settings.ExecutorOptions``): where the groups train (:func:`train_all`).
    """
    log = log or (lambda message: print(message, flush=True))
    for variant in options.variants:
        if variant not in VARIANTS:
            raise SinkscopeError(f"unknown toy variant {variant!r}; variants: {', '.join(VARIANTS)}.")
    for condition in options.conditions:
        if condition not in CONDITIONS:
            raise SinkscopeError(f"unknown toy condition {condition!r}; use {' or '.join(CONDITIONS)}.")
    if any(load < 1 for load in options.loads) or options.steps < 1:
        raise SinkscopeError("loads and steps must be positive.")
    check_toy_numbers(options)
    out = Path(options.out)
    check_toy_dir(out, options.overwrite)
    from sinkscope.store.files import lock_folder

    with lock_folder(out, kind="toy", writer="toy run"):
        check_toy_dir(out, options.overwrite)  # under the lock
        _run_toy(options, out, log, executor_options)
    log(f"wrote {out / 'toy.md'}")
    return out / "toy.md"


def check_toy_numbers(options: ToyOptions) -> None:
    """One sentence naming the first count that is not a positive integer or rate that is not a finite
    positive number (``--batch-size 0`` would divide by zero in every group), before anything trains."""
    for name in ("steps", "batch_size", "eval_seqs", "n_items", "n_relevant", "jobs", "threads"):
        value = getattr(options, name)
        if value is None and name in ("jobs", "threads"):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SinkscopeError(f"{option(name)} must be a positive integer, not {value!r}.")
    for name in ("lr", "beta", "p_relevant"):
        value = getattr(options, name)
        if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0
                or (name == "p_relevant" and value > 1)):
            limit = "a number in (0, 1]" if name == "p_relevant" else "a finite positive number"
            raise SinkscopeError(f"{option(name)} must be {limit}, not {value!r}.")


def toy_jobs(options: ToyOptions) -> int:
    """Worker processes: ``options.jobs``, or one per CPU this process may use; at most one per group."""
    groups = len(options.conditions) * len(options.loads)
    if options.jobs is not None:
        return max(1, min(options.jobs, groups))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, groups))


def train_all(options: ToyOptions, log=lambda message: None, executor_options=None) -> list[dict]:
    """Every (condition, load) group (:func:`train_group`, all seeds at once), each in one torch
    thread (``options.threads`` if given): in this process for one job, else one job each (the
    largest loads first) in :func:`toy_jobs` spawned processes or on ``engine`` (``--executor
    ray|slurm``), as :func:`_train_on_engine` runs them; rows by condition, load, seed, variant. A
    group's rows do not depend on the number of processes or where they ran."""
    groups = [(condition, load) for condition in options.conditions for load in options.loads]
    done = {}

    def finished(group, rows):
        done[group] = rows
        for seed in options.seeds:
            log(f"{group[0]} load {group[1]} seed {seed}: "
                + ", ".join(f"{r['variant']} {r['error']:.4f}" for r in rows if r["seed"] == seed))

    if executor_options is None or executor_options.executor == "local":
        jobs = toy_jobs(options)
        if jobs == 1:
            for group in groups:
                finished(group, _train_group_job(options, *group))
            return [row for group in groups for row in done[group]]
        from sinkscope.executors.settings import ExecutorOptions

        executor_options = ExecutorOptions(jobs=jobs)  # each group a process of its own: a killed one fails alone
    _train_on_executor(options, sorted(groups, key=lambda group: -group[1]), executor_options, log, finished)
    return [row for group in groups for row in done[group]]


def _train_on_executor(options: ToyOptions, groups: list[tuple[str, int]], executor_options, log, finished) -> None:
    """Each group one job on ``engine`` (``executors``: local processes, Ray or SLURM), its log under
    ``paths.cache_root()/engine/`` (the output folder is written whole at the end); ``finished(group,
    rows)`` as each group ends. A group that fails, fails alone: the others finish, then one sentence
    names each group that failed (nothing is written then)."""
    import time

    from sinkscope.executors.jobs import Job
    from sinkscope.executors.run import run_jobs
    from sinkscope.runtime.paths import cache_root

    folder = cache_root() / "engine" / f"toy-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    jobs = [Job(f"{condition}-load{load}", str(folder / "logs" / f"{condition}-load{load}.log"), _train_group_job,
                (options, condition, load)) for condition, load in groups]  # train_group sets its threads
    by_name = dict(zip((job.name for job in jobs), groups))

    def arrived(outcome) -> None:
        if outcome.ok:
            finished(by_name[outcome.name], _checked_rows(outcome.value, outcome.name))

    outcomes = run_jobs(jobs, executor_options, folder, log=log, show_progress=executor_options.executor != "local", on_outcome=arrived)
    failed = [outcome for outcome in outcomes if not outcome.ok]
    if failed:
        raise SinkscopeError(f"{len(failed)} of {len(jobs)} toy groups failed: " + "; ".join(o.failure() for o in failed)
                             + "; nothing was written.")


def _checked_rows(value, name: str) -> list[dict]:
    """A group's rows as a job hands them back (JSON from SLURM): a list of flat dicts of numbers and
    texts, else one sentence."""
    ok = isinstance(value, list) and all(isinstance(row, dict) and all(
        isinstance(key, str) and isinstance(item, (str, int, float)) for key, item in row.items()) for row in value)
    if not ok:
        raise SinkscopeError(f"the toy group {name} handed back rows that are not a table's; rerun the command.")
    return value


def _train_group_job(options: ToyOptions, condition: str, load: int) -> list[dict]:
    """One group's job: its rows, each a flat dict of numbers and texts (JSON can carry them back)."""
    return [{key: (value.item() if hasattr(value, "item") else value) for key, value in row.items()}
            for row in train_group(options, condition, load, options.seeds)]


def _run_toy(options: ToyOptions, out: Path, log, executor_options=None) -> None:
    import shutil
    import tempfile

    from sinkscope.store.files import default_folder_mode, replace_folder, write_inventory

    frame = pd.DataFrame(train_all(options, log, executor_options))
    summary = summarise(frame)
    stage = Path(tempfile.mkdtemp(prefix=f".{Path(os.path.abspath(out)).name}.partial-",
                                  dir=Path(os.path.abspath(out)).parent))
    try:
        os.chmod(stage, default_folder_mode())
        _write_outputs(options, frame, summary, stage)
        write_inventory(stage, TOY_WRITER)
        check_toy_dir(out, options.overwrite)  # nothing of anyone else's appeared there while it trained
        replace_folder(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def _write_outputs(options: ToyOptions, frame: pd.DataFrame, summary: pd.DataFrame, out: Path) -> None:
    """toy.csv, toy_summary.csv, toy.md and toy.png into ``out`` (the staging folder)."""
    from sinkscope.stats.paired import fmt_pm
    from sinkscope.store.files import atomic_write_text

    atomic_write_text(out / "toy.csv", frame.to_csv(index=False))
    atomic_write_text(out / "toy_summary.csv", summary.to_csv(index=False))
    lines = [f"# Toy superposition task ({options.steps} steps x {options.batch_size}, seeds "
             f"{', '.join(map(str, options.seeds))})", "",
             "Error: held-out BCE per label (nats), mean ± se over seeds; headroom closed = "
             "(base - var) / (base - oracle).", ""]
    for condition in options.conditions:
        lines += [f"## {CONDITION_LABELS[condition]}", "", "| load | variant | error | label error | headroom closed |",
                  "| --- | --- | --- | --- | --- |"]
        for r in summary[summary.condition == condition].itertuples():
            closed = "–" if math.isnan(r.headroom_closed) else f"{100 * r.headroom_closed:.0f}%"
            lines.append(f"| {r.load} | {r.variant} | {fmt_pm(r.error, r.se)} | {r.label_error:.4f} | {closed} |")
        lines.append("")
    atomic_write_text(out / "toy.md", "\n".join(lines))
    from sinkscope.report.lab_figures import toy_error_by_load  # every figure is drawn in report/

    toy_error_by_load(summary, CONDITION_LABELS).savefig(out / "toy.png", dpi=120)
