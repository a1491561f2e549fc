"""Run folders -> one self-contained ``report.html`` (figures embedded) plus PNG/SVG beside it.

The report reads only what a run folder holds (``manifest.json``, ``results.parquet``/``.csv``);
it never loads a model, so it can be rebuilt, restyled or combined at any time:

    build_report([run])                  -> run/report.html, run/figures/*
    build_report([run_a, run_b], out=d)  -> d/report.html comparing the runs, d/figures/*

Where it writes follows every writer's rules (no file sinkscope did not write is replaced): a
run's own folder is rebuilt when it holds nothing else; any other ``out`` is written when absent
or empty, and replaced with ``overwrite`` when it holds only sinkscope's files. The page and its
figures are drawn beside ``out`` and renamed into place, and the folder's ``.sinkscope-files``
records them (``build_report``; ``report/folder.py``).

A trainer checkpoint folder (``sinkscope train --out ckpt``) may be given too: its ``log.csv``
becomes a "Training" section with the loss curves of every checkpoint on one plot and a table
of the final losses; its ``monitor.csv`` (``--monitor-every``) the sink-formation curves
(``report/steps.py``: p0 mass, phantom mass and value-norm ratio against the step, per layer, or
one line per checkpoint for several).

Runs of one model's checkpoints (a series: every run has a ``step`` or ``revision`` condition,
all distinct; ``sinkscope sinks MODEL --revision A,B,...``) get a first section drawing every
per-layer metric against the step (``report/steps.py``).

With several runs a "Differences from <first run>" table gives each later run's model-level values
minus the first's, ± the standard error of the difference, paired where the runs measured the same
windows (``report/compare_section.py``; SPEC.md "Comparisons of runs"), and every shared metric gets an overlay of its per-layer line (one line per run),
heatmaps on one shared colour scale, and a side-by-side per-layer table; metrics that not every
run has are listed in a note and left out of the comparison, and runs that differ in seq-len,
corpus or BOS policy get a warning (their numbers are not directly comparable), unless that is what
the comparison varies (one model, options asking for different values: Gu et al.'s inputs;
``page._differences``). Every run keeps one colour on every figure of the page (``Page.colours``).

The page is put together here; what each metric looks like lives in the section modules, asked in
order (:data:`SECTIONS`, the protocol in ``report/page.py``): ``inject.py`` (injection and
exposure), ``stream.py``, ``circuit.py``, ``tokens.py`` (per-token tables) and ``generic.py``
(every other metric: per-layer lines, heatmaps, tables; the p0 floor, the phantom key, gates).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

from sinkscope.version import __version__
from sinkscope.errors import SinkscopeError
from sinkscope.store.files import atomic_write_text, lock_folder, write_inventory
from sinkscope.runtime.paths import user_path
from sinkscope.report import circuit, compare_section, explorer_page, generic, inject, lengths, steps, stream, tokens
from sinkscope.report.folder import (_beside, _check_report_folder, _fresh_folder, _install_report, _name,
                                     _remove_stale_temporaries, _same_folder, report_folder_legacy)
from sinkscope.report.page import Page, Section, _differences, _run_info
from sinkscope.report.runs import (RunData, TrainingLog, group_runs, is_training_folder, read_run, read_training,
                                   split_lengths, uniform_p0)

#: the per-metric sections, asked in this order; the first that handles a metric draws it.
SECTIONS: tuple[Section, ...] = (inject, stream, circuit, tokens, generic)

#: names other packages import from here (they live in runs.py and folder.py).
__all__ = ["RunData", "build_report", "group_runs", "read_run", "report_folder_legacy", "uniform_p0"]


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


def _probe_sections(page: Page, probes: list[tuple[str, list[str]]]) -> tuple[list[dict], list[str]]:
    """One section per probe, each metric drawn by the first of :data:`SECTIONS` that handles it.

    Also returns the metrics a series of checkpoints draws against the step (``generic``'s, with
    per-layer rows in every run).
    """
    sections, against_step = [], []
    for probe, metrics in probes:
        entries = []
        for metric in metrics:
            section = next(s for s in SECTIONS if s.handles(probe, metric, page.runs))
            entry = section.entry(page, metric)
            if entry is not None:
                entries.append(entry)
            if section is generic and generic.against_step(page.runs, metric):
                against_step.append(metric)
        note = next((text for s in SECTIONS if (text := s.note(probe, metrics)) is not None), None)
        tables = [table for s in SECTIONS for table in s.tables(page, probe)]
        sections.append({"probe": probe, "entries": entries, "note": note, "tables": tables})
    return sections, against_step


def _render_page(runs: list[RunData], trainings: list[TrainingLog], several_lengths: list[RunData], one_run: bool,
                 fig_dir: Path) -> str:
    """Draw every figure into ``fig_dir`` and return the page's HTML."""
    training = steps.training_section(trainings, fig_dir) if trainings else None
    page = Page.of(runs, fig_dir)
    probes, not_shared = _ordered_metrics(runs) if runs else ([], [])
    sections, against_step = _probe_sections(page, probes)
    if len(runs) > 1:  # a series of checkpoints (--revision A,B,...): every metric against the step
        series = steps.series_section(runs, against_step, fig_dir, page.keep, page.labels)
        if series:
            sections.insert(0, series)
    if several_lengths:
        sections.append(lengths.section(several_lengths, fig_dir, page.labels))
    layer_types = generic.layer_type_section(runs)
    if layer_types:
        sections.append(layer_types)

    explorer_html, explorer_note = None, None
    if len(runs) == 1 and not several_lengths and runs[0].explorer is not None:
        explorer_html = explorer_page.fragment(runs[0].label, runs[0].table, runs[0].manifest, runs[0].explorer)
    elif len(runs) > 1 and any(r.explorer is not None for r in runs):
        explorer_note = "Each run's own report.html holds its attention explorer (a comparison page does not)."
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
        run_info=_run_info(runs) if runs else None, summary=page.summary, sections=sections, notes=notes,
        aggregates_note=generic.aggregates_note(page.summary),
        differences=None if several_lengths else compare_section.section(runs),
        warnings=_differences(runs, skip=("seq-len",) if several_lengths else ()) if len(runs) > 1 else [],
        generated=datetime.now().isoformat(timespec="seconds"), version=__version__,
        explorer=explorer_html, explorer_note=explorer_note,
    )
    return html
