"""``sinkscope sweep``: every variant x every seed, trained, evaluated, probed and compared.

    sinkscope sweep --variants baseline,sinklogit,normgate,projgate,sink+norm,sink+proj \\
        --seeds 0,1,2 --task trigger --out sweeps/trigger

The folder it fills:

    OUT/runs/<variant>-s<seed>/ckpt          the trainer's checkpoint (``sinkscope train``)
    OUT/runs/<variant>-s<seed>/sinks         ``sinkscope sinks`` on it (the task's validation windows)
    OUT/runs/<variant>-s<seed>/selectivity   ``sinkscope selectivity`` (value-gated variants only)
    OUT/losses.csv                           variant, seed, val_loss, step, fingerprint
    OUT/table1.csv, OUT/table2.csv           Wang 2026's Tables 1 and 2 (``sinkscope.stats.paired``)
    OUT/table1_by_step.csv                   Table 1 at every evaluation of the runs' log.csv (step column)
    OUT/sinks.csv                            Wang 2026 Table 15's columns per variant and seed
    OUT/sweep.md, OUT/table1.png             the tables as one page, the improvements as a figure
    OUT/table1_by_step.png                   the improvements over the baseline against the training step
    OUT/sinks.png                            the sink measurements per variant as a figure
    OUT/formation.csv, OUT/formation_*.png   with ``monitor_every``: the monitor's p0 mass, phantom mass
                                             and value-norm ratio against the step, one line per variant
    OUT/compare/report.html                  the probe runs compared on one page, by variant

Evaluation: the loss of a run is the trainer's own final ``val_loss`` (positions i >= 1 of its
fixed validation windows, SPEC.md "Training data (resolved)"). Those windows depend on the task
and its data only, never on the run seed or variant (trigger: the task's seed-0 validation draw;
text: the validation split), so every run is evaluated on the same batches; the sweep checks it by
refusing runs whose data fingerprints or evaluation window counts differ.

Resume: a checkpoint at its last step is finished and skipped; one at an earlier step is
continued with the trainer's ``--resume`` (bitwise the uninterrupted result on CPU); a folder the
trainer left without a checkpoint (stopped before the first) starts over. A probe run folder that
exists is kept. Running the same command again therefore only does what is missing.

The folder is the sweep's own: a folder holding anything sinkscope did not write, or another
writer's folder (a run, a report, a checkpoint), is refused; the sweep's files are recorded in its
inventory (``.sinkscope-files``, at the start and after the tables; ``engine/`` and an older
sweep's ``submitit/`` are the sweep's whole), a folder written before inventories is recognised by its ``sweep.json`` and the fixed
names above, and ``.NAME.lock`` beside the folder keeps a second sweep out while one runs.

Engines (``executors``, docs/scaling.md): one run after the other in this process (default);
``jobs > 1`` runs them as that many local processes (each limited to its share of the CPU threads);
``--executor ray`` as Ray tasks and ``--executor slurm`` (or ``launcher="submitit"``) as one SLURM
job array through submitit. Each run is one job with its log in ``engine/logs/``; a run that fails
fails alone. The tables are written by this process once every run is there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sinkscope.errors import SinkscopeError, option

LAUNCHERS = ("local", "submitit")
#: Table 15's measurements: (column, probe metric, scale). p0 and phantom mass as percentages.
SINK_COLUMNS = (("p0_pct", "p0_mass", 100.0), ("phantom_pct", "phantom_mass", 100.0),
                ("value_norm_ratio", "value_norm_ratio", 1.0), ("sink_rate", "sink_rate", 1.0))
GATE_COLUMNS = (("gate_selectivity", "gate_selectivity", 1.0), ("gate_mean", "gate_mean", 1.0))


@dataclass
class SweepOptions:
    """Everything ``sinkscope sweep`` takes."""

    variants: tuple[str, ...] = ("baseline", "sinklogit", "normgate", "projgate", "sink+norm", "sink+proj")
    seeds: tuple[int, ...] = (0, 1, 2)
    task: str = "trigger"  # trigger | text (the trainer's tasks)
    tier: str | None = None  # None = the task's default tier (micro for trigger, tiny for text)
    out: str = "sweeps/sweep"
    steps: int | None = None  # None = the tier's
    batch_size: int | None = None
    eval_windows: int = 64  # the trainer's fixed validation windows (the losses of the tables)
    task_options: list[str] = field(default_factory=list)  # --task-set key=value
    text_file: str | None = None  # text task: train on this file instead of the bundled corpus
    tokenizer: str | None = None  # text task: as for train (default bpe4096)
    windows: str | None = None  # text task: doc-start (default) | random
    overrides: list[str] = field(default_factory=list)  # --set key=value on the model (every run)
    n_seqs: int = 64  # windows the probes measure (the task's validation windows)
    probe: bool = True  # run sinks and selectivity on every checkpoint
    jobs: int = 1  # runs at once (local processes)
    launcher: str = "local"  # local | submitit (SLURM)
    slurm: list[str] = field(default_factory=list)  # submitit parameters key=value (e.g. slurm_partition=gpu)
    device: str = "auto"
    report: bool = True  # the comparison page and the figure
    monitor_every: int | None = None  # the trainer's sink monitor every N steps (formation curves per variant)

    def __post_init__(self):
        from sinkscope.store.files import expand_paths

        expand_paths(self, out="--out", text_file="--text-file", tokenizer="--tokenizer")


def parse_list(text: str | None, what: str, cast=str) -> tuple:
    """``a,b,c`` -> ("a", "b", "c") (no empties, no duplicates)."""
    items = [item.strip() for item in str(text or "").split(",") if item.strip()]
    if not items:
        raise SinkscopeError(f"--{what} needs at least one value (comma-separated).")
    try:
        values = tuple(cast(item) for item in items)
    except ValueError:
        raise SinkscopeError(f"--{what} takes comma-separated {cast.__name__} values, not {text!r}.") from None
    if len(set(values)) != len(values):
        raise SinkscopeError(f"--{what} lists a value twice ({text!r}).")
    return values


def check(options: SweepOptions) -> None:
    """Every mistake a user can make, in one sentence, before anything is trained."""
    from sinkscope.train.config import resolve_options

    if not options.variants or not options.seeds:
        raise SinkscopeError("a sweep needs at least one variant and one seed.")
    if options.launcher not in LAUNCHERS:
        raise SinkscopeError(f"unknown --launcher {options.launcher!r}; use {' or '.join(LAUNCHERS)}.")
    if not isinstance(options.jobs, int) or options.jobs < 1:
        raise SinkscopeError(f"--jobs must be a positive integer, not {options.jobs!r}.")
    if options.n_seqs < 1:
        raise SinkscopeError(f"{option('n_seqs')} must be at least 1, not {options.n_seqs}.")
    for seed in options.seeds:
        if not isinstance(seed, int) or seed < 0:
            raise SinkscopeError(f"seeds must be non-negative integers, not {seed!r}.")
    for variant in options.variants:  # resolve_options refuses unknown variants, tiers, tasks, options
        resolve_options(train_options(options, variant, options.seeds[0]))


def run_dir(options: SweepOptions, variant: str, seed: int) -> Path:
    return Path(options.out) / "runs" / f"{variant}-s{seed}"


def train_options(options: SweepOptions, variant: str, seed: int):
    from sinkscope.train.config import TrainOptions

    return TrainOptions(variant=variant, task=options.task, tier=options.tier, seed=seed,
                        out=str(run_dir(options, variant, seed) / "ckpt"), steps=options.steps,
                        batch_size=options.batch_size, eval_windows=options.eval_windows,
                        task_options=list(options.task_options), overrides=list(options.overrides),
                        text_file=options.text_file, tokenizer=options.tokenizer, windows=options.windows,
                        monitor_every=options.monitor_every, device=options.device, progress=False)


def is_gated(variant: str) -> bool:
    """Whether ``selectivity`` measures the variant (a value gate, or the output gate)."""
    from sinkscope.commands.selectivity import OUTPUT_GATED_VARIANTS, VALUE_GATED_VARIANTS

    return variant in VALUE_GATED_VARIANTS + OUTPUT_GATED_VARIANTS


def _state(ckpt: Path, resolved) -> str:
    """``done``, ``partial`` (a checkpoint before the last step), ``stale`` (a folder, no checkpoint) or ``new``.

    A checkpoint trained with other settings (steps, batch, model overrides, task options, ...) is
    refused rather than kept: its loss would not pair with the others'.
    """
    from sinkscope.models.checkpoint_folder import interrupted_save, is_checkpoint, read_config
    from sinkscope.train.config import RESULT_FIELDS

    if not is_checkpoint(ckpt):
        if not ckpt.exists() and interrupted_save(ckpt) is not None:
            return "partial"  # a save killed between its renames: train --resume puts the copy back
        return "stale" if ckpt.exists() else "new"
    meta = read_config(ckpt)
    recorded, wanted = meta.get("train_options", {}), dataclasses.asdict(resolved)
    for name in ("steps", "eval_windows", *RESULT_FIELDS):
        if name in recorded and recorded[name] != wanted[name]:
            raise SinkscopeError(f"the run in {ckpt} was trained with {name}={recorded[name]!r}, this sweep asks for "
                                 f"{wanted[name]!r}; use the sweep's own settings or another {option('out')}.")
    return "done" if int(meta.get("step", -1)) >= resolved.steps else "partial"


def run_one(options: SweepOptions, variant: str, seed: int, threads: int | None = None) -> str:
    """Train (or finish) one run and probe it; returns what was done, one line."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    from sinkscope.train.loop import train
    from sinkscope.train.config import resolve_options

    log = lambda _message: None  # noqa: E731 - the sweep reports per run
    topts = train_options(options, variant, seed)
    ckpt = Path(topts.out)
    state = _state(ckpt, resolve_options(topts))
    if state == "partial":
        train(dataclasses.replace(topts, resume=True), log=log)
    elif state in ("new", "stale"):
        train(dataclasses.replace(topts, overwrite=state == "stale"), log=log)
    done = {"done": "kept", "partial": "resumed", "new": "trained", "stale": "trained"}[state]
    if options.probe:
        for command in ("sinks", "selectivity") if is_gated(variant) else ("sinks",):
            done += f", {_probe(options, command, ckpt, ckpt.parent / command)}"
    return f"{variant} seed {seed}: {done}"


def _probe(options: SweepOptions, name: str, ckpt: Path, out: Path) -> str:
    from sinkscope.commands import get_command
    from sinkscope.run.dispatch import measure_command
    from sinkscope.store.results import is_run_folder

    if is_run_folder(out):
        return f"{name} kept"
    command = get_command(name)
    probe_options = command.options(model=str(ckpt), out=str(out), n_seqs=options.n_seqs, seed=0,
                                    device=options.device, progress=False, figures=False, overwrite=out.exists())
    measure_command(command, probe_options, log=lambda _m: None)  # plan (every check) then execute
    return f"{name} measured"


def _run_local(options: SweepOptions, pairs, log) -> None:
    """The runs one after the other in this process (the inventory follows each finished run)."""
    for n, (variant, seed) in enumerate(pairs, 1):
        log(f"[{n}/{len(pairs)}] {variant} seed {seed} ...")
        log(run_one(options, variant, seed))
        _record(Path(options.out))  # nothing else writes now: the inventory follows each finished run


def sweep_executor(options: SweepOptions):
    """The engine the sweep's own options ask for: ``--launcher submitit`` (with its ``--slurm``
    parameters) is ``--executor slurm``; else ``--jobs`` local processes."""
    from sinkscope.executors.settings import ExecutorOptions, check_executor

    if options.launcher == "submitit":
        return check_executor(ExecutorOptions(executor="slurm", slurm_extra=tuple(options.slurm)))
    return check_executor(ExecutorOptions(jobs=options.jobs))


def _run_jobs(options: SweepOptions, pairs, executor_options, log) -> None:
    """Each (variant, seed) one job on ``engine`` (``executors``): its log in ``OUT/engine/logs/``; a run
    that fails fails alone, and the sweep then stops before its tables in one sentence naming each."""
    from sinkscope.executors.jobs import Job
    from sinkscope.executors.settings import gpus_per_run
    from sinkscope.executors.run import cluster_gpus, run_jobs

    out = Path(options.out)
    folder = out / JOBS_FOLDER
    threads = max(1, (os.cpu_count() or 1) // executor_options.jobs) if executor_options.executor == "local" else None
    override = {"ray": executor_options.ray_gpus_per_run, "slurm": executor_options.slurm_gpus_per_run}.get(executor_options.executor)
    gpus = gpus_per_run(options.device, None, override, cluster_gpus(executor_options))
    jobs = [Job(f"{variant}-s{seed}", str(folder / "logs" / f"{variant}-s{seed}.log"), run_one, (options, variant, seed),
                gpus=gpus, threads=threads) for variant, seed in pairs]
    outcomes = run_jobs(jobs, executor_options, folder, log=log)
    for outcome in outcomes:
        if outcome.ok:
            log(str(outcome.value))  # run_one's line (JSON from a SLURM task: a string too)
    _record(out)
    failed = [outcome for outcome in outcomes if not outcome.ok]
    if failed:
        raise SinkscopeError(f"{len(failed)} of {len(jobs)} runs failed: " + "; ".join(o.failure() for o in failed)
                             + f". The finished runs are kept in {out}: rerun the same command to run only the others.")


def sweep(options: SweepOptions, log=None, executor_options=None) -> Path:
    """Run the sweep (module docstring) on ``engine`` (``executors.settings.ExecutorOptions``; default
    :func:`sweep_engine`); returns ``OUT/sweep.md``."""
    from sinkscope.store.files import atomic_write_text

    log = log or (lambda message: print(message, flush=True))
    check(options)
    executor_options = executor_options or sweep_executor(options)
    out = Path(options.out)
    with lock_sweep_dir(out):
        check_sweep_dir(out)
        out.mkdir(parents=True, exist_ok=True)
        pairs = [(variant, seed) for variant in options.variants for seed in options.seeds]
        atomic_write_text(out / "sweep.json", json.dumps(dataclasses.asdict(options), indent=2) + "\n")
        _record(out)
        if executor_options.in_process:
            _run_local(options, pairs, log)
        else:
            _run_jobs(options, pairs, executor_options, log)
        return write_tables(options, log)


# ---- the sweep's folder ------------------------------------------------------------------------

#: the files a sweep writes at its top level (``runs/``, ``compare/`` and ``submitit/`` hold the rest).
SWEEP_FILES = ("sweep.json", "losses.csv", "table1.csv", "table2.csv", "table1_by_step.csv", "sinks.csv", "sweep.md",
               "table1.png", "table1_by_step.png", "sinks.png", "formation.csv",
               *(f"formation_{metric}.png" for metric in ("p0_mass", "phantom_mass", "value_norm_ratio")))
#: the probe run folders beside each checkpoint.
PROBE_FOLDERS = ("sinks", "selectivity")
SWEEP_WRITER = "sweep"
#: folders whose whole content is the sweep's however it changes (submitit's logs and pickles).
SWEEP_TREES = ("submitit", "engine")
#: the engine's files: each run's log (``logs/``), submitit's (``slurm/``); older sweeps wrote ``submitit/``.
JOBS_FOLDER = "engine"


def _is_sweep_json(path: Path) -> bool:
    """Whether ``path`` is a sweep's ``sweep.json`` (its options: variants, seeds, task)."""
    from sinkscope.store.files import read_json

    try:  # a damaged one (not JSON, [[[[...]]]]) is no sweep's
        record = read_json(path, "the sweep's sweep.json")
    except SinkscopeError:
        return False
    return isinstance(record, dict) and {"variants", "seeds", "task"} <= set(record)


def sweep_legacy(out: Path):
    """``legacy`` for ``fileio.foreign_entries``: a sweep folder written before inventories.

    Recognised by its ``sweep.json``; its files are then the fixed names of ``SWEEP_FILES``,
    ``submitit/``, the comparison page ``compare/report.html`` with its figures, and under
    ``runs/<variant>-s<seed>/`` the trainer's checkpoint files (``ckpt/``, a checkpoint or the
    ``log.csv`` of one stopped before its first) and the probe run folders' fixed names. None for
    a folder without a ``sweep.json`` (a user's ``table1.csv`` is never taken for a sweep's).
    """
    from sinkscope.store.results import is_legacy_run_file, is_run_folder

    out = Path(out)
    if not _is_sweep_json(out / "sweep.json"):
        return None

    def legacy(rel: str) -> bool:
        parts = rel.split("/")
        if len(parts) == 1:
            return rel in SWEEP_FILES
        if parts[0] in SWEEP_TREES:
            return True
        if parts[0] == "compare":
            rest = "/".join(parts[1:])
            return rest == "report.html" or (rest.startswith("figures/") and rest.count("/") == 1
                                             and rest.endswith((".png", ".svg")))
        if parts[0] != "runs" or len(parts) < 4:
            return False
        folder = out / "runs" / parts[1] / parts[2]
        if parts[2] in PROBE_FOLDERS:
            return is_run_folder(folder) and is_legacy_run_file("/".join(parts[3:]))
        if parts[2] == "ckpt" and len(parts) == 4:
            from sinkscope.models.checkpoint_folder import is_checkpoint

            return is_checkpoint(folder) or parts[3] == "log.csv"
        return False
    return legacy


def check_sweep_dir(out: Path) -> None:
    """Refuse a ``--out`` a sweep may not write into (before anything is trained).

    Absent or empty: a new sweep. A sweep's own folder (its inventory, or before inventories its
    ``sweep.json``): continued, as rerunning the command always did. Anything else is refused in
    one sentence: a folder holding a file sinkscope did not write (named), or another writer's.
    """
    from sinkscope.store.files import describe_entries, foreign_entries, is_temporary_name, read_inventory

    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise SinkscopeError(f"{out} exists and is not a folder; choose another {option('out')}.")
    if not out.is_dir() or all(is_temporary_name(entry.name) for entry in out.iterdir()):
        return
    inventory = read_inventory(out)
    if inventory is not None and inventory["writer"] != SWEEP_WRITER:
        raise SinkscopeError(f"{option('out')} {out} was written by sinkscope's {inventory['writer'] or 'unknown'} writer, not by "
                             f"a sweep; choose another {option('out')}.")
    legacy = sweep_legacy(out) if inventory is None else None
    foreign = foreign_entries(out, legacy)
    if foreign:
        raise SinkscopeError(f"the folder {out} holds files sinkscope did not write ({describe_entries(foreign)}); a "
                             f"sweep never writes beside them: choose another {option('out')}, or move them.")
    if inventory is None and legacy is None:
        raise SinkscopeError(f"{option('out')} {out} is not a sweep's folder (it has no sweep.json); choose another {option('out')}.")


@contextlib.contextmanager
def lock_sweep_dir(out: Path):
    """One sweep per folder at a time (``fileio.lock_folder``; its runs' locks lie inside it)."""
    from sinkscope.store.files import lock_folder

    with lock_folder(out, kind="sweep"):
        yield


def _record(out: Path) -> None:
    """The sweep's inventory: every file now in its folder (checked runs keep their own inventories)."""
    from sinkscope.store.files import write_inventory

    write_inventory(out, SWEEP_WRITER, trees=SWEEP_TREES)


# ---- tables ------------------------------------------------------------------------------------


def collect_losses(options: SweepOptions) -> pd.DataFrame:
    """variant, seed, val_loss, step, fingerprint, eval_windows per finished run; checks that every
    run was evaluated on the same windows (same data fingerprint and window count)."""
    from sinkscope.models.checkpoint_folder import read_config

    rows = []
    for variant in options.variants:
        for seed in options.seeds:
            meta = read_config(run_dir(options, variant, seed) / "ckpt")
            data = meta.get("data", {})
            if meta.get("val_loss_step") != meta.get("step"):
                raise SinkscopeError(f"the {variant} seed {seed} checkpoint has no validation loss at its last step.")
            rows.append({"variant": variant, "seed": seed, "loss": float(meta["val_loss"]), "step": int(meta["step"]),
                         "fingerprint": data.get("fingerprint", data.get("stream_sha256")),
                         "eval_windows": meta.get("train_options", {}).get("eval_windows")})
    frame = pd.DataFrame(rows)
    for column in ("fingerprint", "eval_windows", "step"):
        if frame[column].nunique(dropna=False) > 1:
            raise SinkscopeError(f"the runs of the sweep in {options.out} differ in {column} "
                                 f"({', '.join(map(str, frame[column].unique()))}), so their losses are not paired.")
    return frame


def collect_curves(options: SweepOptions) -> pd.DataFrame:
    """variant, seed, step, loss: every evaluation in each run's log.csv (the same fixed validation
    windows as the final ``val_loss``; a resumed run's log holds each step once, as the trainer
    drops the rows an interrupted run logged after its checkpoint)."""
    from sinkscope.train.loop import read_log

    rows = []
    for variant in options.variants:
        for seed in options.seeds:
            for row in read_log(run_dir(options, variant, seed) / "ckpt"):
                if row["val_loss"]:
                    rows.append({"variant": variant, "seed": seed, "step": int(row["step"]), "loss": float(row["val_loss"])})
    return pd.DataFrame(rows, columns=["variant", "seed", "step", "loss"])


def table1_by_step(curves: pd.DataFrame, variants) -> pd.DataFrame:
    """Table 1 at every evaluation step that all runs logged: the rows of ``paired.table1`` with a
    ``step`` column (the paired improvement during training, not only at its end). log.csv keeps six
    decimals, so the last step agrees with Table 1 (full precision, config.json) to about 1e-6."""
    from sinkscope.stats.paired import table1

    runs = curves.groupby(["variant", "seed"]).ngroups
    frames = [table1(group, variants).assign(step=step) for step, group in curves.groupby("step")
              if len(group) == runs]
    columns = ["step", "block", "variant", "reference", "improvement", "se", "n"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def collect_sinks(options: SweepOptions) -> pd.DataFrame:
    """Table 15's columns (model-level values) per variant and seed, plus the gate's selectivity."""
    from sinkscope.store.results import is_run_folder, read_results

    rows = []
    for variant in options.variants:
        for seed in options.seeds:
            row = {"variant": variant, "seed": seed}
            for command, columns in (("sinks", SINK_COLUMNS), ("selectivity", GATE_COLUMNS)):
                folder = run_dir(options, variant, seed) / command
                if not is_run_folder(folder):
                    continue
                table = read_results(folder)
                model = table[table["layer"].isna() & table["head"].isna()]
                for column, metric, scale in columns:
                    values = model.loc[model["metric"] == metric, "value"]
                    row[column] = float(values.iloc[0]) * scale if len(values) else math.nan
            rows.append(row)
    columns = ["variant", "seed", *(c for c, _, _ in SINK_COLUMNS + GATE_COLUMNS)]
    return pd.DataFrame(rows).reindex(columns=columns)


def collect_formation(options: SweepOptions) -> pd.DataFrame:
    """variant, seed, step, metric, value: the model values of every run's monitor.csv (``--monitor-every``)."""
    from sinkscope.report.steps import FORMATION_METRICS, read_monitor

    frames = []
    for variant in options.variants:
        for seed in options.seeds:
            held = read_monitor(run_dir(options, variant, seed) / "ckpt")
            if held is None:
                continue
            table = held[0]
            model = table[table["layer"].isna() & table["head"].isna() & table["metric"].isin(FORMATION_METRICS)]
            frames.append(model[["step", "metric", "value"]].assign(variant=variant, seed=seed))
    columns = ["variant", "seed", "step", "metric", "value"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def write_tables(options: SweepOptions, log=None) -> Path:
    """losses.csv, table1.csv, table2.csv, table1_by_step.csv, sinks.csv, sweep.md (+ table1.png,
    table1_by_step.png, sinks.png, compare/) from the runs."""
    from sinkscope.store.files import atomic_write_text
    from sinkscope.stats.paired import fmt_pm, mean_se, table1, table2
    from sinkscope.train.config import TASK_TIERS

    log = log or (lambda _m: None)
    out = Path(options.out)
    losses = collect_losses(options)
    t1, t2 = table1(losses, options.variants), table2(losses)
    by_step = table1_by_step(collect_curves(options), options.variants)
    sinks = collect_sinks(options)
    formation = collect_formation(options)
    for name, frame in (("losses", losses), ("table1", t1), ("table2", t2), ("table1_by_step", by_step),
                        ("sinks", sinks), *((("formation", formation),) if len(formation) else ())):
        atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))

    lines = [f"# Sweep: {', '.join(options.variants)} x seeds {', '.join(map(str, options.seeds))}", "",
             f"Task {options.task}, tier {options.tier or TASK_TIERS[options.task]}, steps {losses['step'].iloc[0]}, "
             f"{options.eval_windows} fixed validation windows (val_loss at positions >= 1).", "",
             "## Validation loss (nats), mean ± se over seeds", "", "| variant | loss | n |", "| --- | --- | --- |"]
    for variant, group in losses.groupby("variant", sort=False):
        lines.append(f"| {variant} | {fmt_pm(*mean_se(group['loss']))} | {len(group)} |")
    lines += ["", "## Table 1: paired improvement (nats), positive = better", "",
              "| block | variant | improvement | n |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.block} | {r.variant} | {fmt_pm(r.improvement, r.se)} | {r.n} |" for r in t1.itertuples()]
    lines += ["", "## Table 2: two-by-two decomposition (improvements over the baseline, nats, mean ± se)", "",
              "| gate | sink | gate | both | overlap | filter | share |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in t2.itertuples():
        share = "–" if math.isnan(r.share) else f"{100 * r.share:.0f}%"
        cells = [fmt_pm(getattr(r, k), getattr(r, f"{k}_se")) for k in ("sink", "gate_alone", "both", "overlap", "filter")]
        lines.append(f"| {r.gate} | {' | '.join(cells)} | {share} |")
    if not len(t2):
        lines.append("| (needs baseline, sinklogit, a gate and its sink+ twin) | | | | | | |")
    over_base = by_step[by_step.block == "over baseline"]
    if over_base["step"].nunique() > 1:
        names = list(dict.fromkeys(over_base["variant"]))
        lines += ["", "## Paired improvement over the baseline during training (nats, mean ± se, positive = better)", "",
                  f"| step | {' | '.join(names)} |", f"| --- |{' --- |' * len(names)}"]
        for step, group in over_base.groupby("step"):
            cells = group.set_index("variant")
            lines.append(f"| {step} | " + " | ".join(fmt_pm(cells.loc[v, "improvement"], cells.loc[v, "se"])
                                                    if v in cells.index else "–" for v in names) + " |")
    lines += ["", "## Sink measurements (Table 15's columns; model means, mean ± se over seeds)", "",
              "| variant | pos. 0 (%) | phantom (%) | norm ratio | sink rate | selectivity | mean gate |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for variant, group in sinks.groupby("variant", sort=False):
        cells = []
        for column, _, _ in SINK_COLUMNS + GATE_COLUMNS:
            values = group[column].dropna()
            cells.append(fmt_pm(*mean_se(values)) if len(values) else "–")
        lines.append(f"| {variant} | {' | '.join(cells)} |")
    if len(formation):
        steps = sorted(formation["step"].unique())
        lines += ["", "## Sink formation (the trainer's monitor, model values against the step)", "",
                  f"Measured at steps {', '.join(map(str, steps[:12]))}{', ...' if len(steps) > 12 else ''} on the "
                  "same validation windows (monitor.csv of each checkpoint; all numbers in formation.csv)."]
        if options.report:
            lines += [""] + [f"![{metric} through training](formation_{metric}.png)"
                             for metric in dict.fromkeys(formation["metric"])]
    page = out / "sweep.md"
    atomic_write_text(page, "\n".join(lines) + "\n")
    if options.report:
        from sinkscope.report import lab_figures as figures  # every figure is drawn in report/

        drawn = {"table1.png": figures.paired_improvement_bars(t1),
                 "table1_by_step.png": figures.improvement_by_step(over_base),
                 "sinks.png": figures.sink_columns_by_variant(sinks),
                 **{f"formation_{metric}.png": fig for metric, fig in figures.formation_by_variant(formation).items()}}
        for name, fig in drawn.items():
            if fig is not None:
                _save(fig, out / name)
        _compare(options, out / "compare", log)
    _record(out)
    log(f"wrote {page}")
    return page


def _save(fig, path: Path) -> None:
    """A figure as a PNG, atomically (a reader sees the old file or the new one)."""
    from sinkscope.store.files import atomic_write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format="png")
    atomic_write_bytes(path, buffer.getvalue())


def _compare(options: SweepOptions, out: Path, log) -> None:
    """The sinks runs on one page, grouped by variant (``sinkscope report --group-by variant``)."""
    from sinkscope.report import build_report
    from sinkscope.store.results import is_run_folder

    runs = [str(run_dir(options, v, s) / "sinks") for v in options.variants for s in options.seeds]
    runs = [r for r in runs if is_run_folder(Path(r))]
    if len(runs) < 2:
        return
    import warnings

    group = "variant" if len(options.variants) > 1 else None
    try:
        with warnings.catch_warnings():  # matplotlib's layout notes on very small models
            warnings.simplefilter("ignore", UserWarning)
            build_report(runs, out=str(out), group_by=group, overwrite=True)  # the sweep's own page
    except SinkscopeError as error:  # the tables stand without the page
        log(f"note: no comparison page ({error})")
