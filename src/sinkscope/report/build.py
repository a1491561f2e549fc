"""Run folders -> one self-contained ``report.html`` (figures embedded) plus PNG/SVG beside it.

The report reads only what a run folder holds (``manifest.json``, ``results.parquet``/``.csv``);
it never loads a model, so it can be rebuilt, restyled or combined at any time:

    build_report([run])                  -> run/report.html, run/figures/*
    build_report([run_a, run_b], out=d)  -> d/report.html comparing the runs, d/figures/*

Where it writes follows every writer's rules (no file sinkscope did not write is replaced): a
run's own folder is rebuilt when it holds nothing else; any other ``out`` is written when absent
or empty, and replaced with ``overwrite`` when it holds only sinkscope's files. The page and its
figures are drawn beside ``out`` and renamed into place, and the folder's ``.sinkscope-files``
records them (``build_report``).

A trainer checkpoint folder (``sinkscope train --out ckpt``) may be given too: its ``log.csv``
becomes a "Training" section with the loss curves of every checkpoint on one plot and a table
of the final losses; its ``monitor.csv`` (``--monitor-every``) the sink-formation curves
(``report/steps.py``: p0 mass, phantom mass and value-norm ratio against the step, per layer, or
one line per checkpoint for several).

Runs of one model's checkpoints (a series: every run has a ``step`` or ``revision`` condition,
all distinct; ``sinkscope sinks MODEL --revision A,B,...``) get a first section drawing every
per-layer metric against the step (``report/steps.py``).

With several runs every shared metric gets an overlay of its per-layer line (one line per run),
heatmaps on one shared colour scale, and a side-by-side per-layer table; metrics that not every
run has are listed in a note and left out of the comparison, and runs that differ in seq-len,
corpus or BOS policy get a warning (their numbers are not directly comparable).

The p0-mass figures carry the uniform floor (what p0 would be if every query spread its
attention evenly) as a dashed reference; a model without a learned phantom key gets no
phantom-mass figures (the value is 0 by construction), only a line saying so.

Gate runs (``sinkscope selectivity``): token-identity shares are drawn as bars per layer beside
their heatmap; per-token rows (``token_gate``, a ``token_id`` column) become tables of the most
and least attenuated tokens among those seen at least ``min_count`` times (the run's
``token_share`` option) instead of figures; an output-gate section says that within-row
selectivity is not defined for a query-controlled gate; and a comparison plots the model value
of the gate metrics per run, by tier with one line per variant when the runs span tiers
(seed 000 Fig. 1d).
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd

from sinkscope import __version__
from sinkscope.errors import SinkscopeError
from sinkscope.fileio import (atomic_write_text, check_replaceable, describe_entries, foreign_entries, lock_folder,
                              is_temporary_name, read_inventory, read_json, write_inventory)
from sinkscope.paths import user_path
from sinkscope.results import NOT_CONDITIONS, RUN_FORMAT_VERSION, MetricInfo, read_results

#: Per-layer tables longer than this start collapsed.
COLLAPSE_ROWS = 16


@dataclass
class TrainingLog:
    """A trainer checkpoint's loss log."""

    path: Path
    label: str
    config: dict
    log: pd.DataFrame


def is_training_folder(path: str | Path) -> bool:
    from sinkscope.train.checkpoint import is_checkpoint

    return is_checkpoint(Path(path)) and (Path(path) / "log.csv").is_file()


def read_training(path: str | Path, label: str | None = None) -> TrainingLog:
    folder = Path(path)
    log = pd.read_csv(folder / "log.csv")
    missing = {"step", "train_loss", "val_loss"} - set(log.columns)
    if missing:
        raise SinkscopeError(f"the log.csv of {path} lacks the columns {sorted(missing)}.")
    config = read_json(folder / "config.json", "the checkpoint's config.json", expect=dict)
    return TrainingLog(folder, label or folder.resolve().name, config, log)


def _training_section(logs: list[TrainingLog], fig_dir: Path) -> dict:
    from sinkscope.report import figures

    fig = figures.loss_curves({t.label: t.log for t in logs})
    png, svg = figures.save_figure(fig, fig_dir / "training_loss")
    drawn = [{"title": "loss curves", "src": _embed_png(png), "files": [png.name, svg.name], "kind": "line"}]
    with_cv = {t.label: t.log for t in logs if "load_imbalance" in t.log and t.log["load_imbalance"].notna().any()}
    if with_cv:  # logs written before the trainer logged it have no such column
        png, svg = figures.save_figure(figures.imbalance_curves(with_cv), fig_dir / "training_imbalance")
        drawn.append({"title": "head load imbalance (CV of head importance) at each evaluation",
                      "src": _embed_png(png), "files": [png.name, svg.name], "kind": "line"})
    rows = []
    for t in logs:
        val = t.log.dropna(subset=["val_loss"]).sort_values("step")
        rows.append([t.label, str(t.config.get("variant", "—")), str(t.config.get("tier", "—")),
                     str(t.config.get("seed", "—")), str(int(t.log["step"].max())),
                     fmt(val["val_loss"].iloc[0]) if len(val) else "—", fmt(val["val_loss"].iloc[-1]) if len(val) else "—"])
    from sinkscope.report import steps

    monitors = {t.label: m for t in logs if (m := steps.read_monitor(t.path)) is not None}
    formation = steps.formation_figures(monitors, _keeper(fig_dir)) if monitors else []
    return {"figures": drawn, "formation": formation, "formation_note": steps.FORMATION_NOTE,
            "table": {"columns": ["checkpoint", "variant", "tier", "seed", "steps", "first val loss", "last val loss"],
                      "rows": rows}}


@dataclass
class RunData:
    """One run folder, read (``shown``: the path the page names, e.g. the final folder of a staged run)."""

    path: Path
    label: str
    manifest: dict
    table: pd.DataFrame
    shown: str = ""

    def __post_init__(self):
        self.shown = self.shown or str(self.path)


def read_run(path: str | Path, label: str | None = None) -> RunData:
    """Read and check a run folder (one-sentence errors for anything that is not one)."""
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
    return RunData(folder, label or folder.resolve().name, manifest, read_results(folder))


# ---- formatting -----------------------------------------------------------------------------


def fmt(value) -> str:
    """Numbers as the report prints them: 6 significant digits, NaN as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return "—"
    return f"{float(value):.6g}"


def _metric_docs(runs: list[RunData]) -> dict[str, MetricInfo]:
    """Metric documentation as the runs' manifests recorded it (the report imports no probe).

    Also handed to the figures (labels, units, KV-head axes).
    """
    from sinkscope.report import figures

    docs: dict[str, MetricInfo] = {}
    for run in runs:
        for probe in run.manifest.get("probes", {}).values():
            for metric, info in probe.get("metrics", {}).items():
                if isinstance(info, dict):
                    docs.setdefault(metric, MetricInfo(**info))
    figures.register_metric_docs(docs)
    return docs


def _embed_png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


# ---- figures ----------------------------------------------------------------------------------


def _has_heads(table: pd.DataFrame, metric: str) -> bool:
    rows = table[table.metric == metric]
    return bool((rows.layer.notna() & rows["head"].notna()).any())


def _has_layers(table: pd.DataFrame, metric: str) -> bool:
    rows = table[table.metric == metric]
    return bool((rows.layer.notna() & rows["head"].isna()).any())


#: metrics that only mean something for a model with a learned phantom key (gpt-oss sinks, sinklogit).
PHANTOM_METRICS = ("phantom_mass", "sink_logit", "exposure_phantom_mass")
#: per-layer shares drawn as bars (with their heatmap) rather than lines.
BAR_METRIC_PREFIXES = ("token_share",)
#: gate metrics whose model value gets one plot across the runs of a comparison (seed 000 Fig. 1d).
ACROSS_RUN_METRICS = ("gate_selectivity", "gate_mean", "token_share", "out_gate_mean", "out_gate_first")
#: tiers in size order, for the x axis of a comparison across tiers (the trainer's TIERS).
TIER_ORDER = ("micro", "tiny", "10M", "50M", "124M", "350M")
#: rows per token table (most and least attenuated).
TOKEN_TABLE_ROWS = 15
OUTPUT_GATE_NOTE = ("An output gate is query-controlled (one value per query position and channel or head), so "
                    "within-row selectivity, the spread of the gate over the keys one query reads, is not defined "
                    "for it; these are its mean, first-token and sparsity statistics.")


def _has_phantom(run: RunData) -> bool:
    """Whether the run's model has a learned phantom key (its spec; else any non-zero phantom mass)."""
    model = run.manifest.get("model")
    spec = model.get("spec") if isinstance(model, dict) else None
    if isinstance(spec, dict) and "has_phantom" in spec:
        return bool(spec["has_phantom"])
    values = run.table[run.table.metric == "phantom_mass"]["value"]
    return bool((values.fillna(0) != 0).any())


def uniform_p0(seq_len: int) -> float:
    """The p0 mass of uniform attention: the mean over queries i = 1 .. T-1 of 1/(i+1)."""
    if not seq_len or seq_len < 2:
        return float("nan")
    return sum(1.0 / (i + 1) for i in range(1, seq_len)) / (seq_len - 1)


def _seq_len(run: RunData) -> int | None:
    windows = run.manifest.get("windows")
    value = windows.get("seq_len") if isinstance(windows, dict) else None
    return value if isinstance(value, int) else None


def _probe_options(run: RunData, probe: str) -> dict:
    """The options a probe of the run recorded in the manifest (empty if it did not run)."""
    node = (run.manifest.get("probes") or {}).get(probe)
    options = node.get("options") if isinstance(node, dict) else None
    return options if isinstance(options, dict) else {}


def _dormant_below(run: RunData) -> float | None:
    value = _probe_options(run, "head_importance").get("dormant_below")
    return float(value) if isinstance(value, (int, float)) else None


def _heads_note(runs: list[RunData], metric: str) -> str | None:
    """The ``heads`` command's sentences under a metric: which heads are dormant, what zeroing them did."""
    def per_run(run: RunData, text: str) -> str:
        return text if len(runs) == 1 else f"{run.label}: {text}"

    if metric == "dormant":
        parts = []
        for run in runs:
            rows = run.table[(run.table.metric == "dormant") & run.table["head"].notna()]
            imp = run.table[(run.table.metric == "head_importance") & run.table["head"].notna()]
            imp = imp.set_index(["layer", "head"])["value"]
            hit = rows[rows["value"] > 0.5].sort_values(["layer", "head"])
            names = [f"{int(r.layer)}.{int(r['head'])} ({fmt(imp.get((r.layer, r['head'])))})" for _, r in hit.iterrows()]
            shown = ", ".join(names[:60]) + (f", ... ({len(names) - 60} more)" if len(names) > 60 else "")
            below = _dormant_below(run)
            parts.append(per_run(run, f"{len(names)} of {len(rows)} heads have importance below "
                                      f"{fmt(below)}" + (f": {shown} (layer.head (importance))" if names else "")))
        return "Dormant heads — " + "; ".join(parts) + "."
    if metric == "loss_delta":
        parts = []
        for run in runs:
            heads = _probe_options(run, "head_ablation").get("heads") or []
            value = {m: _model_value(run.table, m) for m in ("loss_clean", "loss_ablated", "loss_delta")}
            parts.append(per_run(run, f"zeroing {len(heads)} head(s) at hook_z "
                                      f"({', '.join(map(str, heads[:30]))}{', ...' if len(heads) > 30 else ''}) moves "
                                      f"the loss from {fmt(value['loss_clean'])} to {fmt(value['loss_ablated'])} nats "
                                      f"per token ({float(value['loss_delta']):+.4g})"))
        return "; ".join(parts) + "."
    if _figures_replaced(runs, metric):
        return ("Without output gates the head importance is this implicit gate, so its figures are drawn once, "
                "under head_importance.")
    return None


def _figures_replaced(runs: list[RunData], metric: str) -> bool:
    """Whether a note replaces the metric's figures: ``implicit_gate`` where it is the head importance."""
    return metric == "implicit_gate" and all(_probe_options(r, "head_importance").get("gate") == "implicit"
                                             for r in runs)


def _figures_for_metric(runs: list[RunData], metric: str, fig_dir: Path) -> list[dict]:
    """Draw and save this metric's figures; return [{title, src, files}] for the page."""
    from sinkscope.report import figures

    stem = figures._file_stem(metric)
    out: list[dict] = []
    comparing, position = len(runs) > 1, {id(run): i for i, run in enumerate(runs)}
    # A dashed reference per run, keyed so runs sharing it draw it once: the uniform p0 floor per
    # seq-len, or the dormancy threshold of head importance.
    references: dict = {}
    key_of = _seq_len
    what = "uniform attention"
    if metric == "p0_mass":  # the uniform floor, per seq-len in the runs
        references = {t: uniform_p0(t) for t in sorted({_seq_len(r) for r in runs} - {None})}
    elif metric == "head_importance":  # heads below the line are dormant
        key_of, what = _dormant_below, "dormant below"
        references = {b: b for b in sorted({_dormant_below(r) for r in runs} - {None})}

    def reference_of(run: RunData) -> float | None:
        return references.get(key_of(run))

    def reference_label(key) -> str:
        if metric != "p0_mass":
            return f"{what} {key:g}"
        where = f", seq-len {key}" if len(references) > 1 else ""
        return f"uniform attention{where} ({references[key]:.3g})"

    def keep(fig, name: str, title: str) -> None:
        png, svg = figures.save_figure(fig, fig_dir / name)
        kind = "heatmap" if name.startswith("heatmap") else "line"
        out.append({"title": title, "src": _embed_png(png), "files": [png.name, svg.name], "kind": kind})

    if metric in PHANTOM_METRICS:
        runs = [r for r in runs if _has_phantom(r)]  # zeros by construction say nothing
        if not runs:
            return out
    if comparing and metric in ACROSS_RUN_METRICS:
        points, x_label = _across_runs(runs, metric)
        if len(points):
            keep(figures.model_value_plot(points, metric, x_label=x_label), f"runs_{stem}",
                 f"model value per {x_label} (bars: range over layers)")
    if metric.startswith(BAR_METRIC_PREFIXES) and all(_has_layers(r.table, metric) for r in runs):
        keep(figures.per_layer_bars({r.label: r.table for r in runs}, metric), f"bars_{stem}",
             "per layer" + (", one bar per run" if comparing else "") + " (pooled over the layer's heads)")
    elif all(_has_layers(r.table, metric) for r in runs):
        drawn: set[int] = set()

        def reference_kwargs(run: RunData) -> dict:
            key = key_of(run)
            if key not in references or key in drawn:
                return {}
            drawn.add(key)
            return {"reference": references[key], "reference_label": reference_label(key)}

        if not comparing:
            keep(figures.per_layer_line(runs[0].table, metric, **reference_kwargs(runs[0])), f"layers_{stem}",
                 "per layer" + (f" (dashed: {what})" if drawn else ""))
        else:
            fig = None
            for run in runs:
                if fig is None:
                    fig = figures.per_layer_line(run.table, metric, label=run.label, **reference_kwargs(run))
                    ax = fig.axes[0]
                else:
                    figures.per_layer_line(run.table, metric, label=run.label, ax=ax, **reference_kwargs(run))
            keep(fig, f"overlay_{stem}",
                 "per layer, one line per run" + (f" (dashed: {what})" if drawn else ""))
    heads = [r for r in runs if _has_heads(r.table, metric)]
    if heads:
        values = pd.concat([r.table[(r.table.metric == metric) & r.table["head"].notna()]["value"] for r in heads])
        vmin, vmax = (float(values.min()), float(values.max())) if comparing else (None, None)
        for run in heads:
            title = run.label if comparing else None
            fig = figures.layer_head_heatmap(run.table, metric, title=title, vmin=vmin, vmax=vmax,
                                             reference=reference_of(run))
            suffix = f"_run{position[id(run)]}" if comparing else ""
            mark = f" (dashed on the colour bar: {what})" if reference_of(run) is not None else ""
            keep(fig, f"heatmap_{stem}{suffix}", f"layer x head{': ' + run.label if comparing else ''}{mark}")
    return out


def _keeper(fig_dir: Path):
    """``keep(fig, stem, title)``: save a figure beside the page and describe it for the template."""
    from sinkscope.report import figures

    def keep(fig, name: str, title: str) -> dict:
        png, svg = figures.save_figure(fig, fig_dir / name)
        return {"title": title, "src": _embed_png(png), "files": [png.name, svg.name], "kind": "line"}
    return keep


def _across_runs(runs: list[RunData], metric: str) -> tuple[pd.DataFrame, str]:
    """One point per run: its model value and the range of its layer values; by tier when the runs span tiers."""
    rows = []
    for run in runs:
        table = run.table[run.table.metric == metric]
        model = table[table.layer.isna() & table["head"].isna()]["value"]
        layers = table[table.layer.notna() & table["head"].isna()]["value"]
        if model.empty:
            continue
        rows.append({"run": run.label, "tier": _condition(run, "tier"), "variant": _condition(run, "variant"),
                     "value": float(model.iloc[0]), "lo": float(layers.min()) if len(layers) else float("nan"),
                     "hi": float(layers.max()) if len(layers) else float("nan")})
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame, "run"
    tiers = [t for t in frame["tier"] if t is not None]
    if len(tiers) == len(frame) and len(set(tiers)) > 1 and frame["variant"].notna().all():
        order = {t: i for i, t in enumerate(TIER_ORDER)}
        frame = frame.assign(x=frame["tier"].astype(str), series=frame["variant"].astype(str))
        frame = frame.sort_values("x", key=lambda col: col.map(lambda t: (order.get(t, len(order)), t)), kind="stable")
        return frame, "tier"
    return frame.assign(x=frame["run"], series="runs"), "run"


def _condition(run: RunData, key: str):
    """A run's condition (variant, tier, ...) from its manifest, its grouping, or None."""
    conditions = run.manifest.get("conditions") or {}
    grouped = run.manifest.get("grouped") or {}
    if grouped.get("by") == key:
        return grouped.get("value")
    value = conditions.get(key)
    return None if value is None else str(value)


# ---- tables ----------------------------------------------------------------------------------


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


def _model_value(table: pd.DataFrame, metric: str):
    rows = table[(table.metric == metric) & table.layer.isna()]
    if "layer_type" in rows.columns:  # the sliding / full means are not the model value
        rows = rows[rows["layer_type"].isna()]
    return rows["value"].iloc[0] if len(rows) else None


LAYER_TYPE_NOTE = ("Models with sliding-window layers: each metric's mean over the sliding layers and over the full "
                   "ones (per-layer means over heads, averaged over the layers of the type; seed 000 Table 14). On a "
                   "sliding layer queries i >= W cannot see key 0 and count as 0 in p0_mass; p0_mass_in_reach "
                   "averages over the queries that can see it and p0_out_of_reach is the share that cannot, so "
                   "'no sink' reads apart from 'sink out of reach'; sink_rate_in_reach and sink_alpha_in_reach do "
                   "the same for Gu et al.'s sink rate.")


def _layer_type_section(runs: list[RunData]) -> dict | None:
    """One table per run: metric | sliding | full (the ``layer_type`` rows), or None without them."""
    tables = []
    for run in runs:
        table = run.table
        if "layer_type" not in table.columns or not table["layer_type"].notna().any():
            continue
        split = table[table["layer_type"].notna() & table.layer.isna() & table["head"].isna()]
        others = [c for c in split.columns if c not in (*NOT_CONDITIONS, "layer_type")
                  and split[c].notna().any()]
        rows = []
        for (metric, *rest), part in split.groupby(["metric", *others], sort=False, dropna=False):
            values = dict(zip(part["layer_type"], part["value"]))
            name = metric + "".join(f" ({c}={v})" for c, v in zip(others, rest) if not pd.isna(v))
            rows.append([name, fmt(values.get("sliding")), fmt(values.get("full"))])
        tables.append({"caption": f"{run.label}: mean over sliding and over full layers", "columns":
                       ["metric", "sliding layers", "full layers"], "rows": rows})
    return {"probe": "layer_types", "entries": [], "note": LAYER_TYPE_NOTE, "tables": tables} if tables else None


def fmt_se(value, se) -> str:
    """``value ± se`` where the row has a standard error over windows (SPEC.md "Averages"), else ``value``."""
    if se is None or pd.isna(se):
        return fmt(value)
    return f"{fmt(value)} ± {fmt(se)}"


def _layer_table(runs: list[RunData], metric: str) -> dict:
    """Per-layer rows: layer, then per run the layer value (and min/max over heads for one run).

    A layer value that is a mean over windows reads ``value ± se`` (one standard error over the
    windows, the ``se`` column).
    """
    single = len(runs) == 1
    columns = ["layer"] + ([f"{metric}", "min over heads", "max over heads", "n"] if single
                           else [run.label for run in runs])
    per_run = []
    for run in runs:
        rows = run.table[run.table.metric == metric]
        layer_rows = rows[rows.layer.notna() & rows["head"].isna()].set_index("layer")
        if "se" not in layer_rows.columns:
            layer_rows = layer_rows.assign(se=math.nan)
        heads = rows[rows.layer.notna() & rows["head"].notna()].groupby("layer")["value"].agg(["min", "max"])
        per_run.append((layer_rows, heads))
    layers = sorted(set().union(*[set(lr.index.astype(int)) for lr, _ in per_run]))
    body = []
    for layer in layers:
        if single:
            layer_rows, heads = per_run[0]
            row = layer_rows.loc[layer]
            lo, hi = (heads.loc[layer, "min"], heads.loc[layer, "max"]) if layer in heads.index else (None, None)
            body.append([str(layer), fmt_se(row["value"], row["se"]), fmt(lo), fmt(hi), str(int(row["n"]))])
        else:
            body.append([str(layer)] + [fmt_se(lr.loc[layer, "value"], lr.loc[layer, "se"]) if layer in lr.index
                                        else "—" for lr, _ in per_run])
    return {"columns": columns, "rows": body, "collapsed": len(body) > COLLAPSE_ROWS}


#: the exposure section's note: the averaging convention beside p0_mass's.
EXPOSURE_NOTE = ("Quiet and phantom mass are averaged over every query, row 0 included, as seed 000's Tables 3 and 11 "
                 "are (p0_mass and phantom_mass average over queries i >= 1); the quiet set is the reads of a value "
                 "head with norm strictly below the median or 25th percentile of that window's read norms.")
INJECTION_NOTE = ("Each condition adds junk of norm eps x the head's median read norm to every quiet read (norm "
                  "strictly below the cutoff) of every value head in every layer, before any gate; the quiet set, "
                  "m_h and transplanted junk come from the clean pass of the same batch (junk source clean; "
                  "'corrupted': from the reads each layer receives under corruption). The loss increase is the mean "
                  "next-token loss under corruption, over the seeded draws of the junk, minus the clean loss on the "
                  "same windows; error bars and ± are one standard error over windows (sd with n - 1, over sqrt n; "
                  "each window's increase averaged over its draws). The y axis is logarithmic: increases <= 0 are "
                  "not drawn (the table has them).")


def _injection_points(run: RunData, metric: str = "inject_loss_delta") -> pd.DataFrame:
    """The run's rows of one injection metric: columns junk, cutoff, dose, value, se (the row's ``se``; the
    ``_se`` row of a run made in 2026-12 before the column; NaN where the run has none: one window, or a
    run made before standard errors)."""
    table = run.table
    if "junk" not in table.columns:
        return pd.DataFrame(columns=["junk", "cutoff", "dose", "value", "se"])

    def rows_of(name: str, column: str = "value") -> pd.DataFrame:
        rows = table[(table.metric == name) & table["junk"].notna()]
        values = rows[column].astype(float) if column in rows.columns else float("nan")
        return pd.DataFrame({"junk": rows["junk"].astype(str), "cutoff": rows["cutoff"].astype(str),
                             "dose": rows["dose"].astype(float), column: values})

    points = rows_of(metric).merge(rows_of(metric, "se"), on=["junk", "cutoff", "dose"], how="left")
    if (table.metric == f"{metric}_se").any() and points["se"].isna().all():  # the separate rows of early 2026-12
        legacy = rows_of(f"{metric}_se").rename(columns={"value": "se"})
        points = points.drop(columns="se").merge(legacy, on=["junk", "cutoff", "dose"], how="left")
    return points


def _injection_caption(runs: list[RunData]) -> str:
    """The table's caption: what the ± is, with the windows (the manifest's n_seqs) and draws of the runs."""
    windows, draws, sources = set(), set(), set()
    for run in runs:
        if _injection_points(run)["se"].notna().any():
            n = (run.manifest.get("windows") or {}).get("n_seqs")
            if n is None:
                n = (run.manifest.get("options") or {}).get("n_seqs")
            if n is not None:
                windows.add(int(n))
        options = ((run.manifest.get("probes") or {}).get("injection") or {}).get("options") or {}
        draws.add(int(options.get("draws", 1)))
        sources.add(str(options.get("junk_source", "clean")))
    caption = "Loss increase (nats / token) per junk type, cutoff and dose"
    if windows:
        over = f"the {windows.pop()} windows" if len(windows) == 1 else "each run's windows"
        k = draws.pop() if len(draws) == 1 else None
        its = "its draws" if k is None else f"its {k} draws" if k > 1 else "its one draw"
        caption += f"; mean ± one standard error over {over} (each window's increase averaged over {its} of the junk)"
    if sources != {"clean"}:
        caption += f"; junk source {', '.join(sorted(sources))}"
    return caption


def _pm(value: float, se: float) -> str:
    """``+3.18 ± 0.21`` (four significant figures, the se two), or the value alone without an se."""
    return f"{value:+.4g}" if pd.isna(se) else f"{value:+.4g} ± {se:.2g}"


def _injection_section(runs: list[RunData], metrics: list[str], docs: dict, fig_dir: Path, summary: list) -> dict:
    """The injection probe's section: one dose-response figure per junk type and one table of every condition."""
    from sinkscope.report import figures

    entries = []
    if "inject_loss_clean" in metrics:
        info = docs.get("inject_loss_clean", MetricInfo("inject_loss_clean", "", "", ""))
        values = [fmt(_model_value(r.table, "inject_loss_clean")) for r in runs]
        summary.append({"metric": "inject_loss_clean", "label": info.label, "direction": info.direction,
                        "values": values})
    points = pd.concat([_injection_points(r).assign(run=r.label) for r in runs], ignore_index=True)
    if points.empty:
        return {"probe": "injection", "entries": entries, "note": INJECTION_NOTE, "tables": []}
    figs = []
    for junk in dict.fromkeys(points["junk"]):
        fig = figures.dose_response(points[points["junk"] == junk], junk)
        png, svg = figures.save_figure(fig, fig_dir / f"dose_response_{figures._file_stem(junk)}")
        figs.append({"title": f"loss increase against dose, {junk} junk (one line per cutoff"
                              + (" and run" if len(runs) > 1 else "") + ")",
                     "src": _embed_png(png), "files": [png.name, svg.name], "kind": "line"})
    doses = sorted(set(points["dose"]))
    columns = (["run"] if len(runs) > 1 else []) + ["junk", "cutoff"] + [f"eps={d:g}" for d in doses]
    rows = []
    for run in runs:
        mine = points[points["run"] == run.label]
        for (junk, cutoff), part in mine.groupby(["junk", "cutoff"], sort=False):
            by_dose = {d: (v, e) for d, v, e in zip(part["dose"], part["value"], part["se"])}
            rows.append(([run.label] if len(runs) > 1 else []) + [junk, cutoff]
                        + [_pm(*by_dose[d]) if d in by_dose else "—" for d in doses])
    info = docs.get("inject_loss_delta", MetricInfo("inject_loss_delta", "", "", ""))
    entries.append({"metric": "inject_loss_delta", "info": info, "note": None, "figures": figs,
                    "table": {"columns": columns, "rows": rows, "collapsed": False,
                              "caption": _injection_caption(runs)}})
    return {"probe": "injection", "entries": entries, "note": INJECTION_NOTE, "tables": []}


def _exposure_table(runs: list[RunData]) -> dict:
    """Seed 000 Table 11's layout: per run, quiet mass at each cutoff and phantom mass (model values)."""
    metrics = [m for m in ("quiet_mass_median", "quiet_mass_q25", "exposure_phantom_mass")
               if any((r.table.metric == m).any() for r in runs)]
    columns = ["run"] + [{"quiet_mass_median": "quiet (median)", "quiet_mass_q25": "quiet (q25)",
                          "exposure_phantom_mass": "phantom"}[m] for m in metrics]
    rows = [[run.label] + [fmt(_model_value(run.table, m)) for m in metrics] for run in runs]
    return {"caption": "Exposure: share of each row's mass on quiet reads and on the phantom (mean over every query, "
                       "head and layer)", "columns": columns, "rows": rows}


def bos_summary(windows: dict) -> str:
    """What happened at position 0, e.g. "auto: none prepended (the tokenizer's BOS, id 1, is not added by default)"."""
    policy = windows.get("bos_policy", "—")
    bos = windows.get("bos_id")
    if bos is not None:
        why = " (the tokenizer adds it by default)" if policy == "auto" else ""
        return f"{policy}: BOS id {bos} prepended to every window{why}"
    if "tokenizer_bos_id" not in windows:  # written before the manifest recorded the tokenizer's BOS
        return f"{policy}: no BOS prepended"
    tokenizer_bos = windows["tokenizer_bos_id"]
    if tokenizer_bos is None:
        return f"{policy}: no BOS prepended (the tokenizer has no BOS token)"
    if policy == "auto":
        return f"{policy}: no BOS prepended (the tokenizer's BOS, id {tokenizer_bos}, is not added by default)"
    return f"{policy}: no BOS prepended (the tokenizer's BOS is id {tokenizer_bos})"


def _differences(runs: list[RunData], skip: tuple[str, ...] = ()) -> list[str]:
    """Warnings for a comparison of runs whose windows differ in seq-len, corpus or BOS policy."""
    def windows(run):
        return run.manifest.get("windows") if isinstance(run.manifest.get("windows"), dict) else {}

    def corpus(run):
        node = run.manifest.get("corpus") if isinstance(run.manifest.get("corpus"), dict) else {}
        return f"{node.get('name', '—')} ({str(node.get('sha256', '—'))[:12]})"

    checks = [("seq-len", lambda r: windows(r).get("seq_len")), ("corpus", corpus),
              ("BOS policy", lambda r: bos_summary(windows(r)))]
    out = []
    for name, value in checks:
        if name in skip:
            continue
        values = [value(r) for r in runs]
        if len({str(v) for v in values}) > 1:
            listed = "; ".join(f"{r.label}: {v}" for r, v in zip(runs, values))
            out.append(f"The runs differ in {name} ({listed}), so their numbers are not directly comparable.")
    return out


def _attention_read(path: str, relative) -> str:
    """How the run read attention, and the first window's logits check (``runner.check_capture``)."""
    how = ("through transformers' attention interface" if path == "interface" else
           "eager output_attentions (the attention does not call the interface; weights only, memory quadratic "
           "in seq-len)")
    return how + (f"; capture logits check {relative:.1g} of their scale" if isinstance(relative, (int, float)) else "")


def _run_info(runs: list[RunData]) -> dict:
    """The "what was run" table: one column per run."""
    def get(manifest: dict, *keys, default="—"):
        node = manifest
        for key in keys:
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return default if node is None else node

    fields = [
        ("model", lambda m: get(m, "model", "source", "label")),
        ("model source", lambda m: f"{get(m, 'model', 'source', 'kind')}: {get(m, 'model', 'source', 'location')}"),
        ("family", lambda m: get(m, "model", "family")),
        ("attention read", lambda m: _attention_read(get(m, "model", "spec", "attention_path", default="interface"),
                                                     get(m, "capture_check", "relative", default=None))),
        ("corpus", lambda m: get(m, "corpus", "name")),
        ("corpus sha256", lambda m: str(get(m, "corpus", "sha256"))[:16]),
        ("BOS policy", lambda m: bos_summary(m.get("windows") if isinstance(m.get("windows"), dict) else {})),
        ("seq-len", lambda m: get(m, "windows", "seq_len")),
        ("n-seqs", lambda m: get(m, "windows", "n_seqs")),
        ("seed", lambda m: get(m, "windows", "seed")),
        ("dtype", lambda m: get(m, "dtype")),
        ("device", lambda m: get(m, "device")),
        ("sinkscope", lambda m: get(m, "versions", "sinkscope")),
        ("torch", lambda m: get(m, "versions", "torch")),
        ("transformers", lambda m: get(m, "versions", "transformers")),
        ("date", lambda m: get(m, "created")),
        ("command", lambda m: get(m, "command")),
        ("conditions", lambda m: ", ".join(f"{k}={v}" for k, v in (m.get("conditions") or {}).items()) or "—"),
    ]
    return {"columns": ["", *[r.label for r in runs]],
            "rows": [[name, *[str(getter(r.manifest)) for r in runs]] for name, getter in fields]}


# ---- the page ----------------------------------------------------------------------------------


def _ordered_metrics(runs: list[RunData]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """[(probe, [metrics shared by every run, in table order])], and the metrics not shared."""
    first = runs[0].table
    order = list(dict.fromkeys(zip(first.probe.astype(str), first.metric.astype(str))))
    for run in runs[1:]:
        order += [pm for pm in dict.fromkeys(zip(run.table.probe.astype(str), run.table.metric.astype(str)))
                  if pm not in order]
    shared = set.intersection(*[set(r.table.metric.astype(str)) for r in runs])
    by_probe: dict[str, list[str]] = {}
    for probe, metric in order:
        if metric in shared:
            by_probe.setdefault(probe, []).append(metric)
    not_shared = sorted({m for _, m in order} - shared)
    return list(by_probe.items()), not_shared


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


#: metrics drawn against length (per layer) when a run has them.
LENGTH_METRICS = ("p0_mass", "phantom_mass", "implicit_gate", "leak_gap", "leak_phantom_gap")
#: the leak model's prediction drawn dashed beside a metric.
PREDICTED_BY = {"p0_mass": "leak_p0_predicted", "phantom_mass": "leak_phantom_predicted"}
LENGTHS_NOTE = ("Every length is measured on prefixes of the same windows (the same documents from the same "
                "starts; the longest length's windows are the ones saved in tokens.npy). The fixed-gap model of "
                "seed 001 gives a query that sees n keys the sink share 1/(1 + (n-1) e^{-Delta}); Delta is fitted "
                "per head so that the mean over queries i >= 1 reproduces p0_mass at the shortest length, and its "
                "prediction at the longer lengths is drawn dashed. Measured above the dashed line: the sink holds "
                "as context grows (its gap grows with n); below: it leaks more than a fixed gap would.")


def _per_layer(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    rows = table[(table.metric == metric) & table.layer.notna() & table["head"].isna()]
    return pd.DataFrame({"layer": rows.layer.astype(int).to_numpy(), "seq_len": rows["seq_len"].astype(int).to_numpy(),
                         "value": rows["value"].astype(float).to_numpy()})


def _lengths_section(runs: list[RunData], fig_dir: Path) -> dict:
    """Metrics against length per layer, the leak-model fit and its error, for each multi-length run."""
    from sinkscope.report import figures

    docs = _metric_docs(runs)
    keep = _keeper(fig_dir)
    entries = []
    for k, run in enumerate(runs):
        table, lengths = run.table, run_lengths(run)
        suffix = f" ({run.label})" if len(runs) > 1 else ""
        for metric in LENGTH_METRICS:
            if not _has_layers(table, metric) or (metric == "phantom_mass" and not _has_phantom(run)):
                continue
            points = _per_layer(table, metric)
            predicted = None
            fit = PREDICTED_BY.get(metric)
            if fit and _has_layers(table, fit):
                shortest = points[points.seq_len == lengths[0]]
                predicted = pd.concat([shortest, _per_layer(table, fit)])
            floor = {n: uniform_p0(n) for n in lengths} if metric == "p0_mass" else None
            fig = figures.metric_vs_length(points, metric, predicted=predicted, floor=floor)
            info = docs.get(metric, MetricInfo(metric, "", "", ""))
            entries.append({"metric": f"{metric}_vs_length{'_' + str(k) if k else ''}",
                            "info": MetricInfo(f"{info.label} against length{suffix}", info.unit, info.formula,
                                               info.source, info.direction),
                            "note": None, "figures": [keep(fig, f"length_{figures._file_stem(metric)}_run{k}",
                                                           "per layer against seq-len")],
                            "table": _length_table(table, metric, lengths)})
        if _has_layers(table, "leak_delta"):
            info = docs.get("leak_delta", MetricInfo("leak_delta", "", "", ""))
            delta = table[table.metric == "leak_delta"].drop(columns="seq_len")
            fig = figures.layer_head_heatmap(delta, "leak_delta")
            errors = table[(table.metric == "leak_p0_error") & table.layer.isna() & table["head"].isna()]
            if "layer_type" in errors.columns:
                errors = errors[errors["layer_type"].isna()]
            note = "Mean signed error of the prediction over layers: " + ", ".join(
                f"{fmt(v)} at seq-len {int(n)}" for n, v in zip(errors["seq_len"], errors["value"])) + "." \
                if len(errors) else ""
            note = (note + _leak_conditioning_note(run)).strip()
            entries.append({"metric": f"leak_delta{'_' + str(k) if k else ''}",
                            "info": MetricInfo(info.label + suffix, info.unit, info.formula, info.source,
                                               info.direction),
                            "note": note or None,
                            "figures": [keep(fig, f"length_leak_delta_run{k}", "layer x head")],
                            "table": _leak_table(table, lengths)})
    return {"probe": "lengths", "entries": entries, "note": LENGTHS_NOTE, "tables": []}


def _leak_conditioning_note(run: RunData) -> str:
    """Which heads' Delta is ill-conditioned, and on which layers the prediction error is not reported."""
    table, parts = run.table, []
    flags = table[(table.metric == "leak_delta_ill_conditioned") & table["head"].notna()]
    if len(flags):
        parts.append(f" Delta is ill-conditioned (|dDelta/dp0| > 1e3: a p0 error of 0.001 moves it by more than a "
                     f"nat; read it as minus the log of the leak) for {int(flags['value'].sum())} of {len(flags)} heads"
                     " (leak_delta_dp0 per head in the table).")
    skipped = (((run.manifest.get("probes") or {}).get("leak_fit") or {}).get("options") or {}).get(
        "p0_error_not_reported")
    if skipped:
        parts.append(f" The error is not reported on layers {', '.join(map(str, skipped['layers']))}: "
                     f"{skipped['reason']}.")
    return "".join(parts)


def _length_table(table: pd.DataFrame, metric: str, lengths: list[int]) -> dict:
    points = _per_layer(table, metric).pivot(index="layer", columns="seq_len", values="value")
    rows = [[str(layer)] + [fmt(points.loc[layer, n]) if n in points.columns else "—" for n in lengths]
            for layer in points.index]
    return {"columns": ["layer"] + [f"seq-len {n}" for n in lengths], "rows": rows,
            "collapsed": len(rows) > COLLAPSE_ROWS}


def _leak_table(table: pd.DataFrame, lengths: list[int]) -> dict:
    """Per layer: Delta, then per longer length the measured and predicted p0 (layer means over heads)."""
    delta = _per_layer(table, "leak_delta").set_index("layer")["value"]
    measured = _per_layer(table, "p0_mass").pivot(index="layer", columns="seq_len", values="value")
    predicted = _per_layer(table, "leak_p0_predicted").pivot(index="layer", columns="seq_len", values="value")
    flagged = _per_layer(table, "leak_delta_ill_conditioned").set_index("layer")["value"]
    columns = ["layer", "Delta", "Delta ill-conditioned (share of heads)"]
    for n in lengths[1:]:
        columns += [f"p0 @ {n}", f"predicted @ {n}"]
    rows = []
    for layer in delta.index:
        row = [str(layer), fmt(delta[layer]), fmt(flagged[layer]) if layer in flagged.index else "—"]
        for n in lengths[1:]:
            row += [fmt(measured.loc[layer, n]) if n in measured.columns else "—",
                    fmt(predicted.loc[layer, n]) if n in predicted.columns else "—"]
        rows.append(row)
    return {"columns": columns, "rows": rows, "collapsed": len(rows) > COLLAPSE_ROWS,
            "caption": f"Leak-model fit per layer ({len(rows)} layers; Delta in nats, fitted at seq-len {lengths[0]})"}


def build_report(run_dirs: list[str | Path], out: str | Path | None = None,
                 labels: list[str] | None = None, shown_paths: list[str | Path] | None = None,
                 group_by: str | None = None, overwrite: bool = False) -> Path:
    """Write ``report.html`` (+ ``figures/``) for one run or a comparison of several.

    The output folder follows every writer's rules (``fileio.check_replaceable``): absent or
    empty, it is written; holding only what sinkscope wrote, its report is replaced with
    ``overwrite``; holding anything else, it is refused. Rebuilding one run's report in that run
    folder itself (the default for one run) needs no ``overwrite``, only a run folder holding
    nothing sinkscope did not write. The page and the figures are drawn into a hidden staging
    folder inside ``out`` and moved into place with renames (the old ``figures/`` aside first,
    removed once the new one is in place), then the folder's inventory is updated: a crash
    leaves the old report or the new one, never a mix.

    Args:
        run_dirs: run folders written by a sinkscope command.
        out: output folder; default: the run folder itself for one run,
            ``reports/compare-<time>`` for several (a fresh name).
        labels: names for the runs (default: folder names).
        shown_paths: the paths the page names for the runs (default: ``run_dirs``); a run
            written into a staging folder names its final folder.
        group_by: a condition column (``variant``, ``seed``, ``step``, ``tier``): runs sharing its
            value are averaged and compared as one (see :func:`group_runs`).
        overwrite: replace the report of an output folder that already holds sinkscope's files.

    Returns:
        The path of the written ``report.html``.
    """
    if not run_dirs:
        raise SinkscopeError("give at least one run folder to build a report from.")
    run_dirs = [user_path(run, "RUN") for run in run_dirs]  # "~/runs/x" as a launcher quotes it
    out = user_path(out, "--out")
    labels = labels or [None] * len(run_dirs)
    trainings = [read_training(p, l) for p, l in zip(run_dirs, labels) if is_training_folder(p)]
    runs = [read_run(p, l) for p, l in zip(run_dirs, labels) if not is_training_folder(p)]
    if shown_paths is not None:
        for run, shown in zip(runs, shown_paths):
            run.shown = str(shown)
    if group_by:
        runs = group_runs(runs, group_by)
    one_run = len(runs) == 1
    runs, several_lengths = split_lengths(runs)
    seen: dict[str, int] = {}
    for run in runs:  # distinct labels for the legend
        if run.label in seen:
            seen[run.label] += 1
            run.label = f"{run.label} ({seen[run.label]})"
        else:
            seen[run.label] = 1
    if out is None:
        if one_run and not trainings and not group_by:
            out = runs[0].path
        else:
            out = _fresh_folder(Path("reports") / f"{'compare' if runs else 'training'}-{datetime.now():%Y%m%d-%H%M%S}")
    out = Path(out)
    own_run = len(run_dirs) == 1 and not trainings and _same_folder(out, Path(run_dirs[0]))
    _beside(out).mkdir(parents=True, exist_ok=True)
    with lock_folder(out, kind="report"):  # .NAME.lock beside out (a run folder's own lock)
        _remove_stale_temporaries(out)  # a killed build's staging folder (ours by name; we hold the lock)
        _check_report_folder(out, overwrite, own_run)
        made = not out.exists()
        out.mkdir(exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{_name(out)}.report-", dir=_beside(out)))
        try:
            fig_dir = stage / "figures"
            fig_dir.mkdir()
            html = _render_page(runs, trainings, several_lengths, one_run, fig_dir)
            atomic_write_text(stage / "report.html", html)
            writer, trees = _check_report_folder(out, overwrite, own_run)  # nothing of anyone else's appeared
            # the new names are recorded before they arrive, so a crash while moving leaves no file unrecorded
            staged = ["report.html", *(f"figures/{entry.name}" for entry in fig_dir.iterdir())]
            write_inventory(out, writer, trees=trees, keep=staged)
            _install_report(stage, out)
            shutil.rmtree(stage, ignore_errors=True)
            write_inventory(out, writer, trees=trees)  # exactly what is there now
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            if made:  # leave no empty folder behind a failed first build
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise
    return out / "report.html"


# ---- where the report goes: checked, locked, staged, moved into place ---------------------------------

#: writers whose folders may hold a report (a run's own, a comparison of several models, a report).
REPORT_WRITERS = ("report", "comparison", "run")
_GENERATOR = b'<meta name="generator" content="sinkscope'


def _same_folder(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _fresh_folder(folder: Path) -> Path:
    """``folder``, or ``folder-2``, ``folder-3``, ... if it exists: a default that never meets an earlier one."""
    candidate, k = folder, 2
    while candidate.exists() or candidate.is_symlink():
        candidate, k = folder.with_name(f"{folder.name}-{k}"), k + 1
    return candidate


def _is_sinkscope_page(path: Path) -> bool:
    """Whether ``path`` is a page sinkscope drew (its generator tag, near the top)."""
    try:
        with open(path, "rb") as handle:
            return _GENERATOR in handle.read(4096)
    except OSError:
        return False


def _is_figure_file(rel: str) -> bool:
    return rel.startswith("figures/") and rel.count("/") == 1 and rel.endswith((".png", ".svg"))


def report_folder_legacy(folder: Path):
    """``legacy`` for ``fileio.foreign_entries``: a report or comparison folder written before inventories.

    Recognised by a ``report.html`` sinkscope drew, or a run folder inside it (a comparison of
    several models written with ``--no-figures``); its files are then the page, ``figures/*.png``
    and ``*.svg``, and the fixed names of the run folders in it (``<run>/results.csv``, ...).
    None for any other folder (a user's ``report.html`` is not recognised).
    """
    from sinkscope.results import is_legacy_run_file, is_run_folder

    folder = Path(folder)
    try:
        children = [entry for entry in folder.iterdir() if entry.is_dir() and not entry.is_symlink()]
    except OSError:
        return None
    runs = {child.name for child in children if is_run_folder(child)}
    if not (_is_sinkscope_page(folder / "report.html") or runs):
        return None

    def legacy(rel: str) -> bool:
        if rel == "report.html":
            return _is_sinkscope_page(folder / rel)
        if _is_figure_file(rel):
            return True
        head, _, rest = rel.partition("/")
        return head in runs and is_legacy_run_file(rest)
    return legacy


def _check_report_folder(out: Path, overwrite: bool, own_run: bool) -> tuple[str, list[str]]:
    """Refuse an output folder the report may not write; returns the writer and trees its inventory keeps.

    One run's own folder is rebuilt without ``overwrite`` when it holds nothing sinkscope did not
    write; any other folder follows ``fileio.check_replaceable`` (with ``overwrite`` for one that
    already holds sinkscope's files), and must be a report's, a comparison's or a run's.
    """
    from sinkscope.results import run_folder_legacy

    inventory = read_inventory(out) if out.is_dir() else None
    trees = inventory["trees"] if inventory else []
    if own_run:
        legacy = run_folder_legacy(out)
        foreign = foreign_entries(out, legacy)
        if foreign or (inventory is None and legacy is None):
            what = describe_entries(foreign) if foreign else "no record of what wrote it"
            raise SinkscopeError(f"the run folder {out} holds files sinkscope did not write ({what}); sinkscope "
                                 "rebuilds a run's report only in a folder holding nothing else: build it elsewhere "
                                 "with --out DIR, or move them.")
        return "run", trees
    if inventory is not None and inventory["writer"] not in REPORT_WRITERS:
        raise SinkscopeError(f"the folder {out} was written by sinkscope's {inventory['writer'] or 'unknown'} writer, "
                             "not by a report; choose another --out.")
    check_replaceable(out, overwrite, kind="report", legacy=report_folder_legacy(out),
                      hint="pass --overwrite to replace its report")
    if inventory is not None:
        return inventory["writer"], trees
    from sinkscope.results import is_run_folder  # a comparison of several models written before inventories

    held = [child for child in out.iterdir() if child.is_dir() and not child.is_symlink()] if out.is_dir() else []
    return ("comparison" if any(is_run_folder(child) for child in held) else "report"), trees


def _name(out: Path) -> str:
    return Path(os.path.abspath(out)).name


def _beside(out: Path) -> Path:
    """The folder holding ``out`` (where its lock and the report's temporaries go)."""
    return Path(os.path.abspath(out)).parent


def _remove_stale_temporaries(out: Path) -> None:
    """A killed build's staging folder or set-aside figures beside ``out`` (ours by name; we hold the lock)."""
    prefixes = (f".{_name(out)}.report-", f".{_name(out)}.figures.old-")
    for entry in _beside(out).iterdir():
        if (entry.name.startswith(prefixes) and is_temporary_name(entry.name) and entry.is_dir()
                and not entry.is_symlink()):
            shutil.rmtree(entry, ignore_errors=True)


def _install_report(stage: Path, out: Path) -> None:
    """Move the staged ``figures/`` and ``report.html`` into ``out`` (old figures aside, then removed)."""
    figures_dir = out / "figures"
    old = None
    if figures_dir.exists() or figures_dir.is_symlink():
        old = _beside(out) / f".{_name(out)}.figures.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(figures_dir, old)
    os.replace(stage / "figures", figures_dir)
    os.replace(stage / "report.html", out / "report.html")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _render_page(runs: list[RunData], trainings: list[TrainingLog], several_lengths: list[RunData], one_run: bool,
                 fig_dir: Path) -> str:
    """Draw every figure into ``fig_dir`` and return the page's HTML."""
    training = _training_section(trainings, fig_dir) if trainings else None
    from sinkscope.report import circuit as circuit_report
    docs = _metric_docs(runs)
    probes, not_shared = _ordered_metrics(runs) if runs else ([], [])
    sections = []
    summary = []
    for probe, metrics in probes:
        if probe == "injection":
            sections.append(_injection_section(runs, metrics, docs, fig_dir, summary))
            continue
        if probe == "stream":
            from sinkscope.report import stream as stream_report

            sections.append(stream_report.section(runs, docs, fig_dir, summary, _embed_png))
            continue
        entries = []
        for metric in metrics:
            info = docs.get(metric, MetricInfo(metric, "", "", ""))
            if circuit_report.handles(metric):  # `sinkscope circuit`: rows with position/condition columns
                if metric in circuit_report.DRAWN:
                    summary.append({"metric": metric, "label": circuit_report.SUMMARY_LABEL[metric],
                                    "direction": info.direction,
                                    "values": [fmt(circuit_report.summary_value(r.table, metric)) for r in runs]})
                    entries.append({"metric": metric, "info": info,
                                    **circuit_report.entry(runs, metric, fig_dir, _keeper(fig_dir))})
                continue
            if _is_token_metric(runs, metric):
                entries.append({"metric": metric, "info": info, "note": None, "figures": [], "table": None,
                                "token_tables": [_token_tables(r, metric) for r in runs]})
                continue
            summary.append({"metric": metric, "label": info.label, "direction": info.direction,
                            "values": [fmt(_model_value(r.table, metric)) for r in runs]})
            no_phantom = [r for r in runs if not _has_phantom(r)] if metric in PHANTOM_METRICS else []
            note = _heads_note(runs, metric)
            if no_phantom:
                names = ", ".join(r.label for r in no_phantom)
                note = (f"{'The model' if len(runs) == 1 else names} has no learned phantom key, so its {metric} is 0 "
                        f"by construction; no figures are drawn{' for it' if len(runs) > 1 else ''}.")
            replaced = _figures_replaced(runs, metric)
            entries.append({
                "metric": metric, "info": info, "note": note,
                "figures": [] if replaced else _figures_for_metric(runs, metric, fig_dir),
                "table": _layer_table(runs, metric) if all(_has_layers(r.table, metric) for r in runs)
                and len(no_phantom) < len(runs) and not replaced else None,
            })
        note = OUTPUT_GATE_NOTE if any(m.startswith("out_gate_") for m in metrics) else None
        tables = [_exposure_table(runs)] if probe == "exposure" else []
        if probe == "exposure":
            note = EXPOSURE_NOTE
        sections.append({"probe": probe, "entries": entries, "note": note, "tables": tables})
    if len(runs) > 1:  # a series of checkpoints (--revision A,B,...): every metric against the step
        from sinkscope.report import steps

        drawable = [metric for probe, metrics in probes if probe != "injection" for metric in metrics
                    if not circuit_report.handles(metric) and not _is_token_metric(runs, metric)
                    and all(_has_layers(r.table, metric) for r in runs)
                    and (metric not in PHANTOM_METRICS or all(_has_phantom(r) for r in runs))]
        series = steps.series_section(runs, drawable, fig_dir, _keeper(fig_dir))
        if series:
            sections.insert(0, series)
    if several_lengths:
        sections.append(_lengths_section(several_lengths, fig_dir))
    layer_types = _layer_type_section(runs)
    if layer_types:
        sections.append(layer_types)

    exceptions = [text for prefix, text in (("massive_activation", "massive activations: the largest over layers"),
                                            ("token_share", "token-identity shares: pooled over every head of every "
                                                            "layer, sum of between SS / sum of total SS"))
                  if any(row["metric"].startswith(prefix) for row in summary)]
    aggregates_note = ("Model-level values: the mean over layers of per-layer means over heads"
                       + (f" ({'; '.join(exceptions)})" if exceptions else "") + ".")
    notes = []
    if not_shared:
        for metric in not_shared:
            have = [r.label for r in runs if (r.table.metric == metric).any()]
            notes.append(f"{metric}: only in {', '.join(have)}; left out of the comparison.")

    from jinja2 import Environment, PackageLoader

    env = Environment(loader=PackageLoader("sinkscope.report", "templates"), autoescape=True)  # every value is text: labels, tokens, paths
    if one_run and several_lengths:
        title = f"sinkscope report: {several_lengths[0].label} at {len(runs)} lengths"
    elif len(runs) == 1:
        title = "sinkscope report: " + runs[0].label
    elif runs:
        title = f"sinkscope comparison of {len(runs)} runs"
    else:
        title = "sinkscope training report: " + ", ".join(t.label for t in trainings)
    html = env.get_template("report.html.j2").render(
        title=title, runs=runs, trainings=trainings, training=training,
        run_info=_run_info(runs) if runs else None, summary=summary, sections=sections, notes=notes,
        aggregates_note=aggregates_note,
        warnings=_differences(runs, skip=("seq-len",) if several_lengths else ()) if len(runs) > 1 else [],
        generated=datetime.now().isoformat(timespec="seconds"), version=__version__,
    )
    return html
