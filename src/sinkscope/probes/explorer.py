"""The explorer's patterns: a few heads' attention on a few windows, sparse (SPEC.md "The explorer").

Not a metric: the pipeline runs this probe beside the measurement's probes, in the measuring forward,
on its first ``--explore-windows`` windows (``windows``; issue 56, item 2), or, where that cannot be
(a resumed run, several processes), alone in an extra pass over them after it
(``forward/explorer_pass.py``), and writes what it keeps to ``explorer.npz``
(``store/explorer_format.py``) for the report's interactive view.

Per layer it reads the attention record and keeps, for each head of ``heads`` and each window,

    a_qj      the weight the model's eager attention returns (over real keys, any learned phantom
              in the normaliser: a_qj = exp(s_qj - LSE_q) (1 - phi_q) on a fused record), where
              a_qj >= threshold, as uint16 codes of 1 / 65,535
    ||v_j||   the norm of the head's value at each key (its KV head's under GQA)
    phi_q     the phantom mass (learned-sink models), 1 - sum_j a_qj

and, for every head, its position-0 mass p0 = mean over queries q >= 1 of w_q0 (SPEC.md
"Position-0 mass") on these windows, summed window by window (the same float64 additions at any
batch size): ``heads="none"`` keeps only that. ``all`` keeps every head, ``L.H,...`` the heads
named. ``auto`` keeps ``explorer_data.choose_heads``'s heads, chosen as the layers arrive: the
AUTO_SAMPLE heads drawn with ``seed`` (known before the pass) and the AUTO_TOP others of highest
position-0 mass on the windows of the first batch, kept as a running set. A head in it holds its
own record (its q, k, v: ``AttentionRecord.one_head``) until the batch ends, one pushed out drops
it, and the final heads' patterns are read then, in the page's order; later batches read the final
set's as they come. A decision of this project: ``auto`` ranks by the first batch's explorer
windows (every explorer window when the batch holds them all), not by the whole run's p0_mass, so
that one pass serves both. Rows are walked in query blocks of at most :data:`BLOCK_BYTES` of
logits, each over the keys its queries can see, for the kept heads only: no (T, S) matrix of every
head is made on the fused path. Each (window, head)'s kept entries are found in its own slice of
the block and move to the host as each layer is read (this pass exists only to keep them).

Memory follows the page's budget (:meth:`Explorer.keep_within`): the page keeps patterns window by
window until its budget is spent (``explorer_data.fit``), so once the windows read in earlier
batches already cost more than the budget, a later batch's patterns keep only their row counts,
value norms and phantom mass (what the file holds for a pattern left out), not their entries.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sinkscope.capture import hooks
from sinkscope.capture.masks import hidden_keys
from sinkscope.capture.record import AttentionRecord
from sinkscope.store.explorer_format import (AUTO_SAMPLE, AUTO_TOP, SCALE, THRESHOLD, ExplorerData, block_size,
                                             label_array, parse_heads)
from sinkscope.probes.base import Param, Probe, observes, register_probe

#: query blocks hold at most this many bytes of float32 logits (all heads of the batch).
BLOCK_BYTES = 64 << 20
#: query blocks hold at most this many rows: a block reads the keys up to its last query only, so smaller blocks
#: compute less of the causal triangle's empty half (5/8 of the square at 4,096 queries in blocks of 512).
BLOCK_ROWS = 512
#: fused records: a logit within this much (in log space) of the threshold's is a candidate whose weight is then
#: computed exactly, so float32 rounding of the bound never drops a weight at or above the threshold.
LOG_SLACK = 1e-3


def _heads_value(value: str) -> str | None:
    try:
        parse_heads(value)
    except Exception as error:  # noqa: BLE001 - the sentence of parse_heads
        return str(error)
    return None


@register_probe("explorer", params=(
    Param("heads", str, "all", "all | none (position-0 mass only) | L.H,L.H,... : the heads whose patterns are kept",
          check=_heads_value),
    Param("threshold", float, THRESHOLD, "weights below this are not kept"),
    Param("windows", int, 0, "read only windows below this index (0: every window the probe sees)",
          check=lambda v: None if v >= 0 else "must be at least 0"),
    Param("seed", int, 0, "auto: the seed of the sampled heads"),
), metrics={}, summary="keeps a few heads' attention patterns for the report's explorer (no metric)")
class Explorer(Probe):
    """Sparse attention patterns of chosen heads, for the report's explorer (no rows)."""

    reads_weights_only = True  # the eager fallback's weights suffice (no value norms then)

    def setup(self) -> None:
        self.kind, asked = parse_heads(self.heads)
        spec = self.spec
        self.p0_sum = np.zeros((spec.n_layers, spec.n_heads))
        self.p0_count = np.zeros((spec.n_layers, spec.n_heads))
        self.patterns: dict[tuple[int, int], dict[int, dict]] = {}  # (layer, head) -> window row -> pattern
        self.asked = set(asked)
        self.has_phantom = False
        self.has_value_norms = True
        self.seq_len = 0
        self.max_bytes: int | None = None  # the page's budget (keep_within); None: keep every entry
        self.window_bytes: dict[int, int] = {}  # window row -> what its patterns cost the page (within the budget)
        #: auto: the sampled heads (drawn as choose_heads draws them), the running top set, whether it is final
        attention_heads = [(l, h) for l in sorted(spec.attention_layers) for h in range(spec.n_heads)]
        drawn = np.random.default_rng(self.seed).permutation(len(attention_heads))[:AUTO_SAMPLE]
        self.sampled = {attention_heads[i] for i in drawn} if self.kind == "auto" else set()
        self.tops: list[tuple[int, int]] = []
        self.ranked = False
        self.windows_read = 0
        #: the line the run prints when the probe rides its measuring forward (``explorer_pass.rider``)
        self.announcement: str | None = None
        #: auto, the ranking batch: the fused records of the candidate heads (one head each), read at its end
        self.deferred: dict[tuple[int, int], AttentionRecord] = {}

    def keep_within(self, max_bytes: int | None, labels_bytes: int) -> None:
        """Keep the entries of the windows the page can hold: ``max_bytes`` of page data, of which the
        windows' token labels take ``labels_bytes`` (``explorer_data.fit``'s count). None keeps all."""
        self.max_bytes = None if max_bytes is None else int(max_bytes) - int(labels_bytes)

    def _past_budget(self) -> bool:
        """Whether the windows before this batch already cost more than the budget: ``fit`` then leaves out
        every pattern of this batch's windows, whatever the heads' order."""
        if self.max_bytes is None:
            return False
        return sum(size for w, size in self.window_bytes.items() if w < self.batch_start) > self.max_bytes

    # ---- the five state methods: this probe runs once, in its own pass; a retry rolls back its batch ----
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to load: the explorer's pass is never resumed (it runs after the measurement)."""

    def snapshot(self) -> dict:
        return {"p0_sum": self.p0_sum.copy(), "p0_count": self.p0_count.copy(),
                "patterns": {key: dict(windows) for key, windows in self.patterns.items()},
                "window_bytes": dict(self.window_bytes), "tops": list(self.tops), "ranked": self.ranked,
                "windows_read": self.windows_read, "deferred": dict(self.deferred)}

    def restore(self, snapshot: dict) -> None:
        self.p0_sum, self.p0_count = snapshot["p0_sum"].copy(), snapshot["p0_count"].copy()
        self.patterns = {key: dict(windows) for key, windows in snapshot["patterns"].items()}
        self.window_bytes = dict(snapshot["window_bytes"])
        self.tops, self.ranked, self.windows_read = list(snapshot["tops"]), snapshot["ranked"], snapshot["windows_read"]
        self.deferred = dict(snapshot["deferred"])

    def end_batch(self) -> None:
        """auto: the top set is final once the first batch that read explorer windows has run; the patterns of the
        heads it holds are read now from the records kept for them (only those heads' rows are ever computed), in
        the page's order (window by window, the heads as ``chosen`` orders them), so that once the budget is spent
        the rest keep their row counts only, as ``explorer_data.fit`` would leave them out."""
        if self.deferred:
            order = [key for key in self.chosen() if key in self.deferred]
            spent = sum(size for w, size in self.window_bytes.items() if w < self.batch_start)
            for b in range(next(iter(self.deferred.values())).batch_size):
                for layer, h in order:
                    window = self.batch_start + b
                    beyond = self.max_bytes is not None and spent > self.max_bytes
                    self._keep(layer, [h], self.deferred[(layer, h)].windows(b, b + 1), heads_of_record=[0],
                               first_window=window, beyond=beyond)
                    spent = sum(size for w, size in self.window_bytes.items() if w <= window)
            self.deferred.clear()
        if self.windows_read:
            self.ranked = True

    def merge(self, other: "Probe") -> None:
        raise NotImplementedError("the explorer runs in one process (forward/explorer_pass.py); its patterns are not merged")

    def rows(self) -> list:
        return []

    # ---- reading a layer -----------------------------------------------------------------------------
    def _heads_here(self, layer: int, H: int) -> list[int]:
        """The heads of ``layer`` whose patterns this batch keeps (auto: updating the running top set)."""
        if self.kind != "auto":
            return [h for h in range(H) if self.kind == "all" or (layer, h) in self.asked]
        if not self.ranked:  # the first batch: rank this layer's heads into the running top set
            p0 = self.p0()
            candidates = self.tops + [(layer, h) for h in range(H) if (layer, h) not in self.sampled]
            self.tops = sorted(candidates, key=lambda key: (-p0[key], key))[:AUTO_TOP]
            for store in (self.patterns, self.deferred):
                for key in [key for key in store if key not in self.tops and key not in self.sampled]:
                    del store[key]  # pushed out of the top set: its rows are dropped
        keep = set(self.tops) | self.sampled
        return [h for h in range(H) if (layer, h) in keep]

    def chosen(self) -> dict[tuple[int, int], str] | None:
        """auto: {(layer, head): "top" | "sample"} in the page's order (choose_heads's), else None."""
        if self.kind != "auto":
            return None
        p0 = self.p0()
        by_p0 = sorted(set(self.tops) | self.sampled, key=lambda key: (-p0[key], key))
        return {**{key: "top" for key in by_p0 if key not in self.sampled},
                **{key: "sample" for key in by_p0 if key in self.sampled}}

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        if self.windows:  # only the explorer's windows: the first ``windows`` of the run
            n = min(record.batch_size, self.windows - self.batch_start)
            if n <= 0:
                return
            if n < record.batch_size:
                record = record.first_windows(n)
            self.windows_read = max(self.windows_read, self.batch_start + n)
        else:
            self.windows_read = max(self.windows_read, self.batch_start + record.batch_size)
        p0 = record.key_mass(0)[:, :, 1:]  # (B, H, T - 1): w_q0 over real keys, queries q >= 1
        for per_window in p0.double().sum(dim=2).cpu().numpy():  # (H,) each: window by window, any batch size
            self.p0_sum[layer] += per_window
        self.p0_count[layer] += p0.shape[0] * p0.shape[2]
        H, self.seq_len = p0.shape[1], p0.shape[2] + 1
        heads = self._heads_here(layer, H)
        if not heads:
            return
        if self.kind == "auto" and not self.ranked and record.is_fused:
            # a candidate may still be pushed out: keep its record (one head: its q, k, v rows, not a pattern)
            for h in heads:
                self.deferred[(layer, h)] = record.one_head(h, copy=True)
            return
        self._keep(layer, heads, record)

    def _keep(self, layer: int, heads: list[int], record: AttentionRecord, heads_of_record: list[int] | None = None,
              first_window: int | None = None, beyond: bool | None = None) -> None:
        """Read and keep the patterns of ``heads`` of ``layer`` (``heads_of_record``: their indices in ``record``;
        ``first_window``: the run's index of the record's first window, default the batch's; ``beyond``: past the
        budget, default :meth:`_past_budget`)."""
        self.has_phantom = self.has_phantom or record.has_phantom
        self.has_value_norms = self.has_value_norms and record.value is not None
        beyond = self._past_budget() if beyond is None else beyond
        first = self.batch_start if first_window is None else first_window
        read = self._patterns(record, heads if heads_of_record is None else heads_of_record, entries=not beyond)
        for h, per_window in zip(heads, read):
            windows = self.patterns.setdefault((layer, h), {})
            for b, pattern in enumerate(per_window):
                window = first + b
                windows[window] = pattern
                if self.max_bytes is not None and not beyond:
                    self.window_bytes[window] = self.window_bytes.get(window, 0) + block_size(
                        pattern["indptr"], pattern["value_norms"], pattern["phantom"], pattern["keys"],
                        pattern["codes"])

    def _patterns(self, record: AttentionRecord, heads: list[int], *, entries: bool = True) -> list[list[dict]]:
        """For each head, for each window of the batch: its kept entries, row counts, value norms and phantom mass.

        ``entries`` False: the row counts (``indptr``) only, no keys and codes (``"beyond": True``).
        """
        like = record.query if record.query is not None else record.weights
        B, H, T = like.shape[0], like.shape[1], like.shape[2]
        S = record.key.shape[-2] if record.key is not None else record.weights.shape[-1]
        k = len(heads)
        index = torch.tensor(heads, device=like.device)
        real = record.real_mass()[:, index]  # (B, k, T): 1 - phi
        if record.is_fused:
            lse = record.lse()[:, index]  # (B, k, T)
        # [b][i]: one (queries, keys, weights) per query block, or (entries per row, None, None) past the budget
        found: list[list[list]] = [[[] for _ in range(k)] for _ in range(B)]
        step = min(BLOCK_ROWS, max(1, BLOCK_BYTES // (4 * B * k * S)))  # causal: smaller blocks skip more of S
        for first in range(0, T, step):
            rows = slice(first, min(T, first + step))
            keys = slice(0, min(S, rows.stop + S - T))  # causal: query i sees keys j <= i + S - T
            n = rows.stop - rows.start
            if record.is_fused:  # a_qj = exp(s_qj - LSE_q) (1 - phi_q) >= t  <=>  s_qj >= LSE_q + log t - log(1 - phi_q)
                logits = record.row_logits(rows, heads=index, keys=keys, causal=False)  # (B, k, n, K)
                shift = lse[:, :, rows]  # (B, k, n)
                bound = shift + math.log(self.threshold) - torch.log(real[:, :, rows]) - LOG_SLACK  # (B, k, n)
                candidates = logits >= bound.unsqueeze(-1)  # (B, k, n, K)
                if record.mask is None:  # the causal (and window) part was left unfilled: hidden keys go here
                    positions = torch.arange(first, rows.stop, device=like.device).unsqueeze(-1) + (S - T)  # (n, 1)
                    candidates &= ~hidden_keys(positions, torch.arange(keys.stop, device=like.device).unsqueeze(0),
                                               record.sliding_window)  # (n, K) over every window and head
                where = candidates.nonzero()  # (m, 4) candidates: b, i, q, j row-major
                del candidates
                b_, i_, q_, j_ = where.unbind(1)
                values = torch.exp(logits[b_, i_, q_, j_] - shift[b_, i_, q_]) * real[:, :, rows][b_, i_, q_]  # (m,)
                del logits
            else:
                a = record.weights[:, index, rows, keys].float()  # (B, k, n, K)
                where = (a >= self.threshold).nonzero()  # (m, 4)
                b_, i_, q_, j_ = where.unbind(1)
                values = a[b_, i_, q_, j_]  # (m,)
                del a
            exact = values >= self.threshold  # (m,): the candidates that are kept (the slack's extra ones are not)
            owner = ((b_ * k + i_) * n + q_)[exact].cpu().numpy()  # (m',) the (window, head, row) of each entry
            per_row = np.bincount(owner, minlength=B * k * n).reshape(B, k, n)  # entries of each row
            if entries:  # row-major order per (window, head): queries ascending, keys ascending within a row
                queries = (q_[exact] + first).to(torch.int32).cpu().numpy()
                keys_kept = j_[exact].to(torch.int32).cpu().numpy()
                kept_values = values[exact].float().cpu().numpy()
                bounds = np.cumsum(per_row.sum(-1).reshape(-1))[:-1]  # (B k - 1,) where each (window, head) ends
                pieces = zip(*(np.split(part, bounds) for part in (queries, keys_kept, kept_values)))
                for j, piece in enumerate(pieces):
                    found[j // k][j % k].append(piece)
            else:
                for b in range(B):
                    for i in range(k):
                        found[b][i].append((per_row[b, i], None, None))
            del where, values, exact
        phantom = (1 - real).float().cpu().numpy()  # (B, k, T)
        if record.value is not None:
            groups = H // record.n_kv_heads
            norms = record.value_norms()[:, index // groups].cpu().numpy()  # (B, k, S)
        else:
            norms = np.zeros((B, k, S), np.float32)
        out = []
        for i in range(k):
            per_window = []
            for b in range(B):
                parts = found[b][i]
                pattern = {"value_norms": norms[b, i, :T].astype(np.float32),
                           "phantom": phantom[b, i].astype(np.float32)}
                if entries:
                    queries = np.concatenate([p[0] for p in parts])  # (m,)
                    values = np.concatenate([p[2] for p in parts])  # (m,) float32
                    pattern["keys"] = np.concatenate([p[1] for p in parts]).astype(np.int32)
                    pattern["codes"] = np.minimum(np.rint(values.astype(np.float64) / SCALE), 65535).astype(np.uint16)
                    counts = np.bincount(queries, minlength=T)  # (T,)
                else:
                    counts = np.concatenate([p[0] for p in parts])  # (T,)
                    pattern["beyond"] = True
                pattern["indptr"] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (T + 1,)
                per_window.append(pattern)
            out.append(per_window)
        return out

    # ---- what the run keeps ----------------------------------------------------------------------------
    def p0(self) -> np.ndarray:
        """(L, H) float64: each head's position-0 mass on the windows read (NaN: a layer without attention)."""
        out = np.full(self.p0_sum.shape, np.nan)
        seen = self.p0_count > 0
        out[seen] = self.p0_sum[seen] / self.p0_count[seen]
        return out

    def data(self, labels: dict[int, list[str]], chosen: dict[tuple[int, int], str] | None = None) -> ExplorerData | None:
        """The kept patterns as :class:`ExplorerData`, or None.

        ``labels``: each stored window's token strings; ``chosen``: why each head was kept (default:
        this probe's kind). Heads are ordered as ``chosen`` names them, else by p0, highest first.
        """
        if not self.patterns:
            return None
        p0 = self.p0()
        keys_order = list(chosen) if chosen else sorted(self.patterns, key=lambda key: -p0[key])
        order = [key for key in keys_order if key in self.patterns]
        why = chosen or {key: self.kind for key in order}
        windows = sorted({w for key in order for w in self.patterns[key]})
        T = self.seq_len
        W, K = len(windows), len(order)
        blocks = np.full((W, K, 2), -1, np.int64)
        indptr = np.zeros((W, K, T + 1), np.int64)
        norms = np.zeros((W, K, T), np.float32)
        phantom = np.zeros((W, K, T), np.float32)
        keys, codes, beyond, at = [], [], [], 0
        for w, window in enumerate(windows):
            for k, key in enumerate(order):
                pattern = self.patterns[key].get(window)
                if pattern is None:
                    continue
                indptr[w, k], norms[w, k], phantom[w, k] = pattern["indptr"], pattern["value_norms"], pattern["phantom"]
                if pattern.get("beyond"):  # read past the budget: fit leaves it out
                    beyond.append((w, k))
                    continue
                n = len(pattern["keys"])
                blocks[w, k] = (at, at + n)
                keys.append(pattern["keys"])
                codes.append(pattern["codes"])
                at += n
        return ExplorerData(
            heads=np.array(order, np.int32).reshape(K, 2),
            chosen=np.array([why[key] for key in order]),
            windows=np.array(windows, np.int64),
            labels=label_array([labels[w] for w in windows], T),
            blocks=blocks, indptr=indptr,
            keys=np.concatenate(keys) if keys else np.zeros(0, np.int32),
            codes=np.concatenate(codes) if codes else np.zeros(0, np.uint16),
            value_norms=norms, phantom=phantom, p0=p0.astype(np.float32), threshold=self.threshold, scale=SCALE,
            has_phantom=self.has_phantom, has_value_norms=self.has_value_norms, beyond=beyond)
