"""The report's sections and the protocol the page asks them through (``report/page.py``, ``build.SECTIONS``).

Each section module (``inject.py``, ``tokens.py``, ``generic.py``, ``lengths.py``; ``stream.py`` and
``circuit.py`` have tests of their own) is fed hand-built tables (``Row`` objects through
``rows_to_frame``) and a ``Page`` whose ``keep`` remembers figures instead of saving them. The
reference is those rows: each summary value and table cell is the row's value as ``page.fmt`` or
``page._pm`` prints it, each metric goes to the first section that handles it, and the notes and
extra tables are the ones the section module defines.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sinkscope.report import build, generic, inject, lengths, stream, tokens
from sinkscope.report.page import Page, fmt
from sinkscope.report.runs import RunData
from sinkscope.store.results import MetricInfo, Row, rows_to_frame

DOCS = {"inject_loss_delta": {"label": "Loss increase", "unit": "nats / token", "formula": "", "source": "",
                              "direction": "higher = more harm", "per": "model"},
        "inject_loss_clean": {"label": "Clean loss", "unit": "nats / token", "formula": "", "source": "",
                              "direction": "", "per": "model"}}


class Keeper:
    """``keep(fig, stem, title)`` that remembers the figures instead of saving them."""

    def __init__(self):
        self.kept: list[tuple] = []

    def __call__(self, fig, stem: str, title: str) -> dict:
        self.kept.append((fig, stem, title))
        return {"stem": stem, "title": title}


def run_of(rows: list[Row], label: str = "r", manifest: dict | None = None) -> RunData:
    return RunData(Path(label), label, manifest or {}, rows_to_frame(rows))


def page_of(runs: list[RunData], docs: dict | None = None, fig_dir: Path = Path("unused")) -> Page:
    """A page whose ``keep`` remembers figures (the generic entry saves its own into ``fig_dir``)."""
    return Page(runs, fig_dir, {m: MetricInfo(**d) for m, d in (docs or {}).items()}, keep=Keeper())


def per_layer_rows(probe: str, metric: str, values: list[float]) -> list[Row]:
    rows = []
    for layer, value in enumerate(values):
        rows += [Row(probe, metric, layer, h, value + 0.01 * h, 4) for h in range(2)]
        rows.append(Row(probe, metric, layer, None, value, 8))
    rows.append(Row(probe, metric, None, None, float(np.mean(values)), 16))
    return rows


# ---- the protocol: who draws what ----------------------------------------------------------------------


def test_every_metric_goes_to_the_first_section_that_handles_it():
    token_run = run_of([Row("gate", "token_gate", None, None, 0.5, 60, (("token_id", 7),))])
    owner = {}
    for probe, metric, runs in [("injection", "inject_loss_delta", []), ("stream", "stream_ppl", []),
                                ("p0_norm", "p0_norm", []), ("gate", "token_gate", [token_run]),
                                ("p0_mass", "p0_mass", []), ("exposure", "quiet_mass_median", [])]:
        owner[metric] = next(s for s in build.SECTIONS if s.handles(probe, metric, runs)).__name__.rsplit(".", 1)[1]
    assert owner == {"inject_loss_delta": "inject", "stream_ppl": "stream", "p0_norm": "circuit",
                     "token_gate": "tokens", "p0_mass": "generic", "quiet_mass_median": "generic"}
    for section in build.SECTIONS:  # every section speaks the whole protocol
        assert all(callable(getattr(section, name)) for name in ("handles", "entry", "note", "tables"))


def test_the_probe_sections_take_their_notes_and_tables_from_the_sections(tmp_path):
    runs = [run_of(per_layer_rows("exposure", "quiet_mass_median", [0.2, 0.4])
                   + per_layer_rows("exposure", "out_gate_mean", [0.5, 0.5]))]
    page = page_of(runs, fig_dir=tmp_path)
    sections, against_step = build._probe_sections(page, [("exposure", ["quiet_mass_median", "out_gate_mean"])])
    (section,) = sections
    assert section["note"] == inject.EXPOSURE_NOTE  # before the output-gate note of generic
    assert [e["metric"] for e in section["entries"]] == ["quiet_mass_median", "out_gate_mean"]
    assert section["tables"][0]["columns"] == ["run", "quiet (median)"]
    assert section["tables"][0]["rows"] == [["r", fmt(0.3)]]
    assert against_step == ["quiet_mass_median", "out_gate_mean"]
    assert generic.note("gate", ["out_gate_mean"]) == generic.OUTPUT_GATE_NOTE and generic.note("x", ["m"]) is None
    assert stream.note("stream", []) == stream.NOTE and stream.note("x", []) is None


# ---- injection -----------------------------------------------------------------------------------------


def injection_rows(scale: float = 1.0) -> list[Row]:
    rows = [Row("injection", "inject_loss_clean", None, None, 3.5, 64, se=0.1)]
    for junk in ("gaussian", "copy"):
        for cutoff in ("median", "q25"):
            for dose in (0.5, 2.0):
                cond = (("junk", junk), ("cutoff", cutoff), ("dose", dose))
                rows.append(Row("injection", "inject_loss", None, None, 4.0, 64, cond))
                rows.append(Row("injection", "inject_loss_delta", None, None, scale * dose, 64, cond, se=0.05 * dose))
    return rows


def test_injection_draws_one_dose_response_per_junk_and_tabulates_every_condition():
    manifest = {"windows": {"n_seqs": 8}, "probes": {"injection": {"options": {"draws": 3}}}}
    page = page_of([run_of(injection_rows(), "a", manifest)], DOCS)
    assert inject.entry(page, "inject_loss_clean") is None
    assert page.summary == [{"metric": "inject_loss_clean", "label": "Clean loss", "direction": "", "values": ["3.5"]}]
    assert inject.entry(page, "inject_loss") is None
    out = inject.entry(page, "inject_loss_delta")
    assert [stem for _, stem, _ in page.keep.kept] == ["dose_response_gaussian", "dose_response_copy"]
    assert out["info"].label == "Loss increase" and out["table"]["columns"] == ["junk", "cutoff", "eps=0.5", "eps=2"]
    assert out["table"]["rows"][0] == ["gaussian", "median", "+0.500 ± 0.025", "+2.00 ± 0.10"]
    assert len(out["table"]["rows"]) == 4
    assert out["table"]["caption"].endswith("over the 8 windows (each window's increase averaged over its 3 draws "
                                            "of the junk)")
    fig = page.keep.kept[0][0]
    assert fig.axes[0].get_yscale() == "log"
    assert inject.note("injection", []) == inject.INJECTION_NOTE and inject.tables(page, "injection") == []


def test_a_comparison_of_injections_has_a_run_column():
    page = page_of([run_of(injection_rows(), "a"), run_of(injection_rows(2.0), "b")], DOCS)
    out = inject.entry(page, "inject_loss_delta")
    assert out["table"]["columns"][0] == "run" and [r[0] for r in out["table"]["rows"]] == ["a"] * 4 + ["b"] * 4
    assert out["table"]["rows"][4][3:] == ["+1.000 ± 0.025", "+4.00 ± 0.10"]


# ---- token tables --------------------------------------------------------------------------------------


def test_token_tables_rank_the_frequent_tokens_by_their_mean_gate():
    rows = [Row("gate", "token_gate", None, None, 0.1 * k, 60 if k % 2 else 10, (("token_id", k), ("token", f"t{k}")))
            for k in range(1, 9)]
    run = run_of(rows, "a", {"probes": {"token_share": {"options": {"min_count": 50}}}})
    assert tokens.handles("gate", "token_gate", [run]) and not tokens.handles("gate", "gate_mean", [run])
    page = page_of([run])
    out = tokens.entry(page, "token_gate")
    (table,) = out["token_tables"]
    assert out["figures"] == [] and out["table"] is None and table["threshold"] == 50 and table["n_tokens"] == 8
    assert [row[2] for row in table["most"]["rows"]] == ["1", "3", "5", "7"]  # lowest gate first, frequent only
    assert [row[2] for row in table["least"]["rows"]] == ["7", "5", "3", "1"]
    assert table["most"]["rows"][0] == ["1", '"t1"', "1", "60", fmt(0.1)]
    assert "Only 4 tokens occur 50 times or more" in table["note"]


# ---- the generic entry ---------------------------------------------------------------------------------


def test_the_generic_entry_adds_the_model_value_draws_and_tabulates_per_layer(tmp_path):
    rows = per_layer_rows("p0_mass", "p0_mass", [0.2, 0.6])
    page = page_of([run_of(rows, "a", {"windows": {"seq_len": 16}})], fig_dir=tmp_path)
    out = generic.entry(page, "p0_mass")
    assert page.summary[0]["values"] == [fmt(0.4)]
    assert [(f["files"][0], f["kind"]) for f in out["figures"]] == [("layers_p0_mass.png", "line"),
                                                                      ("heatmap_p0_mass.png", "heatmap")]
    assert out["figures"][0]["title"] == "per layer (dashed: uniform attention)"  # the p0 floor at seq-len 16
    assert out["table"]["rows"] == [["0", fmt(0.2), fmt(0.2), fmt(0.21), "8"],
                                    ["1", fmt(0.6), fmt(0.6), fmt(0.61), "8"]]
    assert generic.against_step(page.runs, "p0_mass")


def test_a_model_without_a_phantom_key_gets_a_sentence_instead_of_phantom_figures(tmp_path):
    rows = [Row("phantom_mass", "phantom_mass", layer, head, 0.0, 4) for layer in (0, 1) for head in (None, 0, 1)]
    page = page_of([run_of(rows, "a")], fig_dir=tmp_path)
    out = generic.entry(page, "phantom_mass")
    assert out["figures"] == [] and out["table"] is None
    assert out["note"].startswith("The model has no learned phantom key, so its phantom_mass is 0")
    assert not generic.against_step(page.runs, "phantom_mass") and not list(tmp_path.iterdir())


def test_the_aggregates_note_names_the_metrics_that_are_not_means_over_layers():
    assert generic.aggregates_note([{"metric": "p0_mass"}]) == (
        "Model-level values: the mean over layers of per-layer means over heads.")
    note = generic.aggregates_note([{"metric": "massive_activation_max"}, {"metric": "token_share"}])
    assert "(massive activations: the largest over layers; token-identity shares" in note


# ---- lengths -------------------------------------------------------------------------------------------


def test_the_lengths_section_draws_each_metric_against_length_with_the_fit(tmp_path):
    rows = []
    for n in (8, 32):
        for r in per_layer_rows("p0_mass", "p0_mass", [0.5, 0.3]):
            rows.append(Row(r.probe, r.metric, r.layer, r.head, r.value * 8 / n, r.n, (("seq_len", n),)))
        rows += [Row("leak_fit", "leak_p0_predicted", layer, None, 0.1, 1, (("seq_len", n),)) for layer in (0, 1)]
    rows += [Row("leak_fit", "leak_delta", layer, head, 2.0 + layer, 1, (("seq_len", 8),))
             for layer in (0, 1) for head in (0, 1)]
    rows += [Row("leak_fit", "leak_delta", layer, None, 2.0 + layer, 1, (("seq_len", 8),)) for layer in (0, 1)]
    run = run_of(rows, "m")
    section = lengths.section([run], tmp_path)
    assert section["probe"] == "lengths" and section["note"] == lengths.LENGTHS_NOTE
    p0, delta = section["entries"]
    assert p0["metric"] == "p0_mass_vs_length" and p0["table"]["columns"] == ["layer", "seq-len 8", "seq-len 32"]
    assert p0["table"]["rows"] == [["0", fmt(0.5), fmt(0.125)], ["1", fmt(0.3), fmt(0.075)]]
    assert delta["metric"] == "leak_delta" and [row[:2] for row in delta["table"]["rows"]] == [["0", "2"], ["1", "3"]]
    assert delta["table"]["rows"][0][3:] == [fmt(0.125), fmt(0.1)]  # measured and predicted p0 at seq-len 32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["length_leak_delta_run0.png", "length_leak_delta_run0.svg",
                                                          "length_p0_mass_run0.png", "length_p0_mass_run0.svg"]
    assert math.isclose(float(p0["table"]["rows"][0][2]), 0.125)


@pytest.mark.parametrize("metric", ["p0_mass", "phantom_mass"])
def test_length_metrics_have_a_fit_to_draw_beside_them(metric):
    assert metric in lengths.LENGTH_METRICS and lengths.PREDICTED_BY[metric].startswith("leak_")
