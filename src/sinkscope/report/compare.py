"""Differences between runs: every row two runs share, the later run's value minus the first's, with its
standard error, paired where the runs measured the same windows and stored their per-window values
(SPEC.md "Comparisons of runs").

    differences(runs)            -> one row per (run, row shared with the first run): difference, se, pairing
    compare_folders(folders)     -> the same, from run folders (a comparison's, grouped as its page groups them)
    write_differences(folder, d) -> folder/compare.csv

The first run is the reference. ``pairing`` says what the ``se`` is:

- ``paired``: both runs measured the same token windows (their manifests' ``windows.tokens_sha256``) and
  stored the row's value per window, so the se is over the per-window differences (``stats.paired.
  paired_difference``), which cancels what the windows share. Runs store per-window values for
  ``stream_nll`` and ``stream_ppl`` (``stream_nll.npy``: every token's NLL per condition and document).
- ``unpaired: per-window values not stored``: the same windows, but the run keeps the row's standard
  error only, not its per-window values: ``sqrt(se_a^2 + se_b^2)``, which ignores that the windows are
  shared (too wide when the two runs rise and fall together over the windows, as they usually do).
- ``unpaired: different windows``: the runs measured different token windows (another tokenizer, seed,
  corpus or length): ``sqrt(se_a^2 + se_b^2)``, the difference of two independent means.
- ``unpaired: averaged groups`` (``--group-by``): the groups' means carry no se, and neither does
  their difference.

Tables in, tables out: reads run folders (``report/runs.py``), never a model.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from sinkscope.report.runs import RunData
from sinkscope.stats.paired import paired_difference, unpaired_se
from sinkscope.store.results import NOT_CONDITIONS

#: the file a comparison's folder holds beside its page.
COMPARE_FILE = "compare.csv"
PAIRED = "paired"
DIFFERENT_WINDOWS = "unpaired: different windows"
NOT_STORED = "unpaired: per-window values not stored"
GROUPS = "unpaired: averaged groups"
#: the condition columns every row of a trainer checkpoint's or a series' run carries (the run's, not a row's).
RUN_CONDITIONS = ("variant", "seed", "step", "tier", "revision")
#: the leading columns of compare.csv; the rows' condition columns follow ``head``.
KEYS = ["run", "reference", "probe", "metric", "layer", "head"]
STATS = ["value", "reference_value", "difference", "se", "pairing", "n_windows"]


def tokens_sha256(run: RunData) -> str | None:
    """The sha256 of the token windows a run measured (its manifest), or None."""
    windows = run.manifest.get("windows")
    value = windows.get("tokens_sha256") if isinstance(windows, dict) else None
    return value if isinstance(value, str) and value else None


def same_windows(a: RunData, b: RunData) -> bool:
    """Whether two runs measured the same token windows (equal, known token hashes)."""
    return tokens_sha256(a) is not None and tokens_sha256(a) == tokens_sha256(b)


def run_condition_columns(runs: list[RunData]) -> set[str]:
    """Columns that are a run's conditions (its manifest's, a grouping's), not a row's."""
    out = set(RUN_CONDITIONS)
    for run in runs:
        out |= set(run.manifest.get("conditions") or {})
        grouped = run.manifest.get("grouped")
        if isinstance(grouped, dict) and grouped.get("by"):
            out.add(str(grouped["by"]))
    return out


def condition_text(value) -> str | None:
    """A condition's value as a key: None for empty, whole numbers without ``.0`` (CSV reads 16 or 16.0)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, float, np.integer, np.floating)):
        number = float(value)
        return str(int(number)) if number.is_integer() else repr(number)
    return str(value)


def row_keys(table: pd.DataFrame, skip: set[str]) -> tuple[list[tuple], list[str]]:
    """Each row's key (probe, metric, layer, head, ((condition, value), ...)) and the condition columns used."""
    columns = [c for c in table.columns if c not in NOT_CONDITIONS and c not in skip]
    keys = []
    for record in table[["probe", "metric", "layer", "head", *columns]].itertuples(index=False, name=None):
        probe, metric, layer, head, *values = record
        conditions = tuple((c, t) for c, v in zip(columns, values) if (t := condition_text(v)) is not None)
        keys.append((str(probe), str(metric), condition_text(layer), condition_text(head), conditions))
    return keys, columns


def window_values(run: RunData, skip: set[str]) -> dict[tuple, np.ndarray]:
    """Per-window values of the rows a run stored them for, by row key (:func:`row_keys`).

    Only ``stream`` stores them (``stream_nll.npy``, (conditions, documents, L - 1), the conditions in
    the manifest's ``probes.stream.options.conditions``): a ``stream_nll`` row's value per document is the
    document's mean NLL (over the row's position bucket, for a bucket row); a ``stream_ppl`` row's is
    ``ppl x`` that mean, its linearisation (the delta method, as the row's own se), so that the paired
    se of a perplexity difference is ``sd(ppl_b x_b - ppl_a x_a) / sqrt(n)``. A condition not read for
    every document (an interrupted run) has none.
    """
    if run.manifest.get("grouped") or not (run.path / "stream_nll.npy").is_file():
        return {}
    node = (run.manifest.get("probes") or {}).get("stream")
    options = node.get("options") if isinstance(node, dict) else None
    if not isinstance(options, dict):
        return {}
    conditions, n_docs, length, bucket = (options.get("conditions"), options.get("n_windows"), options.get("length"),
                                          options.get("bucket"))
    if not (isinstance(conditions, list) and all(isinstance(x, int) and x > 0 for x in (n_docs, length, bucket))):
        return {}
    from sinkscope.store.explorer_format import read_npy

    try:
        nll = read_npy(run.path / "stream_nll.npy", (len(conditions), n_docs, length - 1), "f", "the per-token NLL")
    except (OSError, ValueError):
        return {}
    table = run.table
    keys, _ = row_keys(table, skip)
    bucket_column = table["position_bucket"] if "position_bucket" in table.columns else pd.Series([None] * len(table))
    overall = [i for i, (key, b) in enumerate(zip(keys, bucket_column))
               if key[0] == "stream" and key[1] == "stream_nll" and key[2] is None and condition_text(b) is None]
    if len(overall) != len(conditions):  # a condition not read (an interrupted run): no pairing by order
        return {}

    def setting(key: tuple) -> tuple:
        return tuple(item for item in key[4] if item[0] != "position_bucket")

    index = {}
    for c, i in enumerate(overall):
        if str(table["policy"].iloc[i]) != str(conditions[c].get("policy")) or not _every_document(table["n"].iloc[i],
                                                                                                     n_docs, length):
            return {}  # not the order the probe wrote, or not every document read
        index[setting(keys[i])] = c
    starts = (np.arange(1, length) // bucket) * bucket  # the predicted token's position, bucketed as the probe does
    out: dict[tuple, np.ndarray] = {}
    for i, key in enumerate(keys):
        if key[0] != "stream" or key[1] not in ("stream_nll", "stream_ppl") or key[2] is not None:
            continue
        c = index.get(setting(key))
        if c is None:
            continue
        start = condition_text(bucket_column.iloc[i])
        inside = slice(None) if start is None else starts == int(start)
        per_doc = nll[c][:, inside].astype(np.float64).mean(axis=1)  # (documents,)
        if key[1] == "stream_ppl":
            per_doc = math.exp(float(per_doc.mean())) * per_doc
        out[key] = per_doc
    return out


def _every_document(n, n_docs: int, length: int) -> bool:
    """Whether a ``stream_nll`` row's ``n`` says every document was read: ``n`` counts the documents (runs
    written since 2026-12) or, in earlier runs, their predicted tokens, ``n_docs x (length - 1)``."""
    return not pd.isna(n) and int(n) in (n_docs, n_docs * (length - 1))


def differences(runs: list[RunData]) -> pd.DataFrame:
    """Every later run's rows minus the first run's (the reference), the rows both have (module docstring).

    Columns: ``run, reference, probe, metric, layer, head``, the rows' condition columns,
    ``value, reference_value, difference, se, pairing, n_windows`` (the windows a paired se is over).
    """
    if len(runs) < 2:
        return pd.DataFrame(columns=KEYS + STATS)
    skip = run_condition_columns(runs)
    reference = runs[0]
    ref_keys, columns = row_keys(reference.table, skip)
    ref_rows = {key: i for i, key in enumerate(ref_keys)}
    ref_windows = window_values(reference, skip)
    records = []
    for run in runs[1:]:
        keys, theirs = row_keys(run.table, skip)
        columns += [c for c in theirs if c not in columns]
        same = same_windows(reference, run)
        grouped = bool(run.manifest.get("grouped") or reference.manifest.get("grouped"))
        windows = window_values(run, skip) if same else {}
        for i, key in enumerate(keys):
            j = ref_rows.get(key)
            if j is None:
                continue
            value, ref_value = float(run.table["value"].iloc[i]), float(reference.table["value"].iloc[j])
            se_run = run.table["se"].iloc[i] if "se" in run.table.columns else math.nan
            se_ref = reference.table["se"].iloc[j] if "se" in reference.table.columns else math.nan
            n_windows = math.nan
            if grouped:
                pairing, se = GROUPS, math.nan
            elif not same:
                pairing, se = DIFFERENT_WINDOWS, unpaired_se(se_ref, se_run)
            elif key in windows and key in ref_windows and windows[key].shape == ref_windows[key].shape:
                _, se, n = paired_difference(ref_windows[key], windows[key])
                pairing, n_windows = PAIRED, n
            else:
                pairing, se = NOT_STORED, unpaired_se(se_ref, se_run)
            probe, metric, layer, head, conditions = key
            records.append({"run": run.label, "reference": reference.label, "probe": probe, "metric": metric,
                            "layer": None if layer is None else int(layer),
                            "head": None if head is None else int(head), **dict(conditions), "value": value,
                            "reference_value": ref_value, "difference": value - ref_value, "se": se,
                            "pairing": pairing, "n_windows": n_windows})
    frame = pd.DataFrame.from_records(records, columns=KEYS + columns + STATS)
    frame = frame.astype({"layer": "Int64", "head": "Int64", "n_windows": "Int64"})
    return frame


def model_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The differences of model-level rows (no layer, no head, no layer-type or position-bucket split)."""
    keep = frame["layer"].isna() & frame["head"].isna()
    for column in ("layer_type", "position_bucket"):
        if column in frame.columns:
            keep &= frame[column].isna()
    return frame[keep]


def write_differences(folder: Path, frame: pd.DataFrame) -> Path:
    """``folder/compare.csv`` (atomically): the differences, 9 significant digits."""
    from sinkscope.store.files import atomic_write_text

    path = Path(folder) / COMPARE_FILE
    atomic_write_text(path, frame.to_csv(index=False, float_format="%.9g"))
    return path


def compare_folders(folders: list[Path], labels: list[str] | None = None, group_by: str | None = None) -> pd.DataFrame:
    """:func:`differences` of run folders, in order (``labels``: their names, default the folder names;
    ``group_by``: the runs sharing that condition averaged first, as the comparison page does)."""
    from sinkscope.report.runs import group_runs, read_run

    names = list(labels) if labels is not None else [None] * len(folders)
    runs = [read_run(folder, label, explorer=False) for folder, label in zip(folders, names)]
    if group_by:
        runs = group_runs(runs, group_by)
    return differences(runs)

