"""Metrics against the training step: sink formation (issue 29), read from tables only.

Two sources of the same curves:

- a **series of runs**, one per checkpoint of one model (``sinkscope sinks MODEL --revision
  step0,step1000,...``, or a folder of trainer checkpoints as the MODEL): every run carries the
  conditions ``step`` and ``revision`` (``run.comparison.execute_several``), and every metric with
  per-layer rows is drawn against the step, one line per layer plus the model value (the mean
  over layers of per-layer means over heads, SPEC.md "Averages"). A revision whose name gives no
  step puts the series on the revisions' order instead (x = 0, 1, 2, ... labelled by name);
- a trainer checkpoint's **monitor** (``sinkscope train --monitor-every N``): ``monitor.csv``
  holds the same rows at every N-th step on fixed windows (``train/monitor.py``); the formation curves
  of p0 mass, phantom mass and value-norm ratio are drawn per layer for one checkpoint, and the
  model values of several checkpoints (a sweep's variants) overlaid, one line per checkpoint.

The "Training" section of a trainer checkpoint (:func:`training_section`) puts its ``log.csv``
loss curves (and head-imbalance curves), a table of its losses and the monitor's formation
curves together.

p0 mass carries the uniform floor of its windows' length as a dotted line
(``runs.uniform_p0``: what p0 would be if every query spread its attention evenly): a sink forms
where the curve leaves it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sinkscope.report import curves as plots
from sinkscope.report import figures
from sinkscope.report.page import COLLAPSE_ROWS, _keeper, _metric_docs, fmt
from sinkscope.report.runs import TrainingLog, _seq_len, uniform_p0
from sinkscope.store.results import NOT_CONDITIONS, MetricInfo, earlier_duplicates

#: the monitor's table and manifest in a checkpoint folder (``train/monitor.py``'s TABLE and MANIFEST).
MONITOR_TABLE, MONITOR_MANIFEST, MONITOR_WINDOWS = "monitor.csv", "monitor.json", "monitor_windows.npz"
#: the monitor's metrics, in the order the report draws them.
FORMATION_METRICS = ("p0_mass", "phantom_mass", "value_norm_ratio")
#: run conditions a series' runs differ or agree in (never a probe's own condition column).
RUN_KEYS = ("step", "revision", "variant", "seed", "tier")


# ---- the rows drawn -----------------------------------------------------------------------------------


def plain_rows(table: pd.DataFrame, metric: str, keep: tuple[str, ...] = RUN_KEYS) -> pd.DataFrame:
    """The metric's per-layer and model rows (no head), without probe conditions or layer-type means."""
    rows = table[(table["metric"] == metric) & table["head"].isna()]
    for column in rows.columns:
        if column not in NOT_CONDITIONS and column not in keep:
            rows = rows[rows[column].isna()]
    return rows


def curves(table: pd.DataFrame, metric: str, x: pd.Series | None = None) -> dict[str, pd.DataFrame]:
    """``{"layer 0": rows(step, value), ..., MODEL_LINE: ...}`` of one metric from a table with a step column.

    ``x`` maps each row's step to the position drawn (a series without steps); default the step.
    """
    rows = plain_rows(table, metric)
    step = rows["step"] if x is None else x.loc[rows.index]
    frame = pd.DataFrame({"layer": rows["layer"], "step": pd.to_numeric(step), "value": rows["value"].astype(float)})
    out = {f"layer {int(layer)}": part[["step", "value"]].reset_index(drop=True)
           for layer, part in frame.dropna(subset=["layer"]).groupby("layer", sort=True)}
    model = frame[frame["layer"].isna()]
    if len(model):
        out[plots.MODEL_LINE] = model[["step", "value"]].reset_index(drop=True)
    return out


def _steps_table(lines: dict[str, pd.DataFrame], names: dict[float, str] | None) -> dict:
    """The figure's numbers as the page's table: one row per step, one column per line."""
    steps = sorted(set().union(*[set(rows["step"]) for rows in lines.values()])) if lines else []
    by_line = {label: dict(zip(rows["step"], rows["value"])) for label, rows in lines.items()}
    first = "revision" if names else "step"
    body = [[names[s] if names else str(int(s))] + [fmt(by_line[label].get(s)) for label in lines] for s in steps]
    return {"columns": [first, *lines], "rows": body, "collapsed": len(body) > COLLAPSE_ROWS}


# ---- a series of runs ---------------------------------------------------------------------------------


def series_positions(runs: list) -> tuple[list[float], dict[float, str] | None] | None:
    """Where each run of a series sits on the x axis, and tick labels when that is not the step; else None.

    A series: two runs or more, each with a ``step`` or ``revision`` condition (manifest), all
    distinct; runs without a ``revision`` (trainer checkpoints measured one by one) must also share
    their variant, seed and tier (one training's checkpoints, not several trainings compared). x is the step when every run has one and no two share it, else the run's position
    (0, 1, ...), labelled by revision.
    """
    if len(runs) < 2:
        return None
    keys, trainings = [], set()
    for run in runs:
        conditions = run.manifest.get("conditions") or {}
        if "step" not in conditions and "revision" not in conditions:
            return None
        keys.append((conditions.get("step"), conditions.get("revision")))
        trainings.add(tuple(str(conditions.get(k)) for k in ("variant", "seed", "tier")))
    if len(set(keys)) < len(keys):
        return None
    if any(revision is None for _, revision in keys) and len(trainings) > 1:
        return None  # checkpoints of different trainings (variants, seeds) compared, not one model's steps
    steps = [step for step, _ in keys]
    if all(isinstance(step, int) for step in steps) and len(set(steps)) == len(steps):
        return [float(step) for step in steps], None
    return [float(k) for k in range(len(runs))], {float(k): str(rev if rev is not None else run.label)
                                                 for k, ((_, rev), run) in enumerate(zip(keys, runs))}


STEPS_NOTE = ("Every checkpoint is measured on the same token windows (the first checkpoint's; a tokenizer that "
              "makes others stops the series), so the curves show the model changing, not the sample. Thin "
              "lines: each layer's mean over heads; black: the model value (the mean over layers). p0 mass "
              "carries the uniform floor (dotted).")


def series_section(runs: list, metrics: list[str], fig_dir: Path, keep,
                   labels: figures.MetricLabels | None = None) -> dict | None:
    """The page's "against the step" section of a series: one figure and one table per metric.

    ``labels``: the page's metric labels (default: from the runs' documentation).
    """
    placed = series_positions(runs)
    if placed is None:
        return None
    xs, names = placed
    docs = _metric_docs(runs)
    if labels is None:
        labels = figures.MetricLabels.from_docs(docs)
    entries = []
    for metric in metrics:
        frames = []
        for run, x in zip(runs, xs):
            rows = plain_rows(run.table, metric)
            frames.append(rows.assign(step=x))
        table = pd.concat(frames, ignore_index=True)
        lines = curves(table, metric)
        if not lines:
            continue
        seq_len = _seq_len(runs[0])
        floor = uniform_p0(seq_len) if metric == "p0_mass" and seq_len else None
        fig = plots.metric_vs_step(lines, metric, floor=floor, x_labels=names, labels=labels,
                                   title=f"{figures.metric_title(metric, labels)} against the "
                                         f"{'revision' if names else 'training step'}")
        found = emergence_of(runs, xs, metric) if metric in EMERGENCE_METRICS else None
        if found is not None:
            _mark_emergence(fig, found["model"])
        info = docs.get(metric, MetricInfo(metric, "", "", ""))
        entries.append({"metric": f"{metric}_vs_step",
                        "info": MetricInfo(f"{info.label or metric} against the step", info.unit, info.formula,
                                           info.source, info.direction),
                        "note": None if found is None else _emergence_note(found, names),
                        "figures": [keep(fig, f"steps_{figures._file_stem(metric)}",
                                         "per layer and the model value against the step")],
                        "table": _steps_table(lines, names)})
        if found is not None:
            entries.append(_emergence_entry(metric, info, found, names))
    if not entries:
        return None
    return {"probe": "steps", "entries": entries, "note": STEPS_NOTE, "tables": []}


# ---- the emergence step (issue 58) ----------------------------------------------------------------------

#: the metrics whose emergence step a series' page gives (SPEC.md "The emergence step").
EMERGENCE_METRICS = ("sink_rate", "p0_mass")


def _window_values(run, metric: str) -> np.ndarray | None:
    """(L + 1, n_w) of ``metric`` from the run's ``window_values.npy`` (``run/write.py``), or None."""
    listed = (run.manifest.get("window_values") or {}).get("metrics") or []
    path = Path(run.path) / "window_values.npy"
    if metric not in listed or not path.is_file():
        return None
    try:
        values = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if values.ndim != 3 or values.shape[0] != len(listed):
        return None
    return values[listed.index(metric)].astype(np.float64)


def duplicate_runs(runs: list) -> dict[int, int]:
    """{index: the earlier index it duplicates} for runs whose manifests record the same weights
    (``model.weights_sample_sha256``, ``models/fingerprint.py``)."""
    return earlier_duplicates([(run.manifest.get("model") or {}).get("weights_sample_sha256") for run in runs])


def emergence_of(runs: list, xs: list[float], metric: str) -> dict | None:
    """The model's and each layer's emergence step of ``metric`` along the series, runs that duplicate an earlier
    run's weights left out; None unless every other run kept its per-window values on the same windows."""
    from sinkscope.stats.emergence import emergence

    duplicates = duplicate_runs(runs)
    kept = [k for k in range(len(runs)) if k not in duplicates]
    matrices = [_window_values(runs[k], metric) for k in kept]
    if len(kept) < 2 or any(m is None for m in matrices) or len({m.shape for m in matrices}) != 1:
        return None
    stacked = np.stack(matrices)  # (K, L + 1, n_w)
    order = np.argsort([xs[k] for k in kept])
    x = np.asarray([xs[k] for k in kept])[order]
    stacked = stacked[order]
    if np.any(np.diff(x) <= 0):
        return None
    out = {"model": emergence(x, stacked[:, -1]), "layers": {}, "left_out": {runs[k].label: runs[j].label
                                                                            for k, j in duplicates.items()}}
    for layer in range(stacked.shape[1] - 1):
        if not np.isnan(stacked[:, layer]).any():
            out["layers"][layer] = emergence(x, stacked[:, layer])
    return out


def _at(step: float, names: dict[float, str] | None) -> str:
    if np.isnan(step):
        return "—"
    return f"{step:.2f} (position)" if names else f"{step:,.0f}"


def _emergence_note(found: dict, names: dict[float, str] | None) -> str:
    model = found["model"]
    if np.isnan(model.step):
        said = f"the model value never crosses {model.threshold:.4g}"
    else:
        said = (f"emergence step (the model value first crosses {model.threshold:.4g}, half-way between its first and "
                f"last value, {'rising' if model.rising else 'falling'}): {_at(model.step, names)}, 95% interval "
                f"{_at(model.low, names)} to {_at(model.high, names)} (bootstrap over {model.n_windows} windows; the "
                "dashed line and the grey band)")
    left = found["left_out"]
    if left:
        said += "; left out as duplicates of an earlier checkpoint's weights: " + ", ".join(
            f"{name} (= {earlier})" for name, earlier in left.items())
    return said + "."


def _emergence_entry(metric: str, info: MetricInfo, found: dict, names: dict[float, str] | None) -> dict:
    """A table of the model's and each layer's emergence step with its interval."""
    rows = [["model", *_emergence_cells(found["model"], names)]]
    rows += [[f"layer {layer}", *_emergence_cells(value, names)] for layer, value in found["layers"].items()]
    return {"metric": f"{metric}_emergence",
            "info": MetricInfo(f"{info.label or metric}: emergence step", "step",
                               "the interpolated first crossing of the half-way threshold, 95% bootstrap interval "
                               "over windows", "SPEC.md 'The emergence step'; stats/emergence.py", ""),
            "note": None, "figures": [],
            "table": {"columns": ["line", "threshold", "emergence step", "95% interval", "no crossing (replicates)"],
                      "rows": rows, "collapsed": len(rows) > COLLAPSE_ROWS}}


def _emergence_cells(value, names) -> list[str]:
    return [f"{value.threshold:.4g}", _at(value.step, names), f"{_at(value.low, names)} to {_at(value.high, names)}",
            "—" if np.isnan(value.no_crossing) else f"{100 * value.no_crossing:.0f}%"]


def _mark_emergence(fig, model) -> None:
    """The model's emergence step (dashed) and its interval (a grey band) on the figure's axes."""
    if np.isnan(model.step):
        return
    ax = fig.axes[0]
    ax.axvline(model.step, color="black", linestyle="--", linewidth=1.0, label="emergence step")
    if not (np.isnan(model.low) or np.isnan(model.high)):
        ax.axvspan(model.low, model.high, color="grey", alpha=0.18, linewidth=0)
    ax.axhline(model.threshold, color="grey", linestyle=":", linewidth=0.8)


# ---- a trainer checkpoint's monitor ---------------------------------------------------------------------


def read_monitor(folder: str | Path) -> tuple[pd.DataFrame, int | None] | None:
    """A checkpoint's ``monitor.csv`` and its windows' length (``monitor.json``), or None without one."""
    from sinkscope.errors import SinkscopeError
    from sinkscope.store.files import read_json

    folder = Path(folder)
    if not (folder / MONITOR_TABLE).is_file():
        return None
    try:
        table = pd.read_csv(folder / MONITOR_TABLE)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise SinkscopeError(f"could not read the monitor table {folder / MONITOR_TABLE} ({error}).") from error
    missing = {"step", "metric", "layer", "head", "value"} - set(table.columns)
    if missing:
        raise SinkscopeError(f"the monitor table {folder / MONITOR_TABLE} lacks the columns {sorted(missing)}.")
    table = _typed_monitor(table, folder / MONITOR_TABLE)
    seq_len = None
    try:  # an unreadable manifest (not JSON, [[[[...]]]]) leaves the windows' length unknown, not an error
        shape = read_json(folder / MONITOR_MANIFEST, "the monitor's manifest", expect=dict).get("windows")
        seq_len = int(shape[1]) if isinstance(shape, list) and len(shape) == 2 else None
    except (SinkscopeError, ValueError, TypeError):
        pass
    return table, seq_len


def _typed_monitor(table: pd.DataFrame, path: Path) -> pd.DataFrame:
    """``table`` with whole steps, numeric values and whole (or empty) layers and heads; a row that
    holds anything else is one sentence naming the file and the row (a line of the csv)."""
    from sinkscope.errors import SinkscopeError

    numbers = {column: pd.to_numeric(table[column], errors="coerce") for column in ("step", "layer", "head", "value")}
    bad = pd.Series(False, index=table.index)
    for column in ("step", "layer", "head"):
        given = table[column].notna() if column != "step" else pd.Series(True, index=table.index)
        whole = numbers[column].notna() & (numbers[column] % 1 == 0) & (numbers[column] >= 0)
        bad |= given & ~whole
    bad |= table["value"].notna() & numbers["value"].isna()
    bad |= table["metric"].isna()
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0])
        shown = "".join(c if c.isprintable() else "?" for c in ", ".join(str(v) for v in table.iloc[row].tolist()))
        raise SinkscopeError(f"the monitor table {path} holds a row that is not a measurement (line {row + 2}: "
                             f"{shown[:120]}); it is damaged: restore it from a copy, or delete it to draw the report "
                             "without the formation curves.")
    table = table.assign(step=numbers["step"].astype("int64"), value=numbers["value"].astype(float),
                         metric=table["metric"].astype(str))
    return table.assign(layer=numbers["layer"].astype("Int64"), head=numbers["head"].astype("Int64"))


FORMATION_NOTE = ("The trainer's monitor (--monitor-every) measured these on the same validation windows at every "
                  "N-th step (monitor.csv in the checkpoint folder). Thin lines: each layer's mean over heads; "
                  "black: the model value. p0 mass carries the uniform floor (dotted); a model without a learned "
                  "phantom key has no phantom-mass curve (it is 0 by construction).")


def monitor_emergence(folder: str | Path, metric: str):
    """The emergence step of ``metric``'s model value over a checkpoint's monitored steps (``monitor_windows.npz``,
    ``train/monitor.py``), or None without per-window values of it at 2 steps or more."""
    from sinkscope.stats.emergence import emergence

    path = Path(folder) / MONITOR_WINDOWS
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as held:
            steps, metrics, values = held["steps"], [str(m) for m in held["metrics"]], held["values"]
    except (OSError, ValueError, KeyError):
        return None
    if metric not in metrics or values.ndim != 4 or len(steps) < 2 or np.any(np.diff(steps) <= 0):
        return None
    return emergence(steps.astype(float), values[:, metrics.index(metric), -1].astype(np.float64))


def formation_figures(monitors: dict[str, tuple[pd.DataFrame, int | None]], keep,
                      labels: figures.MetricLabels | None = None, colours: dict[str, str] | None = None,
                      folders: dict[str, Path] | None = None) -> list[dict]:
    """The training section's formation figures: per layer for one checkpoint, overlaid for several.

    ``labels``: metric labels for the titles and y axes (default: the metrics' names); ``colours``: each
    checkpoint's colour on the page (default: by the order of ``monitors``); ``folders``: each checkpoint's folder,
    whose ``monitor_windows.npz`` gives one checkpoint's emergence step (drawn, and said in the caption).
    """
    colours = colours or figures.run_colours(monitors)
    drawn = []
    present = [m for m in FORMATION_METRICS if any((t["metric"] == m).any() for t, _ in monitors.values())]
    present += sorted({str(m) for t, _ in monitors.values() for m in t["metric"].unique()} - set(present))
    lengths = {seq_len for _, seq_len in monitors.values() if seq_len}
    for metric in present:
        if metric == "phantom_mass":  # zero everywhere: no phantom key, nothing to draw
            if not any((t.loc[t["metric"] == metric, "value"].fillna(0) != 0).any() for t, _ in monitors.values()):
                continue
        floor = uniform_p0(next(iter(lengths))) if metric == "p0_mass" and len(lengths) == 1 else None
        stem = figures._file_stem(metric)
        if len(monitors) == 1:
            (label, (table, _)), = monitors.items()
            lines = curves(table, metric)
            if lines:
                fig = plots.metric_vs_step(lines, metric, floor=floor, labels=labels,
                                           title=f"{figures.metric_title(metric, labels)} through training ({label})")
                caption = f"{metric} against the step, per layer (monitor.csv)"
                found = (monitor_emergence(folders[label], metric)
                         if folders and label in folders and metric in EMERGENCE_METRICS else None)
                if found is not None and not np.isnan(found.step):
                    _mark_emergence(fig, found)
                    caption += (f"; emergence step {_at(found.step, None)}, 95% interval {_at(found.low, None)} to "
                                f"{_at(found.high, None)} over the monitor's {found.n_windows} windows (threshold "
                                f"{found.threshold:.4g}, half-way; dashed line, grey band)")
                drawn.append(keep(fig, f"formation_{stem}", caption))
            continue
        lines = {label: curves(table, metric).get(plots.MODEL_LINE) for label, (table, _) in monitors.items()}
        lines = {label: rows for label, rows in lines.items() if rows is not None}
        if lines:
            fig = plots.metric_vs_step(lines, metric, floor=floor, labels=labels, colours=colours,
                                       title=f"{figures.metric_title(metric, labels)} through training")
            drawn.append(keep(fig, f"formation_{stem}",
                              f"{metric} against the step, model value, one line per checkpoint (monitor.csv)"))
    return drawn


# ---- a trainer checkpoint's log: the "Training" section -------------------------------------------------


def training_section(logs: list[TrainingLog], fig_dir: Path) -> dict:
    """Loss (and head-imbalance) curves of every checkpoint, a table of their losses, their formation curves."""
    keep = _keeper(fig_dir)
    colours = figures.run_colours(t.label for t in logs)  # a checkpoint is one colour in every figure
    drawn = [keep(plots.loss_curves({t.label: t.log for t in logs}, colours), "training_loss", "loss curves")]
    with_cv = {t.label: t.log for t in logs if "load_imbalance" in t.log and t.log["load_imbalance"].notna().any()}
    if with_cv:  # logs written before the trainer logged it have no such column
        drawn.append(keep(plots.imbalance_curves(with_cv, colours), "training_imbalance",
                          "head load imbalance (CV of head importance) at each evaluation"))
    rows = []
    for t in logs:
        val = t.log.dropna(subset=["val_loss"]).sort_values("step")
        rows.append([t.label, str(t.config.get("variant", "—")), str(t.config.get("tier", "—")),
                     str(t.config.get("seed", "—")), str(int(t.log["step"].max())),
                     fmt(val["val_loss"].iloc[0]) if len(val) else "—", fmt(val["val_loss"].iloc[-1]) if len(val) else "—"])
    monitors = {t.label: m for t in logs if (m := read_monitor(t.path)) is not None}
    formation = formation_figures(monitors, keep, colours=colours, folders={t.label: Path(t.path) for t in logs}) \
        if monitors else []
    return {"figures": drawn, "formation": formation, "formation_note": FORMATION_NOTE,
            "table": {"columns": ["checkpoint", "variant", "tier", "seed", "steps", "first val loss", "last val loss"],
                      "rows": rows}}
