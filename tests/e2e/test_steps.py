"""Sinks through training (issue 29): a model's checkpoints in one run, and the curves against the step.

A local Hugging Face cache in tmp holds three revisions of a tiny random Llama (the hub layout:
``models--ORG--NAME/refs/<revision>`` holding a commit hash, ``snapshots/<hash>/`` the files),
each with other weights. ``sinkscope sinks ORG/NAME --revision A,B,C`` must give, per revision,
the numbers a single-revision run gives (the independent reference), on the same windows, with
the step parsed from the name; a missing revision is one sentence and keeps what was measured;
the report draws every metric against the step with the table's numbers. Also: a trainer
checkpoint's monitor.csv drawn by ``sinkscope report ckpt``, a folder of trainer checkpoints as
the MODEL, and the sweep's overlay per variant.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app

runner = CliRunner()
REPO = "sinkscope-test/tiny-llama"
REVISIONS = ("step0", "step10", "step20-tokens1M")  # Pythia's stepN and OLMo's stepN-tokensM
STEPS = (0, 10, 20)
COMMON = ["--seq-len", "32", "--n-seqs", "4", "--batch-size", "2", "--device", "cpu", "--no-progress"]


def _snapshot(cache: Path, revision: str, seed: int, tokenizer) -> None:
    """One revision in the hub cache layout: refs/<revision> -> <hash>, snapshots/<hash>/ the files."""
    from tiny_models import build

    repo = cache / f"models--{REPO.replace('/', '--')}"
    commit = hashlib.sha1(f"{revision}-{seed}".encode()).hexdigest()
    folder = repo / "snapshots" / commit
    build("llama", seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tokenizer) -> Path:
    cache = tmp_path_factory.mktemp("hf-cache")
    for seed, revision in enumerate(REVISIONS):
        _snapshot(cache, revision, seed + 1, tokenizer)
    return cache


@pytest.fixture
def offline_hub(hub_cache, monkeypatch):
    """The tmp cache as the Hugging Face cache, offline (constants are read at import: patched too)."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HOME", str(hub_cache.parent / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


def _sinks(*args: str):
    result = runner.invoke(app, ["sinks", *args, *COMMON])
    return result


def _head_rows(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    rows = table[(table["metric"] == metric) & table["head"].notna()]
    return rows.sort_values(["layer", "head"])[["layer", "head", "value"]].reset_index(drop=True)


@pytest.fixture(scope="module")
def series_run(hub_cache, text_file, tmp_path_factory):
    """``sinks REPO --revision step0,step10,step20-tokens1M`` once for the module (its folder)."""
    mp = pytest.MonkeyPatch()
    import huggingface_hub.constants as constants

    mp.setenv("HF_HUB_CACHE", str(hub_cache))
    mp.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    mp.setattr(constants, "HF_HUB_OFFLINE", True)
    out = tmp_path_factory.mktemp("series") / "pythia-like"
    try:
        result = _sinks(REPO, "--revision", ",".join(REVISIONS), "--text-file", str(text_file), "--out", str(out))
        assert result.exit_code == 0, result.output
    finally:
        mp.undo()
    return out


def test_each_revision_equals_its_own_single_revision_run(series_run, offline_hub, text_file, tmp_path):
    from sinkscope.store.results import read_results

    tokens = [np.load(series_run / revision / "tokens.npy") for revision in REVISIONS]
    assert all(np.array_equal(tokens[0], t) for t in tokens[1:])  # the same windows for every revision
    p0 = []
    for revision in REVISIONS:
        single = tmp_path / revision
        result = _sinks(REPO, "--revision", revision, "--text-file", str(text_file), "--out", str(single),
                        "--no-figures")
        assert result.exit_code == 0, result.output
        assert np.array_equal(np.load(single / "tokens.npy"), tokens[0])
        reference, measured = read_results(single), read_results(series_run / revision)
        for metric in ("p0_mass", "value_norm_ratio"):
            pd.testing.assert_frame_equal(_head_rows(measured, metric), _head_rows(reference, metric),
                                          check_exact=False, rtol=1e-6, atol=1e-7)
        p0.append(_head_rows(measured, "p0_mass")["value"].to_numpy())
    assert not np.allclose(p0[0], p0[1])  # other weights per revision: the runs are not one run thrice


def test_the_series_table_has_the_parsed_step_and_the_revision(series_run):
    table = pd.read_parquet(series_run / "steps.parquet")
    assert list(dict.fromkeys(table["revision"])) == list(REVISIONS)
    assert table.groupby("revision", sort=False)["step"].first().tolist() == list(STEPS)
    csv = pd.read_csv(series_run / "steps.csv")
    assert sorted(csv["step"].unique()) == list(STEPS)
    manifest = json.loads((series_run / "step10" / "manifest.json").read_text())
    assert manifest["conditions"] == {"step": 10, "revision": "step10"}
    assert manifest["model"]["source"]["revision"] == "step10"


def test_revision_names_give_steps():
    from sinkscope.models.resolve import parse_revisions, revision_step

    assert [revision_step(r) for r in ("step0", "step143000", "step1000-tokens4B", "step-100", "main", None,
                                       "a1b2c3", "steps")] == [0, 143000, 1000, 100, None, None, None, None]
    assert parse_revisions("step0, step1000") == ["step0", "step1000"]
    assert parse_revisions(None) == [None]
    from sinkscope.errors import SinkscopeError

    with pytest.raises(SinkscopeError, match="more than once"):
        parse_revisions("step0,step0")


@pytest.fixture
def drawn(monkeypatch) -> dict:
    """Every figure ``curves.metric_vs_step`` draws while the test runs, by metric."""
    from sinkscope.report import curves

    figs = {}
    original = curves.metric_vs_step

    def spy(lines, metric, **kwargs):
        figs[metric] = original(lines, metric, **kwargs)
        return figs[metric]

    monkeypatch.setattr(curves, "metric_vs_step", spy)
    return figs


def test_the_report_draws_every_metric_against_the_step_with_the_tables_numbers(series_run, drawn):
    from sinkscope.report import build_report, curves
    from sinkscope.store.results import read_results

    figs = series_run / "figures"
    for metric in ("p0_mass", "value_norm_ratio", "sink_rate"):
        assert (figs / f"steps_{metric}.png").is_file() and (figs / f"steps_{metric}.svg").is_file()
    assert 'id="probe-steps"' in (series_run / "report.html").read_text()

    build_report([series_run / r for r in REVISIONS], out=series_run, labels=list(REVISIONS), overwrite=True)
    lines = {line.get_label(): line for line in drawn["p0_mass"].axes[0].lines}
    for layer in (0, 1):
        line = lines[f"layer {layer}"]
        np.testing.assert_array_equal(line.get_xdata(), STEPS)
        expected = [read_results(series_run / r).query(f"metric == 'p0_mass' and layer == {layer}")
                    .loc[lambda t: t["head"].isna(), "value"].iloc[0] for r in REVISIONS]
        np.testing.assert_allclose(line.get_ydata(), expected)
    model = [read_results(series_run / r).query("metric == 'p0_mass'")
             .loc[lambda t: t["layer"].isna() & t["head"].isna() & t["layer_type"].isna()
                  if "layer_type" in t else t["layer"].isna() & t["head"].isna(), "value"].iloc[0] for r in REVISIONS]
    np.testing.assert_allclose(lines[curves.MODEL_LINE].get_ydata(), model)
    floor = [line for line in drawn["p0_mass"].axes[0].lines if str(line.get_label()).startswith("uniform")]
    assert floor and np.allclose(floor[0].get_ydata(), np.mean([1 / (i + 1) for i in range(1, 32)]))


def test_a_missing_revision_is_one_sentence_and_keeps_what_was_measured(offline_hub, text_file, tmp_path):
    out = tmp_path / "series"
    first = _sinks(REPO, "--revision", "step0,step10", "--text-file", str(text_file), "--out", str(out),
                   "--no-figures")
    assert first.exit_code == 0, first.output
    kept = (out / "step0" / "results.csv").read_bytes()
    # a revision the cache lacks: refused before anything loads, nothing lost
    result = _sinks(REPO, "--revision", "step0,step10,step99", "--text-file", str(text_file), "--out", str(out),
                    "--resume")
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "'step99'" in error[0] and "not in the local Hugging Face cache" in error[0]
    assert (out / "step0" / "results.csv").read_bytes() == kept and not (out / "step99").exists()

    # a revision that breaks while it loads (its weights are gone): the runs before it stay, --resume continues
    repo = offline_hub / f"models--{REPO.replace('/', '--')}"
    commit = (repo / "refs" / "step20-tokens1M").read_text()
    weights = repo / "snapshots" / commit / "model.safetensors"
    aside = tmp_path / "weights.safetensors"
    shutil.move(weights, aside)
    try:
        broken = _sinks(REPO, "--revision", "step0,step10,step20-tokens1M", "--text-file", str(text_file), "--out",
                        str(out), "--resume")
    finally:
        shutil.move(aside, weights)
    assert broken.exit_code == 1 and "Traceback" not in broken.output
    error = [line for line in broken.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "revision 'step20-tokens1M'" in error[0] and "step0, step10" in error[0]
    assert "--resume" in error[0]
    assert (out / "step0" / "results.csv").read_bytes() == kept
    again = _sinks(REPO, "--revision", "step0,step10,step20-tokens1M", "--text-file", str(text_file), "--out",
                   str(out), "--resume")
    assert again.exit_code == 0, again.output
    assert "Keeping the finished run" in again.output and (out / "step0" / "results.csv").read_bytes() == kept
    table = pd.read_csv(out / "steps.csv")
    assert sorted(table["step"].unique()) == list(STEPS)


def test_a_revision_whose_tokenizer_makes_other_windows_stops_the_series(offline_hub, text_file, tmp_path):
    from conftest import make_tokenizer

    _snapshot(offline_hub, "step30", 7, make_tokenizer(vocab_size=280))
    try:
        result = _sinks(REPO, "--revision", "step0,step30", "--text-file", str(text_file), "--out",
                        str(tmp_path / "s"), "--no-figures")
    finally:
        (offline_hub / f"models--{REPO.replace('/', '--')}" / "refs" / "step30").unlink()
    assert result.exit_code == 1 and "other token windows" in result.output and "Traceback" not in result.output
    assert (tmp_path / "s" / "step0" / "results.csv").is_file()  # the first revision is kept


def test_several_revisions_need_one_model(offline_hub, tiny_llama_dir):
    result = runner.invoke(app, ["heads", REPO, REPO, "--revision", "step0,step10", "--no-progress"])
    assert result.exit_code == 1 and "one MODEL" in result.output


# ---- trainer checkpoints: a folder of them as the MODEL, and the monitor's curves --------------------------

SMALL = ["n_layer=2", "n_head=2", "n_embd=32", "block_size=32"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A monitored trigger-task training (10 steps, measured every 5) and copies of its checkpoints by step."""
    from sinkscope.train.loop import train
    from sinkscope.train.config import TrainOptions

    root = tmp_path_factory.mktemp("steps-train")
    base = dict(task="trigger", steps=10, batch_size=8, warmup_steps=2, eval_every=5, eval_windows=8,
                checkpoint_every=5, overrides=list(SMALL), progress=False, monitor_every=5, device="cpu")
    ckpt = root / "run"
    series = root / "ckpt"
    series.mkdir()
    train(TrainOptions(out=str(ckpt), stop_at=5, **base), log=lambda _m: None)
    shutil.copytree(ckpt, series / "step-5")
    train(TrainOptions(out=str(ckpt), resume=True, **base), log=lambda _m: None)
    shutil.copytree(ckpt, series / "step-10")
    return ckpt, series


@pytest.mark.slow  # trains
def test_report_on_a_checkpoint_draws_the_monitors_formation_curves(trained, tmp_path, drawn):
    from sinkscope.report import curves

    ckpt, _ = trained
    result = runner.invoke(app, ["report", str(ckpt), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    figs = tmp_path / "rep" / "figures"
    assert (figs / "formation_p0_mass.png").is_file() and (figs / "formation_value_norm_ratio.png").is_file()
    assert not (figs / "formation_phantom_mass.png").exists()  # the baseline has no phantom key
    assert 'id="formation"' in (tmp_path / "rep" / "report.html").read_text()
    monitor = pd.read_csv(ckpt / "monitor.csv")
    assert sorted(monitor["step"].unique()) == [0, 5, 10]
    lines = {line.get_label(): line for line in drawn["p0_mass"].axes[0].lines}
    for layer in (0, 1):
        rows = monitor[(monitor.metric == "p0_mass") & (monitor.layer == layer) & monitor["head"].isna()]
        rows = rows.sort_values("step")
        np.testing.assert_array_equal(lines[f"layer {layer}"].get_xdata(), rows["step"])
        np.testing.assert_allclose(lines[f"layer {layer}"].get_ydata(), rows["value"])
    model = monitor[(monitor.metric == "p0_mass") & monitor.layer.isna() & monitor["head"].isna()].sort_values("step")
    np.testing.assert_allclose(lines[curves.MODEL_LINE].get_ydata(), model["value"])


@pytest.mark.slow  # trains (its fixture)
def test_a_folder_of_trainer_checkpoints_is_a_series_with_their_steps(trained, tmp_path):
    from sinkscope.store.results import read_results

    ckpt, series = trained
    out = tmp_path / "by-step"
    result = runner.invoke(app, ["sinks", str(series), "--n-seqs", "4", "--device", "cpu", "--no-progress",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "steps.csv")
    assert table.groupby("revision", sort=False)["step"].first().to_dict() == {"step-5": 5, "step-10": 10}
    assert (out / "figures" / "steps_p0_mass.png").is_file()
    # the last checkpoint's p0 is what the monitor measured at step 10 on the same validation windows? Its own
    # windows are the checkpoint's validation split, so compare with a plain run of that checkpoint instead.
    single = tmp_path / "single"
    plain = runner.invoke(app, ["sinks", str(series / "step-10"), "--n-seqs", "4", "--device", "cpu",
                                "--no-progress", "--no-figures", "--out", str(single)])
    assert plain.exit_code == 0, plain.output
    pd.testing.assert_frame_equal(_head_rows(read_results(out / "step-10"), "p0_mass"),
                                  _head_rows(read_results(single), "p0_mass"))


@pytest.mark.slow  # trains
def test_sweep_overlays_the_formation_curves_per_variant(tmp_path, monkeypatch):
    from sinkscope.report import curves
    from sinkscope.lab.sweep import SweepOptions, sweep

    drawn = {}
    original = curves.metric_vs_step

    def spy(lines, metric, **kwargs):
        fig = original(lines, metric, **kwargs)
        drawn[metric] = (lines, fig)
        return fig

    monkeypatch.setattr(curves, "metric_vs_step", spy)
    out = tmp_path / "sweep"
    options = SweepOptions(variants=("baseline", "sinklogit"), seeds=(0,), task="trigger", out=str(out), steps=6,
                           batch_size=8, eval_windows=8, overrides=list(SMALL), n_seqs=4, probe=False,
                           monitor_every=3, device="cpu")
    sweep(options, log=lambda _m: None)
    for metric in ("p0_mass", "phantom_mass", "value_norm_ratio"):
        assert (out / f"formation_{metric}.png").is_file()
    table = pd.read_csv(out / "formation.csv")
    lines, fig = drawn["phantom_mass"]
    assert set(lines) == {"sinklogit"}  # the baseline's phantom mass is 0 by construction: not drawn
    lines, fig = drawn["p0_mass"]
    assert list(lines) == ["baseline", "sinklogit"]
    drawn_lines = {line.get_label(): line for line in fig.axes[0].lines}
    for variant in ("baseline", "sinklogit"):
        monitor = pd.read_csv(out / "runs" / f"{variant}-s0" / "ckpt" / "monitor.csv")
        model = monitor[(monitor.metric == "p0_mass") & monitor.layer.isna() & monitor["head"].isna()]
        model = model.sort_values("step")
        np.testing.assert_array_equal(drawn_lines[variant].get_xdata(), [0, 3, 6])
        np.testing.assert_allclose(drawn_lines[variant].get_ydata(), model["value"])
        mine = table[(table.variant == variant) & (table.metric == "p0_mass")].sort_values("step")
        np.testing.assert_allclose(mine["value"], model["value"])


def test_a_revision_without_a_step_has_an_empty_step_and_the_report_orders_by_position(offline_hub, text_file,
                                                                                        tmp_path, monkeypatch):
    from sinkscope.report import curves

    repo = offline_hub / f"models--{REPO.replace('/', '--')}"
    (repo / "refs" / "main").write_text((repo / "refs" / "step10").read_text())  # main = the step10 weights
    drawn = {}
    original = curves.metric_vs_step

    def spy(lines, metric, **kwargs):
        drawn[metric] = (original(lines, metric, **kwargs), kwargs)
        return drawn[metric][0]

    monkeypatch.setattr(curves, "metric_vs_step", spy)
    try:
        result = _sinks(REPO, "--revision", "step0,main", "--text-file", str(text_file), "--out", str(tmp_path / "s"))
    finally:
        (repo / "refs" / "main").unlink()
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(tmp_path / "s" / "steps.parquet")
    steps = table.groupby("revision", sort=False)["step"].first()
    assert steps["step0"] == 0 and pd.isna(steps["main"])
    fig, kwargs = drawn["p0_mass"]
    assert kwargs["x_labels"] == {0.0: "step0", 1.0: "main"}
    np.testing.assert_array_equal(fig.axes[0].lines[0].get_xdata(), [0.0, 1.0])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["step0", "main"]


def test_measure_takes_one_revision():
    import sinkscope
    from sinkscope.errors import SinkscopeError

    with pytest.raises(SinkscopeError, match="one run measures one revision"):
        sinkscope.measure(["p0_mass"], REPO, revision="step0,step10")


@pytest.mark.slow  # trains (its fixture `trained`)
def test_report_on_several_checkpoints_overlays_their_formation_curves(trained, tmp_path, drawn):
    _, series = trained
    result = runner.invoke(app, ["report", str(series / "step-5"), str(series / "step-10"), "--out",
                                 str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    lines = {line.get_label(): line for line in drawn["value_norm_ratio"].axes[0].lines}
    for name in ("step-5", "step-10"):
        monitor = pd.read_csv(series / name / "monitor.csv")
        model = monitor[(monitor.metric == "value_norm_ratio") & monitor.layer.isna() & monitor["head"].isna()]
        np.testing.assert_array_equal(lines[name].get_xdata(), model.sort_values("step")["step"])
        np.testing.assert_allclose(lines[name].get_ydata(), model.sort_values("step")["value"])
    assert (tmp_path / "rep" / "figures" / "formation_value_norm_ratio.png").is_file()


@pytest.mark.slow  # trains (its fixture `trained`)
def test_a_folder_of_several_trainings_checkpoints_is_compared_not_a_series(trained, tmp_path):
    _, series = trained
    folder = tmp_path / "ckpt"
    for seed in (0, 1):  # two trainings' checkpoints at the same step (their seeds differ)
        shutil.copytree(series / "step-10", folder / f"s{seed}")
        config = folder / f"s{seed}" / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()), "seed": seed}))
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["sinks", str(folder), "--n-seqs", "2", "--device", "cpu", "--no-progress",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "s0" / "results.csv").is_file() and (out / "s1" / "results.csv").is_file()
    assert not (out / "steps.csv").exists() and not list((out / "figures").glob("steps_*"))
    assert "sinkscope comparison of 2 runs" in (out / "report.html").read_text()


def test_ctrl_c_in_a_series_names_the_runs_kept(offline_hub, text_file, tmp_path, monkeypatch):
    from sinkscope.run import comparison

    calls = []
    original = comparison.carry_out

    def carry_out(plan_, *args, **kwargs):
        calls.append(plan_.source.revision)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(plan_, *args, **kwargs)

    monkeypatch.setattr(comparison, "carry_out", carry_out)
    out = tmp_path / "s"
    result = _sinks(REPO, "--revision", "step0,step10", "--text-file", str(text_file), "--out", str(out),
                    "--no-figures")
    assert result.exit_code == 130 and calls == ["step0", "step10"]
    assert "the runs finished before it (step0) are kept" in result.output and "--resume" in result.output
    assert (out / "step0" / "results.csv").is_file() and not (out / "step10").exists()


@pytest.mark.slow  # six runs of a series and a page (the fast tier's budget); fingerprints: tests/unit/models
def test_a_revision_serving_another_revisions_weights_is_flagged(offline_hub, hub_cache, tokenizer, text_file,
                                                                 tmp_path):
    """Issue 58, item 1 (EleutherAI/pythia#205): step30 serves step10's weights under another commit. The
    manifests' weight hashes agree, the series warns naming both and leaves step30 out of the emergence estimate;
    --strict-revisions makes it an error that keeps the runs."""
    import json

    _snapshot(hub_cache, "step30", 2, tokenizer)  # step10 was built with seed 2: the same weights, another commit
    out = tmp_path / "series"
    result = _sinks(REPO, "--revision", "step0,step10,step30", "--text-file", str(text_file), "--out", str(out),
                    "--no-figures")
    assert result.exit_code == 0, result.output
    assert "warning: step30 has the same weights as step10" in result.output
    digests = {r: json.loads((out / r / "manifest.json").read_text())["model"]["weights_sample_sha256"]
               for r in ("step0", "step10", "step30")}
    assert digests["step10"] == digests["step30"] != digests["step0"] and len(digests["step0"]) == 64
    from sinkscope.report import build_report

    page = build_report([out / r for r in ("step0", "step10", "step30")], out=tmp_path / "page").read_text()
    assert "left out as duplicates of an earlier checkpoint&#39;s weights: step30 (= step10)" in page \
        or "left out as duplicates of an earlier checkpoint's weights: step30 (= step10)" in page
    strict = _sinks(REPO, "--revision", "step0,step10,step30", "--text-file", str(text_file), "--out",
                    str(tmp_path / "strict"), "--no-figures", "--strict-revisions")
    assert strict.exit_code == 1 and "Traceback" not in strict.output
    error = [line for line in strict.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "step30 has the same weights as step10" in error[0], strict.output
    assert (tmp_path / "strict" / "step30" / "results.csv").is_file()  # its runs are kept


def test_the_page_gives_each_metrics_emergence_step_from_the_windows(series_run):
    """Issue 58, item 2: every run keeps its per-window values (window_values.npy), whose model row averages to the
    table's model value; the page's emergence step is stats.emergence on them, with its interval."""
    import json

    from sinkscope.store.results import read_results
    from sinkscope.stats.emergence import emergence

    model_rows = []
    for revision in REVISIONS:
        listed = json.loads((series_run / revision / "manifest.json").read_text())["window_values"]["metrics"]
        values = np.load(series_run / revision / "window_values.npy")  # (M, L + 1, n_w)
        assert values.shape[-1] == 4 and {"p0_mass", "sink_rate"} <= set(listed)
        model = values[listed.index("p0_mass"), -1]
        table = read_results(series_run / revision)
        plain = table[(table.metric == "p0_mass") & table["layer"].isna() & table["head"].isna()]
        plain = plain[plain["layer_type"].isna()] if "layer_type" in plain else plain
        assert model.mean() == pytest.approx(plain["value"].iloc[0], rel=1e-6)
        model_rows.append(model)
    found = emergence(np.array(STEPS, dtype=float), np.stack(model_rows))
    page = (series_run / "report.html").read_text()
    assert "p0_mass_emergence" in page or "emergence step" in page
    if not np.isnan(found.step):
        assert f"{found.step:,.0f}" in page and f"{found.threshold:.4g}" in page
