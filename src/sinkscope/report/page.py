"""The report's shared vocabulary: how numbers print, how a figure is kept, what every section draws with.

Every section module (``report/inject.py``, ``stream.py``, ``circuit.py``, ``tokens.py``,
``generic.py``; ``steps.py`` and ``lengths.py`` for the page-wide ones) takes these from here, and
the page assembly (``report/build.py``) puts their sections together. A per-metric section is a
module with

    handles(probe: str, metric: str, runs: list[RunData]) -> bool
    entry(page: Page, metric: str) -> dict | None
    note(probe: str, metrics: list[str]) -> str | None
    tables(page: Page, probe: str) -> list[dict]

``handles``: whether it shows ``metric`` (one of ``probe``'s metrics that every run has);
``entry``: the metric's entry on the page ({metric, info, note, figures, table}), or None where
the metric is shown inside another's entry, adding its summary rows to ``page.summary``;
``note`` and ``tables``: the probe section's note and extra tables (None and [] where it has
none). The page asks the sections in order (``build.SECTIONS``); the first that handles a metric
draws it.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd

from sinkscope.report import figures
from sinkscope.report.runs import RunData
from sinkscope.stats.paired import fmt_pm
from sinkscope.store.results import MetricInfo

#: Per-layer tables longer than this start collapsed.
COLLAPSE_ROWS = 16


def fmt(value) -> str:
    """Numbers as the report prints them: 6 significant digits, NaN as an em dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return "—"
    return f"{float(value):.6g}"


def fmt_se(value, se) -> str:
    """``value ± se`` where the row has a standard error over windows (SPEC.md "Averages"), rounded where the
    se's second significant digit ends (``0.034873 ± 0.000020``, :func:`~sinkscope.stats.paired.fmt_pm`);
    else ``value`` as :func:`fmt` prints it."""
    if se is None or pd.isna(se) or pd.isna(value):
        return fmt(value)
    return fmt_pm(value, se, missing="—")


def _pm(value: float, se: float) -> str:
    """``+3.18 ± 0.21`` (a signed difference rounded to its se's two significant digits), or the value alone
    (four significant digits) without an se."""
    return fmt_pm(value, se, sign=True, missing="—")


def _metric_docs(runs: list[RunData]) -> dict[str, MetricInfo]:
    """Metric documentation as the runs' manifests recorded it (the report imports no probe)."""
    docs: dict[str, MetricInfo] = {}
    for run in runs:
        for probe in run.manifest.get("probes", {}).values():
            for metric, info in probe.get("metrics", {}).items():
                if isinstance(info, dict):
                    docs.setdefault(metric, MetricInfo(**info))
    return docs


def _embed_png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _keeper(fig_dir: Path):
    """``keep(fig, stem, title)``: save a figure beside the page and describe it for the template."""
    def keep(fig, name: str, title: str) -> dict:
        png, svg = figures.save_figure(fig, fig_dir / name)
        return {"title": title, "src": _embed_png(png), "files": [png.name, svg.name], "kind": "line"}
    return keep


@dataclass
class Page:
    """What every section draws with: one page's runs, its figure folder, metric documentation and summary.

    ``keep(fig, stem, title)`` saves a figure into ``fig_dir`` and describes it for the template
    (default :func:`_keeper`); ``labels`` names the metrics on the figures' axes, from this page's
    documentation only; ``colours`` gives each run its one colour on every figure of the page
    (``figures.run_colours``, by the runs' order); ``summary`` collects the summary table's rows as the
    sections add them.
    """

    runs: list[RunData]
    fig_dir: Path
    docs: dict[str, MetricInfo] = field(default_factory=dict)
    keep: Callable | None = None
    summary: list[dict] = field(default_factory=list)
    labels: figures.MetricLabels = field(init=False)
    colours: dict[str, str] = field(init=False)

    def __post_init__(self):
        self.keep = self.keep or _keeper(self.fig_dir)
        self.labels = figures.MetricLabels.from_docs(self.docs)
        self.colours = figures.run_colours(run.label for run in self.runs)

    @classmethod
    def of(cls, runs: list[RunData], fig_dir: Path) -> Page:
        """The page of ``runs``, with the documentation their manifests recorded."""
        return cls(runs, fig_dir, _metric_docs(runs))

    def info(self, metric: str) -> MetricInfo:
        return self.docs.get(metric, MetricInfo(metric, "", "", ""))

    def add_summary(self, metric: str, label: str, direction: str, values: list[str]) -> None:
        self.summary.append({"metric": metric, "label": label, "direction": direction, "values": values})


class Section(Protocol):
    """A module drawing some of a probe's metrics (see the module docstring)."""

    def handles(self, probe: str, metric: str, runs: list[RunData]) -> bool: ...

    def entry(self, page: Page, metric: str) -> dict | None: ...

    def note(self, probe: str, metrics: list[str]) -> str | None: ...

    def tables(self, page: Page, probe: str) -> list[dict]: ...


# ---- what was run ----------------------------------------------------------------------------------


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


def trained_context_summary(windows: dict) -> str:
    """The model's trained context, and whether the windows are past it (SPEC.md "Past the trained context")."""
    trained = windows.get("trained_context")
    if not isinstance(trained, int) or isinstance(trained, bool):
        return "—" if "trained_context" not in windows else "not named by the config"
    lengths = windows.get("seq_len")
    longest = max(lengths) if isinstance(lengths, list) and lengths else lengths
    if isinstance(longest, int) and longest > trained:
        return f"{trained} tokens; the windows ({longest} tokens) are past it"
    return f"{trained} tokens"


#: the runs' options that ask for each compared field: runs of one model whose options ask for different
#: values vary the field on purpose (``sinks --inputs text|random|repeated`` varies the corpus, ``--bos`` the
#: BOS policy); the field's own name counts too, as a condition or a ``group_by``.
ASKED_BY: dict[str, tuple[str, ...]] = {"seq-len": ("seq_len",), "corpus": ("corpus", "inputs", "text_file", "dataset"),
                                        "BOS policy": ("bos",)}


def _differences(runs: list[RunData], skip: tuple[str, ...] = ()) -> list[str]:
    """Warnings for a comparison of runs whose windows differ in seq-len, corpus or BOS policy by accident.

    A difference that is the comparison's own condition is not warned about (:func:`_varied_on_purpose`):
    Gu et al.'s inputs experiment runs one model on natural text, random tokens and a repeated token, so
    its runs differ in corpus by design. Two models on different corpora, or runs whose options agree
    while their windows differ (``--bos auto`` adding BOS for one tokenizer only, a corpus file changed
    between runs), are warned about.
    """
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
        if len({str(v) for v in values}) > 1 and not _varied_on_purpose(runs, name):
            listed = "; ".join(f"{r.label}: {v}" for r, v in zip(runs, values))
            out.append(f"The runs differ in {name} ({listed}), so their numbers are not directly comparable.")
    return out


def _varied_on_purpose(runs: list[RunData], field_name: str) -> bool:
    """Whether the runs were made to differ in ``field_name`` (a key of :data:`ASKED_BY`): it is what the
    comparison compares.

    So when one of its names (``ASKED_BY``) is the comparison's declared condition: the runs were grouped by
    it (``report --group-by``) or carry it as a run condition with different values; or when the runs
    measure one model and their options ask for different values of it (``--inputs``, ``--text-file``,
    ``--bos``, ``--seq-len``): then the model is held fixed and this field is what varies.
    """
    names = ASKED_BY[field_name]

    def differ(values) -> bool:
        return len({repr(v) for v in values}) > 1

    for name in names:
        if any((r.manifest.get("grouped") or {}).get("by") == name for r in runs):
            return True
        if differ([(r.manifest.get("conditions") or {}).get(name) for r in runs]):
            return True
    if differ([_model_identity(r) for r in runs]):
        return False  # several models: a difference in their windows is one more difference between them
    options = [r.manifest.get("options") if isinstance(r.manifest.get("options"), dict) else {} for r in runs]
    return any(differ([o.get(name) for o in options]) for name in names)


def _model_identity(run: RunData) -> tuple:
    """What names a run's model: its source's kind, location, revision and label (the manifest's ``model.source``)."""
    model = run.manifest.get("model") if isinstance(run.manifest.get("model"), dict) else {}
    source = model.get("source") if isinstance(model.get("source"), dict) else {}
    return tuple(str(source.get(key)) for key in ("kind", "location", "revision", "label"))


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
        ("corpus", lambda m: get(m, "corpus", "abs_path", default=None) or get(m, "corpus", "name")),  # a file: its full path
        ("corpus sha256", lambda m: str(get(m, "corpus", "sha256"))[:16]),
        ("BOS policy", lambda m: bos_summary(m.get("windows") if isinstance(m.get("windows"), dict) else {})),
        ("seq-len", lambda m: get(m, "windows", "seq_len")),
        ("trained context", lambda m: trained_context_summary(m.get("windows") if isinstance(m.get("windows"), dict)
                                                              else {})),
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
