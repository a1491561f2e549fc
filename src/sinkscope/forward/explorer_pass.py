"""The explorer's own forward pass: after a measurement, keep a few heads' patterns on its first windows.

``explore(...)`` runs the ``explorer`` probe (``probes/explorer.py``) alone over the first
``--explore-windows`` windows of tokens.npy in batches of ``--batch-size`` (the stored result does
not depend on it), under the same attention capture as the measurement (``--attention``), decodes
those windows' tokens for the page's labels, and keeps what fits the page's budget
(``explorer_data.fit``: ``--explore-max-mb``): the probe stops keeping entries once the windows
read cost more than the budget (``Explorer.keep_within``), so memory follows the budget and one
batch, not the number of windows and heads. It returns the data and the manifest's ``explorer``
record, or None where there is nothing to explore:

    --explore-heads none or --explore-windows 0     asked for nothing
    a command that reads its windows its own way     ``stream`` (a bounded cache, not one forward pass)

``auto`` ranks the heads by the run's own per-head ``p0_mass`` where the command measured it
(``sinks``, ``explore``, ``measure --probe p0_mass``): one forward pass over those windows, as for
named heads or ``all``. Other commands take two (every head's position-0 mass on the stored
windows first, then the chosen heads' patterns; ``explorer_data.choose_heads``). The
measurement's own passes are untouched: its numbers do not depend on the explorer.
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


def explore(model, tokenizer, spec, tokens: np.ndarray, *, heads: str, windows: int, max_mb: float | None,
            seed: int, attention: str, device, log: Callable[[str], None],
            run_p0: np.ndarray | None = None, batch_size: int | None = None) -> tuple[ExplorerData, dict] | None:
    """Run the explorer's pass over ``tokens[:windows]``; (data, manifest record) or None (see the module).

    ``run_p0``: the measurement's own per-head ``p0_mass`` (L, H) where it has one (NaN elsewhere);
    ``auto`` then ranks the heads by it, in one pass. ``batch_size``: windows per forward pass (the
    run's ``--batch-size``; :data:`DEFAULT_BATCH` when None).
    """
    from sinkscope.probes import get_probe
    from sinkscope.forward.runner import run_probes

    kind, _ = parse_heads(heads)
    budget = check_max_mb(max_mb)  # MB, or None
    n = min(int(windows), len(tokens))
    if kind == "none" or n <= 0:
        return None
    batch = max(1, min(n, int(batch_size or DEFAULT_BATCH)))
    labels = {w: token_labels(tokenizer, tokens[w]) for w in range(n)}
    labels_bytes = labels_size(label_array([labels[w] for w in range(n)], tokens.shape[1]))

    def read(heads_rule: str):
        probe = get_probe("explorer")(spec, heads=heads_rule)
        probe.keep_within(None if budget is None else int(budget * 1e6), labels_bytes)
        run_probes(model, tokens[:n], [probe], batch_size=batch, device=device, progress=False, attention=attention,
                   log=log)
        return probe

    log(f"Keeping attention patterns for the explorer: {n} window{'s' if n != 1 else ''}, heads {heads} ...")
    chosen = None
    if kind == "auto":  # the run's p0_mass, or first every head's p0 on these windows; then the chosen heads' patterns
        ranked_by = "the run's p0_mass" if run_p0 is not None else "position-0 mass on the stored windows"
        chosen = choose_heads(run_p0 if run_p0 is not None else read("none").p0(), seed)
        heads_rule = ",".join(f"{l}.{h}" for l, h in chosen)
    else:
        heads_rule = heads
    probe = read(heads_rule)
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
        "ranked_by": ranked_by if kind == "auto" else None,
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
