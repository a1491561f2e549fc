"""The explorer's patterns: a few heads' attention on a few windows, sparse (SPEC.md "The explorer").

Not a metric: the pipeline runs this probe alone, in an extra forward pass over the first
``--explore-windows`` windows, after the measurement (``forward/explorer_pass.py``), and writes what it
keeps to ``explorer.npz`` (``store/explorer_format.py``) for the report's interactive view.

Per layer it reads the attention record and keeps, for each head of ``heads`` and each window,

    a_qj      the weight the model's eager attention returns (over real keys, any learned phantom
              in the normaliser: a_qj = exp(s_qj - LSE_q) (1 - phi_q) on a fused record), where
              a_qj >= threshold, as uint16 codes of 1 / 65,535
    ||v_j||   the norm of the head's value at each key (its KV head's under GQA)
    phi_q     the phantom mass (learned-sink models), 1 - sum_j a_qj

and, for every head, its position-0 mass p0 = mean over queries q >= 1 of w_q0 (SPEC.md
"Position-0 mass") on these windows, summed window by window (the same float64 additions at any
batch size): ``heads="none"`` keeps only that, the first of ``auto``'s two passes
(``explorer_data.choose_heads`` then names the heads of the second). ``all`` keeps every head,
``L.H,...`` the heads named. Rows are walked in query blocks of at most :data:`BLOCK_BYTES` of
logits, each over the keys its queries can see, for the kept heads only: no (T, S) matrix of every
head is made on the fused path. Each (window, head)'s kept entries are found in its own slice of
the block and move to the host as each layer is read (this pass exists only to keep them).

Memory follows the page's budget (:meth:`Explorer.keep_within`): the page keeps patterns window by
window until its budget is spent (``explorer_data.fit``), so once the windows read in earlier
batches already cost more than the budget, a later batch's patterns keep only their row counts,
value norms and phantom mass (what the file holds for a pattern left out), not their entries.
"""

from __future__ import annotations

import numpy as np
import torch

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.store.explorer_format import SCALE, THRESHOLD, ExplorerData, block_size, label_array, parse_heads
from sinkscope.probes.base import Param, Probe, observes, register_probe

#: query blocks hold at most this many bytes of float32 logits (all heads of the batch).
BLOCK_BYTES = 64 << 20


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
), metrics={}, summary="keeps a few heads' attention patterns for the report's explorer (no metric)")
class Explorer(Probe):
    """Sparse attention patterns of chosen heads, for the report's explorer (no rows)."""

    reads_weights_only = True  # the eager fallback's weights suffice (no value norms then)

    def setup(self) -> None:
        self.kind, asked = parse_heads(self.heads)
        if self.kind == "auto":
            raise ValueError("the explorer probe takes all, none or named heads; auto is explore_pass's two passes")
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
                "window_bytes": dict(self.window_bytes)}

    def restore(self, snapshot: dict) -> None:
        self.p0_sum, self.p0_count = snapshot["p0_sum"].copy(), snapshot["p0_count"].copy()
        self.patterns = {key: dict(windows) for key, windows in snapshot["patterns"].items()}
        self.window_bytes = dict(snapshot["window_bytes"])

    def merge(self, other: "Probe") -> None:
        raise NotImplementedError("the explorer runs in one process (forward/explorer_pass.py); its patterns are not merged")

    def rows(self) -> list:
        return []

    # ---- reading a layer -----------------------------------------------------------------------------
    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        p0 = record.key_mass(0)[:, :, 1:]  # (B, H, T - 1): w_q0 over real keys, queries q >= 1
        for per_window in p0.double().sum(dim=2).cpu().numpy():  # (H,) each: window by window, any batch size
            self.p0_sum[layer] += per_window
        self.p0_count[layer] += p0.shape[0] * p0.shape[2]
        H, self.seq_len = p0.shape[1], p0.shape[2] + 1
        heads = [h for h in range(H) if self.kind == "all" or (layer, h) in self.asked]
        if not heads:
            return
        self.has_phantom = self.has_phantom or record.has_phantom
        self.has_value_norms = self.has_value_norms and record.value is not None
        beyond = self._past_budget()
        for h, per_window in zip(heads, self._patterns(record, heads, entries=not beyond)):
            windows = self.patterns.setdefault((layer, h), {})
            for b, pattern in enumerate(per_window):
                window = self.batch_start + b
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
        step = max(1, BLOCK_BYTES // (4 * B * k * S))
        for first in range(0, T, step):
            rows = slice(first, min(T, first + step))
            keys = slice(0, min(S, rows.stop + S - T))  # causal: query i sees keys j <= i + S - T
            if record.is_fused:  # a_qj = exp(s_qj - LSE_q) (1 - phi_q)
                logits = record.row_logits(rows, heads=index, keys=keys)  # (B, k, n, K)
                a = torch.exp(logits - lse[:, :, rows].unsqueeze(-1)) * real[:, :, rows].unsqueeze(-1)
                del logits
            else:
                a = record.weights[:, index, rows, keys].float()  # (B, k, n, K)
            kept = a >= self.threshold  # (B, k, n, K)
            if entries:  # one array per block for the (window, head) pieces: few long-lived allocations
                counts = kept.sum(dim=(-2, -1)).reshape(-1).cpu().numpy()  # (B k,) entries of each (window, head)
                block = [np.empty(int(counts.sum()), dtype) for dtype in (np.int32, np.int32, np.float32)]  # q, j, a_qj
                at = 0
                for b in range(B):
                    for i in range(k):
                        where = kept[b, i].nonzero()  # (m, 2) row-major: query, key (keys ascending per row)
                        m = where.shape[0]
                        block[0][at:at + m] = (where[:, 0] + first).cpu().numpy()
                        block[1][at:at + m] = where[:, 1].cpu().numpy()
                        block[2][at:at + m] = a[b, i][kept[b, i]].cpu().numpy()
                        at += m
                bounds = np.cumsum(counts)[:-1]  # (B k - 1,) where each (window, head) ends
                for j, piece in enumerate(zip(*(np.split(part, bounds) for part in block))):
                    found[j // k][j % k].append(piece)
            else:
                per_row = kept.sum(dim=-1).cpu().numpy()  # (B, k, n) entries of each row
                for b in range(B):
                    for i in range(k):
                        found[b][i].append((per_row[b, i], None, None))
            del kept
            del a
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
