"""``comparison.json``: which runs a comparison's folder holds, in order, and how its page draws them.

Written by the comparison (``run/comparison.py``) before its runs start, so ``sinkscope report OUT``
redraws the page of a comparison (its runs in their order, their labels, ``group_by``) however
its runs were executed or resumed. Plain JSON: reading it runs nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from sinkscope.errors import SinkscopeError

RECORD = "comparison.json"


def write_comparison_record(parent: Path, runs: list[str], labels: list[str] | None, group_by: str | None,
                            series: bool) -> None:
    """Record the comparison's runs (folder names under ``parent``), labels, grouping and kind."""
    from sinkscope.store.files import atomic_write_text

    record = {"runs": list(runs), "labels": None if labels is None else list(labels), "group_by": group_by,
              "series": bool(series)}
    atomic_write_text(Path(parent) / RECORD, json.dumps(record, indent=1) + "\n")


def read_comparison_record(folder: Path) -> dict | None:
    """The record of a comparison folder, or None when ``folder`` holds none (a run, a report)."""
    from sinkscope.store.files import read_json

    path = Path(folder) / RECORD
    if not path.is_file():
        return None
    record = read_json(path, "the comparison's record")
    runs = record.get("runs") if isinstance(record, dict) else None
    if not (isinstance(runs, list) and runs and all(isinstance(r, str) and r and "/" not in r and r not in (".", "..")
                                                     for r in runs)):
        raise SinkscopeError(f"{path} is not a comparison's record (no list of its runs' folders).")
    labels = record.get("labels")
    if labels is not None and not (isinstance(labels, list) and len(labels) == len(runs)
                                   and all(isinstance(x, str) for x in labels)):
        labels = None
    group_by = record.get("group_by") if isinstance(record.get("group_by"), str) else None
    return {"runs": runs, "labels": labels, "group_by": group_by, "series": bool(record.get("series"))}
