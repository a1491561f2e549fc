"""The report's input: run folders and trainer logs, read; runs grouped or split by length; what a run's table holds.

Everything here reads tables and manifests only (no figure, no page): the sections and the page
assembly (``report/build.py``) take their runs from here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sinkscope.store.explorer_format import FILE as EXPLORER_FILE
from sinkscope.store.explorer_format import ExplorerData
from sinkscope.version import __version__
from sinkscope.errors import SinkscopeError
from sinkscope.store.files import read_json
from sinkscope.store.results import NOT_CONDITIONS, RUN_FORMAT_VERSION, read_results


@dataclass
class TrainingLog:
    """A trainer checkpoint's loss log."""

    path: Path
    label: str
    config: dict
    log: pd.DataFrame


def is_training_folder(path: str | Path) -> bool:
    from sinkscope.models.checkpoint_folder import is_checkpoint

    return is_checkpoint(Path(path)) and (Path(path) / "log.csv").is_file()


def read_training(path: str | Path, label: str | None = None) -> TrainingLog:
    folder = Path(path)
    try:
        log = pd.read_csv(folder / "log.csv")
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise SinkscopeError(f"could not read the log.csv of {path} ({str(error).splitlines()[0][:160]}).") from error
    missing = {"step", "train_loss", "val_loss"} - set(log.columns)
    if missing:
        raise SinkscopeError(f"the log.csv of {path} lacks the columns {sorted(missing)}.")
    for column in ("step", "train_loss", "val_loss"):
        numbers = pd.to_numeric(log[column], errors="coerce")
        bad = (log[column].notna() & numbers.isna()) | (numbers.isna() if column == "step" else False)
        if bad.any():
            raise SinkscopeError(f"the log.csv of {path} holds a row that is not a training step (line "
                                 f"{int(bad.to_numpy().nonzero()[0][0]) + 2}); it is damaged: restore it from a copy.")
        log[column] = numbers
    config = read_json(folder / "config.json", "the checkpoint's config.json", expect=dict)
    return TrainingLog(folder, label or folder.resolve().name, config, log)


@dataclass
class RunData:
    """One run folder, read (``shown``: the path the page names, e.g. the final folder of a staged run)."""

    path: Path
    label: str
    manifest: dict
    table: pd.DataFrame
    shown: str = ""
    #: the explorer's patterns (``explorer.npz``), or None for a run without them.
    explorer: ExplorerData | None = None

    def __post_init__(self):
        self.shown = self.shown or str(self.path)


def read_run(path: str | Path, label: str | None = None, explorer: bool = True) -> RunData:
    """Read and check a run folder (one-sentence errors for anything that is not one); ``explorer``: read its
    explorer data too (a page draws it; the terminal's summary and the differences do not)."""
    folder = Path(path)
    if not folder.is_dir():
        raise SinkscopeError(f"{path} is not a folder.")
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise SinkscopeError(f"{path} is not a sinkscope run folder (it has no manifest.json).")
    manifest = read_json(manifest_path, "the run's manifest", expect=dict,
                         hint="the run folder is damaged: run the measurement again")
    version = manifest.get("format_version")
    if version != RUN_FORMAT_VERSION:
        raise SinkscopeError(
            f"{path} was written with run format {version!r}; this sinkscope ({__version__}) reads format "
            f"{RUN_FORMAT_VERSION}: rerun the measurement with this version."
        )
    patterns = ExplorerData.load(folder / EXPLORER_FILE) if explorer and (folder / EXPLORER_FILE).is_file() else None
    return RunData(folder, label or folder.resolve().name, manifest, read_results(folder), explorer=patterns)


# ---- what a run holds --------------------------------------------------------------------------------


def _has_heads(table: pd.DataFrame, metric: str) -> bool:
    rows = table[table.metric == metric]
    return bool((rows.layer.notna() & rows["head"].notna()).any())


def _has_layers(table: pd.DataFrame, metric: str) -> bool:
    rows = table[table.metric == metric]
    return bool((rows.layer.notna() & rows["head"].isna()).any())


def _model_value(table: pd.DataFrame, metric: str):
    rows = table[(table.metric == metric) & table.layer.isna()]
    if "layer_type" in rows.columns:  # the sliding / full means are not the model value
        rows = rows[rows["layer_type"].isna()]
    return rows["value"].iloc[0] if len(rows) else None


def _has_phantom(run: RunData) -> bool:
    """Whether the run's model has a learned phantom key (its spec; else any non-zero phantom mass)."""
    model = run.manifest.get("model")
    spec = model.get("spec") if isinstance(model, dict) else None
    if isinstance(spec, dict) and "has_phantom" in spec:
        return bool(spec["has_phantom"])
    values = run.table[run.table.metric == "phantom_mass"]["value"]
    return bool((values.fillna(0) != 0).any())


def _probe_options(run: RunData, probe: str) -> dict:
    """The options a probe of the run recorded in the manifest (empty if it did not run)."""
    node = (run.manifest.get("probes") or {}).get(probe)
    options = node.get("options") if isinstance(node, dict) else None
    return options if isinstance(options, dict) else {}


def uniform_p0(seq_len: int) -> float:
    """The p0 mass of uniform attention: the mean over queries i = 1 .. T-1 of 1/(i+1)."""
    if not seq_len or seq_len < 2:
        return float("nan")
    return sum(1.0 / (i + 1) for i in range(1, seq_len)) / (seq_len - 1)


def _seq_len(run: RunData) -> int | None:
    windows = run.manifest.get("windows")
    value = windows.get("seq_len") if isinstance(windows, dict) else None
    return value if isinstance(value, int) else None


# ---- several runs as one (``--group-by``) ------------------------------------------------------------


def run_condition(run: RunData, key: str):
    """A run's value of a condition column (``variant``, ``seed``, ``step``, ``tier``), or a sentence."""
    conditions = run.manifest.get("conditions") or {}
    if key in conditions:
        return conditions[key]
    if key in run.table.columns and run.table[key].nunique(dropna=False) == 1:
        return run.table[key].iloc[0]
    raise SinkscopeError(f"the run {run.path} has no condition {key!r} to group by (trainer checkpoints carry "
                         "variant, seed, step and tier).")


def group_runs(runs: list[RunData], key: str) -> list[RunData]:
    """One run per value of ``key``: the mean over its runs of every (probe, metric, layer, head) value.

    Typical use: checkpoints of several seeds per variant, grouped by ``variant``. ``n`` adds up;
    the label says how many runs each group averages.
    """
    groups: dict[object, list[RunData]] = {}
    for run in runs:
        groups.setdefault(run_condition(run, key), []).append(run)
    out = []
    for value, members in groups.items():
        # rows that differ in a probe's condition (a token_id, an injection dose) stay apart;
        # the run's own conditions (variant, seed, ...) are what is averaged over
        run_keys = set().union(*[set((m.manifest.get("conditions") or {})) for m in members])
        extra = [c for c in dict.fromkeys(c for m in members for c in m.table.columns)
                 if c not in NOT_CONDITIONS and c not in run_keys
                 and all(c in m.table.columns for m in members)]
        keys = ["probe", "metric", "layer", "head", *extra]
        stacked = pd.concat([m.table[keys + ["value", "n"]] for m in members])
        table = (stacked.groupby(keys, dropna=False, sort=False)
                 .agg(value=("value", "mean"), n=("n", "sum")).reset_index())
        table = table.astype({"layer": "Int64", "head": "Int64", "value": "float64", "n": "int64"})
        manifest = dict(members[0].manifest)
        manifest["grouped"] = {"by": key, "value": value, "runs": [str(m.path) for m in members]}
        label = f"{key}={value}" + (f" (mean of {len(members)} runs)" if len(members) > 1 else "")
        out.append(RunData(members[0].path, label, manifest, table))
    return out


# ---- several lengths in one run (``--seq-len 128,512,2048``) --------------------------------------


def run_lengths(run: RunData) -> list[int]:
    """The lengths of a run measured at several (its ``seq_len`` column), else []."""
    if "seq_len" not in run.table.columns:
        return []
    return sorted({int(v) for v in run.table["seq_len"].dropna()})


def split_lengths(runs: list[RunData]) -> tuple[list[RunData], list[RunData]]:
    """Each multi-length run as one run per length (so every metric is overlaid across lengths).

    Returns the runs to draw (a multi-length run replaced by its lengths, labelled ``seq-len N``,
    or ``<run> · seq-len N`` in a comparison; the ``leak_fit`` rows stay out) and the
    multi-length runs themselves (for the "lengths" section).
    """
    out, several = [], []
    for run in runs:
        lengths = run_lengths(run)
        if len(lengths) < 2:
            out.append(run)
            continue
        several.append(run)
        for n in lengths:
            table = run.table[(run.table["seq_len"] == n) & (run.table["probe"] != "leak_fit")]
            manifest = json.loads(json.dumps(run.manifest))
            manifest.setdefault("windows", {})["seq_len"] = n
            label = f"seq-len {n}" if len(runs) == 1 else f"{run.label} · seq-len {n}"
            out.append(RunData(run.path, label, manifest, table.drop(columns="seq_len").reset_index(drop=True),
                               run.shown))
    return out, several
