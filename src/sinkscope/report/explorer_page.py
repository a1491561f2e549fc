"""The report's interactive explorer: heads overview, a head's pattern, the text view (docs/explorer.md).

Reads what a run folder holds (``explorer.npz``, ``store/explorer_format.py``; the table for the heads
grid's metrics) and writes one self-contained HTML fragment: the data as JSON in a
``<script type="application/json">``, the stylesheet and the script of ``static/explorer/`` (vanilla
JavaScript and canvas, nothing fetched). The page API (``window.sinkscopeExplorer``) is the
script's; what the JSON holds is :func:`payload`'s.

    fragment(label, table, manifest, data)  -> the <section data-sinkscope-explorer> for report.html
    standalone(label, table, manifest, data) -> a whole page (``Result.show()``, ``sinkscope explore``)
"""

from __future__ import annotations

import html
import json
import math
from importlib import resources

import pandas as pd

from sinkscope.store.explorer_format import ExplorerData

#: what each ``chosen`` value means, for the page's note.
CHOSEN = {"top": "of highest position-0 mass", "sample": "drawn at random (--seed)",
          "asked": "named with --explore-heads", "all": "every head (--explore-heads all)"}


def _static(name: str) -> str:
    return resources.files("sinkscope.report").joinpath("static", name).read_text(encoding="utf-8")


def explorer_script() -> str:
    """The explorer's one inline script: ``static/explorer/*.js`` joined in name order inside one function
    (``_head.js`` opens it, ``_tail.js`` closes it), one file per view: utilities, the Explorer's shell,
    the data store, the page API, the heads grid, the pattern view, the pointer, the text view, the
    start. No build step; ``window.sinkscopeExplorer`` is the script's page API."""
    folder = resources.files("sinkscope.report").joinpath("static", "explorer")
    parts = sorted((entry.name, entry) for entry in folder.iterdir() if entry.name.endswith(".js")
                   and not entry.name.startswith("_"))
    read = lambda entry: entry.read_text(encoding="utf-8")  # noqa: E731
    return read(folder / "_head.js") + "".join(read(entry) for _, entry in parts) + read(folder / "_tail.js")


def _number(value) -> float | None:
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


def head_metrics(table: pd.DataFrame, manifest: dict, data: ExplorerData) -> list[dict]:
    """The heads grid's colourings: every metric with one value per (layer, head), p0_mass first.

    The explorer's own position-0 mass on the stored windows is always offered (last, or first
    when the table has no ``p0_mass``).
    """
    L, H = data.n_layers, data.n_heads
    infos = {metric: info for probe in (manifest.get("probes") or {}).values()
             for metric, info in (probe.get("metrics") or {}).items()}
    per_head = table[table.layer.notna() & table["head"].notna()]
    metrics = []
    for metric, rows in per_head.groupby("metric", sort=False):
        if rows.duplicated(["layer", "head"]).any():  # several conditions per head (doses, cutoffs): not one grid
            continue
        values = [[None] * H for _ in range(L)]
        for layer, head, value in zip(rows.layer.astype(int), rows["head"].astype(int), rows["value"]):
            if 0 <= layer < L and 0 <= head < H:
                values[layer][head] = _number(value)
        title = (infos.get(metric) or {}).get("title") or metric
        metrics.append({"name": str(metric), "label": title, "values": values})
    metrics.sort(key=lambda m: m["name"] != "p0_mass")
    own = [[_number(v) for v in row] for row in data.p0]
    metrics.append({"name": "p0_mass_stored_windows", "label": "Position-0 mass on the stored windows", "values": own})
    return metrics


def payload(label: str, table: pd.DataFrame, manifest: dict, data: ExplorerData) -> dict:
    """The JSON the page's script reads (``static/explorer/``; the block layout in ``store/explorer_format.py``)."""
    notes = [f"Weights below {data.threshold:g} are not stored (they read as 0); the others are held as multiples "
             f"of 1/65,535 (within {data.scale / 2:.1e} of the weight the model computed, in its own precision): "
             f"every weight shown is within {data.threshold:g} of the model's.",
             "Heads kept: " + "; ".join(f"{sum(1 for c in data.chosen if c == kind)} {CHOSEN[kind]}"
                                        for kind in CHOSEN if kind in set(map(str, data.chosen))) + "."]
    if data.left_out:
        shown = ", ".join(f"window {w} L{l}.H{h}" for w, l, h in data.left_out[:6])
        more = f" and {len(data.left_out) - 6} more" if len(data.left_out) > 6 else ""
        notes.append(f"Left out to keep the page small (--explore-max-mb): {shown}{more}.")
    return {
        "version": 1,
        "label": label,
        "n_layers": data.n_layers,
        "n_heads": data.n_heads,
        "metrics": head_metrics(table, manifest, data),
        "windows": [{"index": int(w), "tokens": [str(t) for t in data.labels[i]]} for i, w in enumerate(data.windows)],
        "heads": [{"layer": int(l), "head": int(h), "chosen": str(c)} for (l, h), c in zip(data.heads, data.chosen)],
        "blocks": [{"window": w, "head": k, "n": int(data.blocks[w, k, 1] - data.blocks[w, k, 0]),
                    "data": data.block_text(w, k)} for w, k in data.kept()],
        "weight_scale": data.scale,
        "threshold": data.threshold,
        "has_phantom": bool(data.has_phantom),
        "has_value_norms": bool(data.has_value_norms),
        "notes": notes,
    }


def _json_for_script(value: dict) -> str:
    """JSON safe inside <script>: <, > and & as \\u escapes (JSON.parse reads them back)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def fragment(label: str, table: pd.DataFrame, manifest: dict, data: ExplorerData, *, script: bool = True) -> str:
    """The explorer's <section> (data, stylesheet and, with ``script``, the script that draws it)."""
    data_json = _json_for_script(payload(label, table, manifest, data))
    parts = [f"<style>{_static('explorer.css')}</style>",
             f'<section class="sx-explorer" data-sinkscope-explorer="{html.escape(label, quote=True)}">'
             f'<script type="application/json" class="sx-data">{data_json}</script></section>']
    if script:
        parts.append(f"<script>{explorer_script()}</script>")
    return "\n".join(parts)


def standalone(label: str, table: pd.DataFrame, manifest: dict, data: ExplorerData) -> str:
    """A whole page holding only the explorer (notebooks' ``Result.show()``, ``sinkscope explore``)."""
    title = html.escape(f"sinkscope explorer: {label}")
    model = html.escape(str(((manifest.get("model") or {}).get("source") or {}).get("location") or ""))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            '<style>body{font:15px/1.45 -apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#1b1b1b;'
            'max-width:1180px;margin:0 auto;padding:1rem 1.5rem 3rem}</style></head><body>'
            f"<h1>{title}</h1><p>{model}</p>\n{fragment(label, table, manifest, data)}\n</body></html>\n")
