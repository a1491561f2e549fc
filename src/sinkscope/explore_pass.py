"""The explorer's own forward pass: after a measurement, keep a few heads' patterns on its first windows.

``explore(...)`` runs the ``explorer`` probe (``probes/explorer.py``) alone over the first
``--explore-windows`` windows of tokens.npy in one batch, under the same attention capture as the
measurement (``--attention``), decodes those windows' tokens for the page's labels, and keeps what
fits the page's budget (``explorer_data.fit``: ``--explore-max-mb``). It returns the data and the
manifest's ``explorer`` record, or None where there is nothing to explore:

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

from sinkscope.explorer_data import THRESHOLD, ExplorerData, choose_heads, fit, parse_heads


def token_labels(tokenizer, ids: np.ndarray) -> list[str]:
    """Each token as the tokenizer writes it alone (special tokens kept, no clean-up); ids without a tokenizer."""
    if tokenizer is None:
        return [str(int(i)) for i in ids]
    return list(tokenizer.batch_decode([[int(i)] for i in ids], skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False))


def explore(model, tokenizer, spec, tokens: np.ndarray, *, heads: str, windows: int, max_mb: float | None,
            seed: int, attention: str, device, log: Callable[[str], None],
            run_p0: np.ndarray | None = None) -> tuple[ExplorerData, dict] | None:
    """Run the explorer's pass over ``tokens[:windows]``; (data, manifest record) or None (see the module).

    ``run_p0``: the measurement's own per-head ``p0_mass`` (L, H) where it has one (NaN elsewhere);
    ``auto`` then ranks the heads by it, in one pass.
    """
    from sinkscope.probes import get_probe
    from sinkscope.runner import run_probes

    kind, _ = parse_heads(heads)
    n = min(int(windows), len(tokens))
    if kind == "none" or n <= 0:
        return None
    def read(heads_rule: str):
        probe = get_probe("explorer")(spec, heads=heads_rule)
        run_probes(model, tokens[:n], [probe], batch_size=n, device=device, progress=False, attention=attention,
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
    data = probe.data({w: token_labels(tokenizer, tokens[w]) for w in range(n)}, chosen)
    if data is None:
        return None
    stored = len(data.kept())
    data, used = fit(data, None if max_mb is None else int(max_mb * 1e6))
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
                     f"(error <= {data.scale / 2:.1e})",
        "heads_rule": heads,
        "ranked_by": ranked_by if kind == "auto" else None,
    }
    if record["patterns_left_out"]:
        log(f"note: the explorer keeps {record['patterns_kept']} of {stored} patterns to stay within "
            f"--explore-max-mb {max_mb:g}.")
    return data, record
