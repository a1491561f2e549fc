"""The results table, the manifest and the run folder (atomic, never half-written).

A run folder holds:

    results.csv / results.parquet   tidy table: probe, metric, layer, head, value, n, (conditions), se
    manifest.json                   what produced it (versions, model, corpus + hash, seed, BOS, options)
    tokens.npy                      int64 (n_seqs, seq_len): exactly the ids evaluated
    window_values.npy               float32 (metrics, L + 1, n_seqs): each window's layer means and model value
                                    of the metrics the manifest's ``window_values.metrics`` lists (the bootstrap
                                    of a series' emergence step, ``stats/emergence.py``)
    figures/                        heatmap_<metric>.{png,svg}, layers_<metric>.{png,svg}
    .sinkscope-files                the files above, as written (``fileio.write_inventory``)

``layer`` and ``head`` are nullable integers (pandas ``Int64``; ``3`` in the CSV, int64 with nulls in
the parquet file): an empty ``head`` marks a layer aggregate or a per-layer metric, empty ``layer``
and ``head`` a model aggregate; ``head`` shadows ``DataFrame.head``, so readers write
``table["head"]``. ``n`` is the number of units the value is a mean over, the units of its ``se``
where it has one: the windows for a mean over windows (SPEC.md "Tables" gives every metric's
unit). Condition columns follow ``n`` where a run has them:
those a probe adds to its rows (e.g. ``junk``, ``cutoff``, ``dose``) and those of the run
itself (``variant``, ``seed``, ``step``, ``tier`` for a trainer checkpoint); a plain ``sinks``
run of a Hugging Face model has none. The last column, ``se``, is the standard error over windows
of a value that is a mean over windows, on head, layer and model rows (SPEC.md "Averages" and
"Tables"), empty (NaN) elsewhere; a table
written before it is read with ``se`` NaN. The whole folder is written into a hidden sibling and
renamed into place at the end, so a crash leaves either no folder or a complete one.

This module is the table schema (``Row``, ``MetricInfo``) and imports neither torch nor any
probe, so the report can read runs without them.

Guards on the output folder, in the order a command uses them (all before the model loads):
:func:`default_run_dir` (a run id unique per run), :func:`lock_run_dir` (one writer per folder;
``.NAME.lock`` beside it, which also proves the place is writable) and :func:`check_run_dir`
(``--overwrite`` replaces only a folder holding nothing but what sinkscope wrote, as listed in its
``.sinkscope-files``; never the current folder). The staging folder's inventory is written last.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import secrets
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

from sinkscope.errors import SinkscopeError
from sinkscope.store.files import (check_not_cwd, check_replaceable, default_folder_mode, lock_folder, replace_folder,
                              write_inventory)

if TYPE_CHECKING:  # numpy and pandas are imported where they are used: the CLI's early checks stay light
    import numpy as np
    import pandas as pd

COLUMNS = ["probe", "metric", "layer", "head", "value", "n"]
#: statistics of a row that are neither keys nor conditions, the table's last columns (appended after
#: every condition column, so readers of the columns above are unchanged): ``se``, the standard error
#: over windows of a value that is a mean over windows, NaN elsewhere (SPEC.md "Averages").
STAT_COLUMNS = ["se"]
#: the columns that are not conditions.
NOT_CONDITIONS = (*COLUMNS, *STAT_COLUMNS)
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
    """One number of the tidy results table; ``None`` layer/head marks an aggregate (``head`` None also
    marks a metric measured per layer: never an invented head 0).

    ``conditions`` are extra columns of this row, as ``((column, value), ...)`` (e.g.
    ``(("junk", "gaussian"), ("dose", 0.4))``); rows without them leave those columns empty.
    ``n`` is the number of units the value is a mean (share, statistic) over, the units ``se`` is
    over where it has one: the windows for a mean over windows (SPEC.md "Tables"). ``se`` is the
    standard error over windows of a value that is a mean over windows (SPEC.md "Averages";
    ``HeadMeans``), NaN where the value is not one or it is undefined.
    """

    probe: str
    metric: str
    layer: int | None
    head: int | None
    value: float
    n: int
    conditions: tuple[tuple[str, object], ...] = ()
    se: float = math.nan


#: probes whose per-layer rows are not means over queries and heads (positions, channels, maxima,
#: norms of one position, one layer's PCA): no layer-type split.
NOT_SPLIT_BY_LAYER_TYPE = ("massive_activation", "p0_norm", "attn_out_norm", "mlp_pca", "mlp_pca_up", "p0_outliers")


def layer_type_rows(rows: list[Row], windows: list[int | None]) -> list[Row]:
    """Every metric's mean over the sliding layers and over the full ones (Wang 2026 Table 14).

    For a model with at least one sliding-window layer (``windows[l]`` its W, None if full):
    per (probe, metric, conditions), the mean of the per-layer rows over the layers of each type,
    as a row with an empty layer and head and the condition ``layer_type`` = ``sliding`` or
    ``full``. None for a model without sliding layers (its table is unchanged).

    ``n`` follows the metric's model row (SPEC.md "Tables"): where that row keeps its layers' ``n``
    (the windows, which every layer shares) so does this one; where it adds them (heads, events)
    this one adds its own layers'. No ``se``: the rows keep no per-window values to pair across
    layers (the model row's comes from the probe's accumulator).
    """
    if not any(w is not None for w in windows):
        return []
    groups: dict[tuple, dict[str, list[Row]]] = {}
    model_n = {(r.probe, r.metric, r.conditions): r.n for r in rows if r.layer is None and r.head is None}
    for row in rows:
        if row.layer is None or row.head is not None or row.probe in NOT_SPLIT_BY_LAYER_TYPE:
            continue
        kind = "sliding" if row.layer < len(windows) and windows[row.layer] is not None else "full"
        groups.setdefault((row.probe, row.metric, row.conditions), {}).setdefault(kind, []).append(row)
    out = []
    for key, kinds in groups.items():
        probe, metric, conditions = key
        layers_n = max(r.n for members in kinds.values() for r in members)
        adds = key in model_n and model_n[key] != layers_n  # the model row adds its layers' n
        for kind in ("sliding", "full"):
            members = kinds.get(kind)
            if members:
                n = sum(r.n for r in members) if adds else max(r.n for r in members)
                out.append(Row(probe, metric, None, None, sum(r.value for r in members) / len(members), n,
                               (*conditions, ("layer_type", kind))))
    return out


def rows_to_frame(rows: Iterable[Row], run_conditions: dict | None = None) -> pd.DataFrame:
    """The tidy table with the schema's dtypes (nullable Int64 for layer and head).

    Columns: ``COLUMNS``, then the rows' condition columns in order of first appearance, then
    ``run_conditions`` (one value for every row, e.g. a checkpoint's variant and seed), then
    ``STAT_COLUMNS`` (``se``).
    """
    import pandas as pd

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
        if key in frame.columns or key in STAT_COLUMNS:
            raise SinkscopeError(f"the run condition {key!r} clashes with a column of the table.")
        frame[key] = pd.Series([value] * len(frame), dtype="string" if isinstance(value, str) else None)
    frame["se"] = pd.Series([r.se for r in rows], dtype="float64")
    return frame


def condition_columns(frame: pd.DataFrame) -> list[str]:
    """The table's columns beyond ``COLUMNS`` (probe and run conditions), in order."""
    return [c for c in frame.columns if c not in NOT_CONDITIONS]


def validate(frame: pd.DataFrame) -> None:
    """Check the columns and that every (probe, metric, layer, head, conditions...) appears once."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise SinkscopeError(f"results table lacks the columns {missing}.")
    keys = frame[["probe", "metric", "layer", "head", *condition_columns(frame)]].astype("string").fillna("")
    if keys.duplicated().any():
        raise SinkscopeError("results table has duplicate (probe, metric, layer, head) rows.")


def _read_one(path: Path) -> pd.DataFrame:
    """One results file with the schema's dtypes, or a sentence naming what is wrong with it."""
    import pandas as pd

    other = "results.csv" if path.suffix == ".parquet" else "results.parquet"
    remedy = (f"delete it to use {other}, or rerun the measurement" if (path.parent / other).is_file()
              else "rerun the measurement")
    try:
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as error:  # noqa: BLE001 - any unreadable table (truncated, empty, not a table) is one sentence
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        raise SinkscopeError(f"could not read {path} ({reason}); it is damaged: {remedy}.") from error
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise SinkscopeError(f"the table {path} lacks the columns {missing}; it is damaged: {remedy}.")
    if "se" not in frame.columns:  # a table written before the standard errors
        frame["se"] = math.nan
    for column, dtype in (("layer", "Int64"), ("head", "Int64"), ("value", "float64"), ("n", "int64"),
                          ("se", "float64")):
        try:
            frame[column] = frame[column].astype(dtype)
        except (ValueError, TypeError) as error:
            raise SinkscopeError(f"the column {column!r} of {path} holds a value that is not a number "
                                 f"({str(error).splitlines()[0][:120]}); it is damaged: {remedy}.") from error
    return frame


def _disagreement(a: pd.DataFrame, b: pd.DataFrame) -> str | None:
    """Where two readings of one table differ (None if they agree; CSV values carry 9 digits)."""
    import numpy as np

    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    keys = ["probe", "metric", "layer", "head"]
    ka = a[keys].astype("string").fillna("").reset_index(drop=True)
    kb = b[keys].astype("string").fillna("").reset_index(drop=True)
    diff = ~(ka == kb).all(axis=1)
    va, vb = a["value"].to_numpy(), b["value"].to_numpy()
    diff |= ~np.isclose(va, vb, rtol=1e-7, atol=1e-12, equal_nan=True)
    diff |= a["n"].to_numpy() != b["n"].to_numpy()
    if "se" in a.columns and "se" in b.columns:
        diff |= ~np.isclose(a["se"].to_numpy(dtype=float), b["se"].to_numpy(dtype=float), rtol=1e-7, atol=1e-12,
                            equal_nan=True)
    if not diff.any():
        return None
    i = int(np.flatnonzero(diff.to_numpy())[0])
    where = ", ".join(f"{k} {v}" for k, v in zip(keys, ka.iloc[i]) if v != "")
    return f"first at row {i + 1}: {where}, value {va[i]:.9g} against {vb[i]:.9g}"


def read_results(run_dir: Path) -> pd.DataFrame:
    """Read a run's table with the schema's dtypes.

    Both ``results.parquet`` and ``results.csv`` are read when both exist, and must agree (to
    the CSV's 9 significant digits): a damaged or edited copy is named in one sentence rather
    than one of them being used silently.
    """
    run_dir = Path(run_dir)
    files = [run_dir / name for name in ("results.parquet", "results.csv") if (run_dir / name).is_file()]
    if not files:
        raise SinkscopeError(f"{run_dir} is not a sinkscope run folder (no results.csv).")
    frames = [_read_one(path) for path in files]
    if len(frames) == 2:
        diff = _disagreement(*frames)
        if diff is not None:
            raise SinkscopeError(f"results.parquet and results.csv of {run_dir} disagree ({diff}); one was edited "
                                 "or damaged: delete the wrong one, or rerun the measurement.")
    return _parameters_out_of_names(frames[0])


#: metric names that carried their parameter (written before 2026-12): ``sink_rate[2:]`` is now
#: ``sink_rate_from_layer`` with layer_start 2, ``token_share[n>=50]`` ``token_share_frequent`` with min_count 50.
_LEGACY_NAMES = ((re.compile(r"^(?P<metric>[a-z_0-9]+)\[(?P<value>\d+):\]$"), "_from_layer", "layer_start"),
                 (re.compile(r"^(?P<metric>[a-z_0-9]+)\[n>=(?P<value>\d+)\]$"), "_frequent", "min_count"))


def _parameters_out_of_names(table: pd.DataFrame) -> pd.DataFrame:
    """A run written before 2026-12 named ``sink_rate[2:]`` what is now ``sink_rate_from_layer`` with
    ``layer_start`` = 2 (and ``token_share[n>=50]`` ``token_share_frequent`` with ``min_count`` = 50): read
    it under today's names, so reports find the row under any setting."""
    import pandas as pd

    for pattern, suffix, column in _LEGACY_NAMES:
        found = table["metric"].astype(str).str.extract(pattern)
        legacy = found["metric"].notna()
        if not legacy.any():
            continue
        table = table.copy()
        table.loc[legacy, "metric"] = found.loc[legacy, "metric"] + suffix
        if column not in table.columns:  # a condition column: before se, which stays last
            at = list(table.columns).index("se") if "se" in table.columns else len(table.columns)
            table.insert(at, column, pd.array([pd.NA] * len(table), dtype="Int64"))
        table.loc[legacy, column] = found.loc[legacy, "value"].astype(int)
    return table


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
    for package in ["sinkscope", "torch", "transformers", "numpy", "pandas", "gguf", "tokenizers", "accelerate",
                    "transformer-lens", "nnsight", "sae-lens"]:
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
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:60] or "model"


def default_run_dir(label: str, seed: int | None = None, command: str | None = None) -> Path:
    """``reports/<YYYYmmdd-HHMMSS>-<command>-<model>-s<seed>-<6 hex>`` under the current directory.

    ``command`` (``sinks``, ``stream``, ...) names what wrote the run, so that ``ls reports`` tells
    runs apart; without it (``conformance``, names written before) the part is left out. The random
    suffix makes the id unique per run: two runs started in the same second (say seeds 0 and 1, or
    the same command twice) never share a folder.
    """
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    command_part = "" if not command else f"-{_slug(command)}"
    seed_part = "" if seed is None else f"-s{seed}"
    while True:
        folder = Path("reports") / f"{stamp}{command_part}-{_slug(label)}{seed_part}-{secrets.token_hex(3)}"
        if not folder.exists():
            return folder


def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a run folder's manifest (written by a sinkscope command).

    Whether it may be replaced is another question (:func:`check_run_dir`): a manifest is easily
    copied next to other files.
    """
    from sinkscope.store.files import read_json

    try:  # a damaged manifest (not JSON, [[[[...]]]]) is no run's; reading the run names it (report.build.read_run)
        manifest = read_json(Path(folder) / "manifest.json", "the run's manifest")
    except SinkscopeError:
        return False
    return isinstance(manifest, dict) and "format_version" in manifest and "command" in manifest


def _check_not_cwd(out_dir: Path) -> None:
    """A run replaces its folder in one rename: never the current folder or one above it."""
    check_not_cwd(out_dir, "a run needs", "runs/NAME")


#: the files a run folder holds (``figures/`` holds PNG and SVG files only).
#: arrays some commands add beside the table (``Result.arrays``): ``stream``'s every-token NLL.
ARRAY_FILES = ("stream_nll.npy", "window_values.npy")
RUN_FILES = ("results.csv", "results.parquet", "manifest.json", "tokens.npy", "report.html", "explorer.npz", *ARRAY_FILES)


def is_legacy_run_file(rel: str) -> bool:
    """A file of a run folder written before inventories (``fileio.foreign_entries``): its fixed names."""
    return rel in RUN_FILES or (rel.startswith("figures/") and rel.count("/") == 1
                                and rel.endswith((".png", ".svg")))


def run_folder_legacy(folder: Path):
    """``legacy`` for :func:`fileio.check_replaceable`: a run folder's fixed names, if it has a run manifest."""
    return is_legacy_run_file if is_run_folder(folder) else None


def check_run_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse an output folder a run may not take (checked before any heavy work, and again at the end).

    Refused: the current folder or one above it; a file; an existing non-empty folder unless
    ``overwrite``; and, even with ``overwrite``, a folder holding anything sinkscope did not
    write (``fileio.foreign_entries``: a checkpoint being measured, a user's notes).
    """
    out_dir = Path(out_dir)
    _check_not_cwd(out_dir)
    check_replaceable(out_dir, overwrite, kind="run", legacy=run_folder_legacy(out_dir))


@contextmanager
def lock_run_dir(out_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock from the checks before loading until it is written (``fileio.lock_folder``).

    A second run writing the same folder at the same time fails at once with one sentence, and
    so does an output place that cannot be written (before any model is loaded). Never the
    current folder or one above it.
    """
    _check_not_cwd(out_dir)
    with lock_folder(out_dir, kind="run"):
        yield


@contextmanager
def staged_run_dir(out_dir: Path, overwrite: bool) -> Iterator[Path]:
    """Yield a hidden staging folder; on success it replaces ``out_dir`` in one rename.

    On any error the staging folder is removed and ``out_dir`` is left exactly as it was. The
    folder gets the permissions of any new folder (the user's umask), not mkdtemp's 0o700.
    """
    out_dir = Path(out_dir)
    check_run_dir(out_dir, overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        os.chmod(stage, default_folder_mode())
        yield stage
        write_inventory(stage, "run")
        check_run_dir(out_dir, overwrite)  # nothing of anyone else's appeared there while the run ran
        replace_folder(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def write_tables(stage: Path, frame: pd.DataFrame, manifest: dict, tokens: np.ndarray,
                 arrays: dict | None = None) -> None:
    """Write results.csv, results.parquet, manifest.json, tokens.npy and any ``arrays`` (``NAME.npy``) into ``stage``."""
    import numpy as np

    for name in arrays or {}:
        if f"{name}.npy" not in ARRAY_FILES:
            raise ValueError(f"a run's arrays are {', '.join(ARRAY_FILES)}; {name!r} is not one of them")
        np.save(stage / f"{name}.npy", np.ascontiguousarray(arrays[name]))

    validate(frame)
    frame.to_csv(stage / "results.csv", index=False, float_format="%.9g")
    frame.to_parquet(stage / "results.parquet", index=False)
    np.save(stage / "tokens.npy", np.ascontiguousarray(tokens, dtype=np.int64))
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n")


def earlier_duplicates(digests: list[str | None]) -> dict[int, int]:
    """{index: the earlier index with the same digest} over a series' weight hashes (``model.weights_sample_sha256``,
    ``models/fingerprint.py``); None (no hash recorded) is never a duplicate."""
    first: dict[str, int] = {}
    out: dict[int, int] = {}
    for k, digest in enumerate(digests):
        if digest is None:
            continue
        if digest in first:
            out[k] = first[digest]
        else:
            first[digest] = k
    return out
