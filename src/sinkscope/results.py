"""The results table, the manifest and the run folder (atomic, never half-written).

A run folder holds:

    results.csv / results.parquet   tidy table: probe, metric, layer, head, value, n
    manifest.json                   what produced it (versions, model, corpus + hash, seed, BOS, options)
    tokens.npy                      int64 (n_seqs, seq_len): exactly the ids evaluated
    figures/                        heatmap_<metric>.{png,svg}, layers_<metric>.{png,svg}

``layer`` and ``head`` are nullable integers: an empty ``head`` marks a layer aggregate, empty
``layer`` and ``head`` a model aggregate. Condition columns follow ``n`` where a run has them:
those a probe adds to its rows (e.g. ``junk``, ``cutoff``, ``dose``) and those of the run
itself (``variant``, ``seed``, ``step``, ``tier`` for a trainer checkpoint); a plain ``sinks``
run of a Hugging Face model has none. The whole folder is written into a hidden sibling and
renamed into place at the end, so a crash leaves either no folder or a complete one.

This module is the table schema (``Row``, ``MetricInfo``) and imports neither torch nor any
probe, so the report can read runs without them.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd

from sinkscope.errors import SinkscopeError
from sinkscope.fileio import replace_folder

COLUMNS = ["probe", "metric", "layer", "head", "value", "n"]
#: bumped when the folder layout or table schema changes incompatibly (the report checks it).
RUN_FORMAT_VERSION = 1


@dataclass(frozen=True)
class MetricInfo:
    """What a metric means, for ``sinkscope ls``, the manifest and the report.

    Attributes:
        label: short human name (figure titles, table headers).
        unit: unit of the value (axis labels).
        formula: the definition in words and symbols (SPEC.md notation).
        source: where the definition comes from (SPEC.md section, paper).
        direction: how to read the value, e.g. "higher = more mass parked on position 0", or "".
        per: granularity of the finest rows: "layer x head", "layer x KV head", "layer" or "model".
    """

    label: str
    unit: str
    formula: str
    source: str
    direction: str = ""
    per: str = "layer x head"


@dataclass(frozen=True)
class Row:
    """One number of the tidy results table; ``None`` layer/head marks an aggregate.

    ``conditions`` are extra columns of this row, as ``((column, value), ...)`` (e.g.
    ``(("junk", "gaussian"), ("dose", 0.4))``); rows without them leave those columns empty.
    """

    probe: str
    metric: str
    layer: int | None
    head: int | None
    value: float
    n: int
    conditions: tuple[tuple[str, object], ...] = ()


def rows_to_frame(rows: Iterable[Row], run_conditions: dict | None = None) -> pd.DataFrame:
    """The tidy table with the schema's dtypes (nullable Int64 for layer and head).

    Columns: ``COLUMNS``, then the rows' condition columns in order of first appearance, then
    ``run_conditions`` (one value for every row, e.g. a checkpoint's variant and seed).
    """
    rows = list(rows)
    extra: list[str] = []
    for row in rows:
        extra += [key for key, _ in row.conditions if key not in extra]
    records = [(r.probe, r.metric, r.layer, r.head, r.value, r.n, *[dict(r.conditions).get(k) for k in extra])
               for r in rows]
    frame = pd.DataFrame.from_records(records, columns=COLUMNS + extra)
    frame = frame.astype({"probe": "string", "metric": "string", "layer": "Int64", "head": "Int64",
                          "value": "float64", "n": "int64"})
    for key, value in (run_conditions or {}).items():
        if key in frame.columns:
            raise SinkscopeError(f"the run condition {key!r} clashes with a column of the table.")
        frame[key] = pd.Series([value] * len(frame), dtype="string" if isinstance(value, str) else None)
    return frame


def condition_columns(frame: pd.DataFrame) -> list[str]:
    """The table's columns beyond ``COLUMNS`` (probe and run conditions), in order."""
    return [c for c in frame.columns if c not in COLUMNS]


def validate(frame: pd.DataFrame) -> None:
    """Check the columns and that every (probe, metric, layer, head, conditions...) appears once."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise SinkscopeError(f"results table lacks the columns {missing}.")
    keys = frame[["probe", "metric", "layer", "head", *condition_columns(frame)]].astype("string").fillna("")
    if keys.duplicated().any():
        raise SinkscopeError("results table has duplicate (probe, metric, layer, head) rows.")


def read_results(run_dir: Path) -> pd.DataFrame:
    """Read a run's table (Parquet if present, else CSV) with the schema's dtypes."""
    run_dir = Path(run_dir)
    if (run_dir / "results.parquet").is_file():
        frame = pd.read_parquet(run_dir / "results.parquet")
    elif (run_dir / "results.csv").is_file():
        frame = pd.read_csv(run_dir / "results.csv")
    else:
        raise SinkscopeError(f"{run_dir} is not a sinkscope run folder (no results.csv).")
    return frame.astype({"layer": "Int64", "head": "Int64", "value": "float64", "n": "int64"})


# ---- manifest --------------------------------------------------------------------------------


def _git_hash() -> str | None:
    """The commit of the sinkscope checkout this code runs from, if it is one."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def versions() -> dict[str, str | None]:
    """Versions of everything that can change a number."""
    import importlib.metadata as md

    out: dict[str, str | None] = {"python": platform.python_version(), "platform": platform.platform()}
    for package in ["sinkscope", "torch", "transformers", "numpy", "pandas", "gguf", "tokenizers", "accelerate"]:
        try:
            out[package] = md.version(package)
        except md.PackageNotFoundError:
            out[package] = None
    out["sinkscope_git"] = _git_hash()
    return out


def base_manifest(command: str, options: dict) -> dict:
    """The manifest fields every command shares; callers add model, corpus and probes."""
    return {
        "format_version": RUN_FORMAT_VERSION,
        "command": command,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(),
        "options": options,
    }


# ---- the run folder -----------------------------------------------------------------------------


def _slug(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "model"


def default_run_dir(label: str, seed: int = 0) -> Path:
    """``reports/<YYYYmmdd-HHMMSS>-<model>`` under the current directory."""
    return Path("reports") / f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{_slug(label)}"



def check_run_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse an existing non-empty run folder unless ``overwrite`` (checked before heavy work)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise SinkscopeError(f"{out_dir} exists and is not a folder.")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise SinkscopeError(f"the run folder {out_dir} already exists and is not empty; pass --overwrite or choose --out.")


@contextmanager
def staged_run_dir(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a hidden staging folder; on success it replaces ``out_dir`` in one rename.

    On any error the staging folder is removed and ``out_dir`` is left exactly as it was.
    """
    out_dir = Path(out_dir)
    check_run_dir(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        yield stage
        replace_folder(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def write_tables(stage: Path, frame: pd.DataFrame, manifest: dict, tokens: np.ndarray) -> None:
    """Write results.csv, results.parquet, manifest.json and tokens.npy into ``stage``."""
    validate(frame)
    frame.to_csv(stage / "results.csv", index=False, float_format="%.9g")
    frame.to_parquet(stage / "results.parquet", index=False)
    np.save(stage / "tokens.npy", np.ascontiguousarray(tokens, dtype=np.int64))
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n")
