"""The toy superposition task (SPEC.md "The toy superposition task"; seed 000 appendix "Construction").

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
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sinkscope.errors import SinkscopeError

D = 64  # feature dimension d
VARIANTS = ("baseline", "offbyone", "normgate", "oracle")
CONDITIONS = ("blind", "visible")
TAG_BANK = 4096  # random tag vectors the channel-blind keys are drawn from
CONDITION_LABELS = {"blind": "channel-blind keys", "visible": "routing-visible keys"}


@dataclass
class ToyOptions:
    """Everything ``sinkscope toy`` takes (defaults: seed 000's construction)."""

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
    threads: int | None = None  # torch threads; None = torch's default
    overwrite: bool = False  # replace the toy task's earlier output in `out` (never a folder holding other files)


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
        import torch

        T, R = self.n_items, self.n_relevant
        relevant = torch.rand(n, T, generator=items_gen) < self.p_relevant  # (n, T)
        rel_id = torch.randint(0, R, (n, T), generator=items_gen)  # (n, T)
        irr_id = torch.randint(R, self.n_features, (n, T), generator=items_gen)  # (n, T)
        ids = torch.where(relevant, rel_id, irr_id)  # (n, T)
        if condition == "blind":  # a random tag per item, drawn from its own stream: no content
            tags = torch.randint(0, self.tag_bank.shape[0], (n, T), generator=keys_gen)  # (n, T) rows of the bank
        elif condition == "visible":
            tags = None
        else:
            raise SinkscopeError(f"unknown toy condition {condition!r}; use {' or '.join(CONDITIONS)}.")
        targets = torch.zeros(n, R)  # (n, R)
        targets.scatter_add_(1, torch.where(relevant, ids, torch.zeros_like(ids)), relevant.float())
        return ToyBatch(ids, relevant, tags, (targets > 0).float())

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
    import torch
    import torch.nn.functional as F

    data = ToyData(load * D, seed, n_relevant=options.n_relevant, p_relevant=options.p_relevant,
                   n_items=options.n_items)
    torch.manual_seed(seed)
    models = {v: _module(v, D, options.n_relevant, options.beta) for v in options.variants}
    initial = next(iter(models.values())).state_dict()
    for model in models.values():  # one initialisation for every variant (the shared tensors)
        model.load_state_dict(initial, strict=False)
    optims = {v: torch.optim.Adam(m.parameters(), lr=options.lr) for v, m in models.items()}
    cell = f"{condition}-{load}-{seed}"
    items_gen = torch.Generator().manual_seed(hash_seed("items", cell))
    keys_gen = torch.Generator().manual_seed(hash_seed("keys", cell))
    for _ in range(options.steps):
        batch = data.sample(options.batch_size, items_gen, keys_gen, condition)
        for variant, model in models.items():
            loss = F.binary_cross_entropy_with_logits(model(data, batch), batch.targets)
            optims[variant].zero_grad(set_to_none=True)
            loss.backward()
            optims[variant].step()
    eval_items = torch.Generator().manual_seed(hash_seed("eval-items", cell))
    eval_keys = torch.Generator().manual_seed(hash_seed("eval-keys", cell))
    batch = data.sample(options.eval_seqs, eval_items, eval_keys, condition)
    targets = batch.targets
    rows = []
    with torch.no_grad():
        for variant, model in models.items():
            logits = model(data, batch)
            rows.append({"condition": condition, "load": load, "variant": variant, "seed": seed,
                         "error": float(F.binary_cross_entropy_with_logits(logits, targets)),
                         "label_error": float(((logits > 0).float() != targets).float().mean())})
    return rows


def hash_seed(*parts) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:6], "little")


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard error over seeds per (condition, load, variant), and the headroom closed."""
    from sinkscope.paired import mean_se

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
    from sinkscope.fileio import check_not_cwd, check_replaceable, read_inventory

    out = Path(out)
    check_not_cwd(out, "the toy task replaces its folder whole: give it", "reports/toy")
    inventory = read_inventory(out) if out.is_dir() and not out.is_symlink() else None
    if inventory is not None and inventory["writer"] != TOY_WRITER:
        raise SinkscopeError(f"--out {out} was written by sinkscope's {inventory['writer'] or 'unknown'} writer, not by "
                             "the toy task; choose another --out.")
    check_replaceable(out, overwrite, kind="toy task", legacy=toy_legacy(out) if out.is_dir() else None,
                      hint="pass --overwrite to replace it")


def run_toy(options: ToyOptions, log=None) -> Path:
    """Every (condition, load, seed) cell; writes toy.csv, toy_summary.csv, toy.md and toy.png.

    The folder is written whole into a hidden sibling and swapped into place at the end
    (``fileio.replace_folder``): a crash leaves the old output or the new one. ``--out`` is
    checked first (:func:`check_toy_dir`) and locked for the whole run.
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
    out = Path(options.out)
    check_toy_dir(out, options.overwrite)
    from sinkscope.fileio import lock_folder

    with lock_folder(out, kind="toy", writer="toy run"):
        check_toy_dir(out, options.overwrite)  # under the lock
        _run_toy(options, out, log)
    log(f"wrote {out / 'toy.md'}")
    return out / "toy.md"


def _run_toy(options: ToyOptions, out: Path, log) -> None:
    import shutil
    import tempfile

    from sinkscope.fileio import default_folder_mode, replace_folder, write_inventory

    rows = []
    for condition in options.conditions:
        for load in options.loads:
            for seed in options.seeds:
                with torch_threads(options.threads):
                    cell = train_cell(options, condition, load, seed)
                rows += cell
                log(f"{condition} load {load} seed {seed}: "
                    + ", ".join(f"{r['variant']} {r['error']:.4f}" for r in cell))
    frame = pd.DataFrame(rows)
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
    from sinkscope.fileio import atomic_write_text

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
            se = "" if math.isnan(r.se) else f" ± {r.se:.4f}"
            closed = "–" if math.isnan(r.headroom_closed) else f"{100 * r.headroom_closed:.0f}%"
            lines.append(f"| {r.load} | {r.variant} | {r.error:.4f}{se} | {r.label_error:.4f} | {closed} |")
        lines.append("")
    atomic_write_text(out / "toy.md", "\n".join(lines))
    _figure(summary, out / "toy.png")


def _figure(summary: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conditions = list(dict.fromkeys(summary["condition"]))
    fig, axes = plt.subplots(2, len(conditions), figsize=(4.2 * len(conditions), 6.0), squeeze=False)
    for col, condition in enumerate(conditions):
        part = summary[summary.condition == condition]
        for variant, group in part.groupby("variant", sort=False):
            x = np.log2(group["load"].to_numpy(dtype=float))  # loads 1, 2, 4, 8 evenly spaced
            axes[0, col].errorbar(x, group["error"], yerr=group["se"].fillna(0.0), marker="o",
                                  capsize=3, label=variant)
            if variant not in ("baseline", "oracle"):
                axes[1, col].plot(x, 100 * group["headroom_closed"], marker="o", label=variant)
        axes[0, col].set_title(CONDITION_LABELS[condition], fontsize=9)
        axes[0, col].set_ylabel("held-out BCE per label (nats)")
        axes[1, col].set_ylabel("headroom closed (%)")
        axes[1, col].axhline(0.0, color="black", linewidth=0.8)
        loads = sorted(set(part["load"]))
        for ax in axes[:, col]:
            ax.set_xticks(np.log2(np.array(loads, dtype=float)), [str(load) for load in loads])
            ax.set_xlabel("load N / d")
        axes[0, col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
