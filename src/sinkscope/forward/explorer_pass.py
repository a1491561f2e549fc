"""The explorer's patterns: kept as the measurement reads its first windows, or in a pass of their own.

``rider(...)`` makes the ``explorer`` probe (``probes/explorer.py``) that the run adds to the
measuring forward (issue 56, item 2): it reads the first ``--explore-windows`` windows of
tokens.npy as they are measured, under the same attention capture, so the explorer costs no pass of
its own; ``Rider.package`` fits what it kept to the page. Where it cannot ride (a resumed run, whose
first windows an earlier process measured; several processes) the run says so in one line and
``explore(...)`` runs the probe alone over those windows, in batches of ``--batch-size`` (the stored
result does not depend on it). Either way the windows' tokens are decoded for the page's labels and
what fits the page's budget is kept (``explorer_data.fit``: ``--explore-max-mb``): the probe stops
keeping entries once the windows read cost more than the budget (``Explorer.keep_within``), so
memory follows the budget and one batch, not the number of windows and heads. The result is the data
and the manifest's ``explorer`` record, or None where there is nothing to explore:

    --explore-heads none or --explore-windows 0     asked for nothing
    a command that reads its windows its own way     ``stream`` (a bounded cache, not one forward pass)

``auto`` ranks the heads as the layers arrive, by the position-0 mass of the explorer's windows in
the first batch (``Explorer``; ``explorer_data.choose_heads``'s rule); the second pass ranks them by
the run's own per-head ``p0_mass`` where the command measured it. The measurement's numbers do not
depend on the explorer (the probe reads records and writes no row).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from sinkscope.store.explorer_format import (
    THRESHOLD,
    ExplorerData,
    check_max_mb,
    choose_heads,
    fit,
    label_array,
    labels_size,
    parse_heads,
)


def token_labels(tokenizer, ids: np.ndarray) -> list[str]:
    """Each token as the tokenizer writes it alone (special tokens kept, no clean-up); ids without a tokenizer."""
    if tokenizer is None:
        return [str(int(i)) for i in ids]
    return list(tokenizer.batch_decode([[int(i)] for i in ids], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False))


#: windows per forward pass where the caller names no ``--batch-size``.
DEFAULT_BATCH = 1
#: the manifest's ``explorer.ranked_by`` for ``auto`` heads ranked as the layers arrive.
RANKED_ON_WINDOWS = "position-0 mass on the explorer's windows"
RANKED_BY_RUN = "the run's p0_mass"


class Rider:
    """The explorer probe that rides the measuring forward (issue 56, item 2), with what packaging it needs."""

    def __init__(self, probe, labels: dict[int, list[str]], heads: str, max_mb: float | None):
        self.probe, self.labels, self.heads, self.max_mb = probe, labels, heads, max_mb

    def package(self, log: Callable[[str], None]) -> tuple[ExplorerData, dict] | None:
        """The kept patterns as the run's explorer (data, manifest record), or None when it kept none."""
        ranked = RANKED_ON_WINDOWS if self.probe.kind == "auto" else None
        return _package(self.probe, self.labels, self.probe.chosen(), heads=self.heads, max_mb=self.max_mb,
                        ranked_by=ranked, log=log)


def _labelled(tokenizer, tokens: np.ndarray, n: int) -> tuple[dict[int, list[str]], int]:
    """The first ``n`` windows' token strings, and what they cost the page."""
    labels = {w: token_labels(tokenizer, tokens[w]) for w in range(n)}
    return labels, labels_size(label_array([labels[w] for w in range(n)], tokens.shape[1]))


def _probe(spec, heads: str, n: int, seed: int, budget: float | None, labels_bytes: int):
    from sinkscope.probes import get_probe

    probe = get_probe("explorer")(spec, heads=heads, windows=n, seed=seed)
    probe.keep_within(None if budget is None else int(budget * 1e6), labels_bytes)
    return probe


def rider(spec, tokenizer, tokens: np.ndarray, *, heads: str, windows: int, max_mb: float | None,
          seed: int) -> Rider | None:
    """The explorer probe for the measuring forward: it reads the first ``windows`` windows as they are measured,
    so no pass runs for the explorer alone; None when there is nothing to explore. Its ``announcement`` is the
    line the run prints when it starts measuring."""
    kind, _ = parse_heads(heads)
    budget = check_max_mb(max_mb)
    n = min(int(windows), len(tokens))
    if kind == "none" or n <= 0:
        return None
    labels, labels_bytes = _labelled(tokenizer, tokens, n)
    probe = _probe(spec, heads, n, seed, budget, labels_bytes)
    probe.announcement = (f"Keeping attention patterns for the explorer as the first {n} window"
                          f"{'s' if n != 1 else ''} are measured, heads {heads}.")
    return Rider(probe, labels, heads, max_mb)


def explore(model, tokenizer, spec, tokens: np.ndarray, *, heads: str, windows: int, max_mb: float | None,
            seed: int, attention: str, device, log: Callable[[str], None],
            run_p0: np.ndarray | None = None, batch_size: int | None = None) -> tuple[ExplorerData, dict] | None:
    """Run the explorer's own pass over ``tokens[:windows]``; (data, manifest record) or None (see the module).

    ``run_p0``: the measurement's own per-head ``p0_mass`` (L, H) where it has one (NaN elsewhere);
    ``auto`` then ranks the heads by it; otherwise ``auto`` ranks them as the layers arrive, by the
    position-0 mass of the windows of the first batch. One pass either way. ``batch_size``: windows
    per forward pass (the run's ``--batch-size``; :data:`DEFAULT_BATCH` when None).
    """
    from sinkscope.forward.runner import run_probes

    kind, _ = parse_heads(heads)
    budget = check_max_mb(max_mb)  # MB, or None
    n = min(int(windows), len(tokens))
    if kind == "none" or n <= 0:
        return None
    batch = max(1, min(n, int(batch_size or DEFAULT_BATCH)))
    labels, labels_bytes = _labelled(tokenizer, tokens, n)
    log(f"Keeping attention patterns for the explorer: {n} window{'s' if n != 1 else ''}, heads {heads} ...")
    chosen, ranked_by, rule = None, None, heads
    if kind == "auto" and run_p0 is not None:  # the run's p0_mass names the heads
        chosen, ranked_by = choose_heads(run_p0, seed), RANKED_BY_RUN
        rule = ",".join(f"{l}.{h}" for l, h in chosen)
    elif kind == "auto":
        ranked_by = RANKED_ON_WINDOWS
    probe = _probe(spec, rule, n, seed, budget, labels_bytes)
    run_probes(model, tokens[:n], [probe], batch_size=batch, device=device, progress=False, attention=attention,
               log=log)
    return _package(probe, labels, chosen or probe.chosen(), heads=heads, max_mb=max_mb, ranked_by=ranked_by, log=log)


def _package(probe, labels: dict[int, list[str]], chosen, *, heads: str, max_mb: float | None,
             ranked_by: str | None, log: Callable[[str], None]) -> tuple[ExplorerData, dict] | None:
    """The probe's patterns fitted to the page's budget, and the manifest's ``explorer`` record."""
    budget = check_max_mb(max_mb)
    data = probe.data(labels, chosen)
    if data is None:
        return None
    stored = len(data.kept()) + len(data.beyond)
    data, used = fit(data, None if budget is None else int(budget * 1e6))
    record = {
        "heads": [[int(l), int(h)] for l, h in data.heads],
        "chosen": [str(c) for c in data.chosen],
        "windows": [int(w) for w in data.windows],
        "patterns_kept": len(data.kept()),
        "patterns_left_out": stored - len(data.kept()),
        "left_out": [list(x) for x in data.left_out],
        "page_bytes": used,
        "max_mb": max_mb,
        "threshold": THRESHOLD,
        "precision": f"weights below {data.threshold:g} not kept; the rest as uint16 codes of 1/65535 "
                     f"(error <= {data.scale / 2:.1e} against the model's computed weights)",
        "heads_rule": heads,
        "ranked_by": ranked_by,
    }
    if record["patterns_left_out"]:
        log(f"note: the explorer keeps {record['patterns_kept']} of {stored} patterns to stay within "
            f"--explore-max-mb {max_mb:g}.")
    return data, record


def p0_by_head(table, n_layers: int, n_heads: int):
    """A run's per-head ``p0_mass`` rows as an (L, H) array (NaN where it has none), or None without such rows:
    the ranking the explorer keeps its heads by, so no second pass is needed to rank them."""
    import numpy as np

    rows = table[(table.metric == "p0_mass") & table.layer.notna() & table["head"].notna()]
    if rows.empty or rows.duplicated(["layer", "head"]).any():
        return None
    p0 = np.full((n_layers, n_heads), np.nan)  # (L, H)
    p0[rows.layer.astype(int).to_numpy(), rows["head"].astype(int).to_numpy()] = rows["value"].to_numpy(dtype=float)
    return p0
