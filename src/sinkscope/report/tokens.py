"""The report's token tables: per-token rows (``token_gate``, a ``token_id`` column) as ranked tables.

Instead of figures, each run gets the most and least attenuated tokens (lowest and highest mean
gate) among those seen at least ``min_count`` times (the run's ``token_share`` option, 50 by
default); with too few such tokens the tables rank every token seen, and say so.
"""

from __future__ import annotations

import json

import pandas as pd

from sinkscope.report.page import Page, fmt
from sinkscope.report.runs import RunData

#: rows per token table (most and least attenuated).
TOKEN_TABLE_ROWS = 15


# ---- the section protocol (page.py) ------------------------------------------------------------------


def handles(probe: str, metric: str, runs: list[RunData]) -> bool:
    """Per-token rows: the metric carries a ``token_id`` in some run."""
    return _is_token_metric(runs, metric)


def entry(page: Page, metric: str) -> dict:
    return {"metric": metric, "info": page.info(metric), "note": None, "figures": [], "table": None,
            "token_tables": [_token_tables(r, metric) for r in page.runs]}


def note(probe: str, metrics: list[str]) -> str | None:
    return None


def tables(page: Page, probe: str) -> list[dict]:
    return []


# ---- the tables --------------------------------------------------------------------------------------


def _is_token_metric(runs: list[RunData], metric: str) -> bool:
    """Per-token rows (``token_gate``): they carry a ``token_id`` and are shown as token tables."""
    for run in runs:
        if "token_id" in run.table.columns:
            rows = run.table[run.table.metric == metric]
            if len(rows) and rows["token_id"].notna().any():
                return True
    return False


def _min_count(run: RunData) -> int:
    """The run's token threshold (the ``token_share`` probe's ``min_count``; 50 by default)."""
    probe = (run.manifest.get("probes") or {}).get("token_share") or {}
    value = (probe.get("options") or {}).get("min_count")
    return int(value) if isinstance(value, (int, float)) and value >= 1 else 50


def _token_text(row) -> str:
    """A token as the table shows it: its decoded text, quoted with escapes (``"\\n"``, ``" the"``)."""
    text = row.get("token") if hasattr(row, "get") else None
    if text is None or pd.isna(text):
        return f"id {int(row['token_id'])}"
    return json.dumps(str(text), ensure_ascii=False)


def _token_tables(run: RunData, metric: str) -> dict:
    """The most and least attenuated tokens of one run: lowest and highest mean gate among frequent tokens."""
    rows = run.table[(run.table.metric == metric) & run.table["token_id"].notna()]
    threshold = _min_count(run)
    frequent = rows[rows["n"] >= threshold]
    note = None
    if frequent.empty:
        note = (f"No token occurs {threshold} times or more in this run's {int(rows['n'].sum())} positions; the "
                "tables rank every token seen (add windows with --n-seqs for steadier means).")
        frequent = rows
    elif len(frequent) < 2 * TOKEN_TABLE_ROWS:
        note = f"Only {len(frequent)} tokens occur {threshold} times or more; the two tables overlap."
    ordered = frequent.sort_values(["value", "token_id"], kind="stable")
    columns = ["rank", "token", "id", "count", "mean gate"]

    def body(part: pd.DataFrame) -> list[list[str]]:
        return [[str(k + 1), _token_text(r), str(int(r["token_id"])), str(int(r["n"])), fmt(r["value"])]
                for k, (_, r) in enumerate(part.iterrows())]

    return {"label": run.label, "threshold": threshold, "note": note, "n_tokens": len(rows),
            "most": {"columns": columns, "rows": body(ordered.head(TOKEN_TABLE_ROWS))},
            "least": {"columns": columns, "rows": body(ordered.iloc[::-1].head(TOKEN_TABLE_ROWS))}}
