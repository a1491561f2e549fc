"""No writer deletes or overwrites a file sinkscope did not write (issue 23, item 6).

A battery over every writer: the measuring commands (``sinkscope.commands.discover()``), the
several-model comparison, ``report``, ``sweep`` and ``toy`` (``train`` has its own tests), each
against

(a) a folder holding a user's files, one of them with the writer's own file name (``results.csv``,
    ``report.html``, ``table1.csv``, ``toy.csv``): refused with and without ``--overwrite``, exit
    1, one ``error:`` line, every file byte for byte as it was;
(b) its own earlier output: refused without ``--overwrite`` and replaced with it (except the two
    documented cases: ``report RUN`` rebuilding a run's own page, and a sweep rerun continuing
    its folder);
(c) a planted ``manifest.json`` carrying ``format_version`` and ``command`` next to a user's
    files: ``--overwrite`` still refuses;
(d) the model being measured inside the folder a run would replace: refused, the model intact.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.commands import discover
from sinkscope.store.files import INVENTORY, default_folder_mode, read_inventory, write_inventory

runner = CliRunner()


# ---- helpers ---------------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes), to compare before and after."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def user_folder(folder: Path, names: list[str]) -> Path:
    """A folder of a user's own files (``names``; ``figures/x.png`` makes the subfolder)."""
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"the user's own {name}\n".encode())
    return folder


def plant_manifest(folder: Path, command: str = "sinks") -> None:
    """A run folder's manifest, copied next to a user's files (what HEAD took for a run folder)."""
    (folder / "manifest.json").write_text(json.dumps({"format_version": 1, "command": command}))


def invoke(args: list) -> object:
    return runner.invoke(app, [str(a) for a in args])


def refused(result) -> str:
    """Exit 1 with exactly one ``error:`` line and no traceback; returns that line."""
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def ok(result) -> object:
    assert result.exit_code == 0, result.output
    return result


def recorded_exactly(folder: Path) -> bool:
    """The folder's inventory lists exactly its own plain files (nested inventoried folders aside)."""
    inventory = read_inventory(folder)
    files = set()
    for path in Path(folder).rglob("*"):
        rel = path.relative_to(folder)
        if path.is_file() and path.name != INVENTORY and not any(
                (Path(folder) / parent / INVENTORY).is_file() for parent in rel.parents if str(parent) != "."):
            files.add(str(rel))
    return inventory is not None and set(inventory["files"]) == files


def no_leftovers(where: Path, name: str) -> bool:
    """No staging folder, set-aside copy or lock of ``name`` is left beside it."""
    return not [p.name for p in Path(where).iterdir() if p.name.startswith(f".{name}.")]


# ---- the measuring commands -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gated(tmp_path_factory, tokenizer) -> Path:
    """A tiny norm-gated trainer checkpoint (what ``selectivity`` measures)."""
    import torch

    from sinkscope.train.checkpoint import save_checkpoint
    from sinkscope.models.trainer_config import GPTConfig
    from sinkscope.train.model import GPT

    folder = tmp_path_factory.mktemp("gated") / "normgate"
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(tokenizer), block_size=64, n_layer=1, n_head=2, n_embd=32, variant="normgate"))
    save_checkpoint(folder, model, None, step=0, train_state=None, tokenizer=tokenizer, meta={"tier": "test", "seed": 0})
    return folder


def command_args(name: str, tiny_llama_dir: Path, gated: Path, text_file: Path) -> list:
    """The fastest run of each measuring command: one window of 16 tokens, no figures."""
    model = {"selectivity": gated}.get(name, tiny_llama_dir)
    extra = {"measure": ["--probe", "p0_mass"], "inject": ["--doses", "0.4", "--eval-batch", "1", "--junk", "gaussian"],
             "circuit": ["--repeats", "1"], "stream": ["--cache", "4", "--policy", "window"]}.get(name, [])
    length = "--length" if name == "stream" else "--seq-len"
    return [name, model, *extra, "--text-file", text_file, length, "16", "--n-seqs", "1", "--no-progress",
            "--no-figures"]


#: the measuring commands whose fastest settings ``command_args`` knows (a new one must be added there).
COMMANDS = ("circuit", "explore", "heads", "inject", "measure", "selectivity", "sinks", "stream")


@pytest.mark.parametrize("name", sorted(discover()))
def test_a_measuring_command_replaces_only_its_own_run_folder(name, tiny_llama_dir, gated, text_file, tmp_path):
    assert set(discover()) == set(COMMANDS)  # the battery covers every measuring command
    args = command_args(name, tiny_llama_dir, gated, text_file)
    # (a) a user's folder, one file with the run's own name: refused, with or without --overwrite
    mine = user_folder(tmp_path / "mine", ["notes.txt", "results.csv"])
    before = snapshot(mine)
    for extra in ([], ["--overwrite"]):
        line = refused(invoke([*args, "--out", mine, *extra]))
        assert "notes.txt" in line and "results.csv" in line
        assert snapshot(mine) == before
    # (c) a planted manifest next to the user's files: --overwrite still refuses (HEAD replaced the folder)
    planted = user_folder(tmp_path / "planted", ["notes.txt", "results.csv"])
    plant_manifest(planted, name)
    before = snapshot(planted)
    assert "notes.txt" in refused(invoke([*args, "--out", planted, "--overwrite"]))
    assert snapshot(planted) == before
    # (b) its own earlier output: refused without --overwrite, replaced with it
    own = tmp_path / "own"
    ok(invoke([*args, "--out", own]))
    assert read_inventory(own)["writer"] == "run" and recorded_exactly(own)
    before = snapshot(own)
    assert "--overwrite" in refused(invoke([*args, "--out", own]))
    assert snapshot(own) == before
    inode = (own / "manifest.json").stat().st_ino
    ok(invoke([*args, "--out", own, "--overwrite"]))
    assert (own / "manifest.json").stat().st_ino != inode and recorded_exactly(own)
    assert no_leftovers(tmp_path, "own")


def test_a_run_folder_holding_the_model_being_measured_is_refused(tiny_llama_dir, text_file, tmp_path):
    """(d) ``sinks R/mymodel --out R --overwrite``: HEAD took R for a run folder and replaced it, model and all."""
    common = ["--text-file", text_file, "--seq-len", "16", "--n-seqs", "1", "--no-progress", "--no-figures"]
    run = tmp_path / "R"
    ok(invoke(["sinks", tiny_llama_dir, *common, "--out", run]))
    model = Path(shutil.copytree(tiny_llama_dir, run / "mymodel"))
    before = snapshot(run)
    line = refused(invoke(["sinks", model, *common, "--out", run, "--overwrite"]))
    assert "mymodel" in line
    assert snapshot(run) == before


# ---- several models: one run folder each and the comparison ----------------------------------------------


def test_several_models_write_only_a_comparison_folder_of_their_own(tiny_llama_dir, text_file, tmp_path):
    other = Path(shutil.copytree(tiny_llama_dir, tmp_path / "other-llama"))
    common = ["--text-file", text_file, "--seq-len", "16", "--n-seqs", "1", "--no-progress"]
    args = ["heads", tiny_llama_dir, other, *common]
    # (a) a user's folder with a report.html of its own: refused, whatever the flags (HEAD wrote into it)
    mine = user_folder(tmp_path / "mine", ["notes.txt", "report.html"])
    before = snapshot(mine)
    for extra in ([], ["--overwrite"], ["--resume"]):
        assert "notes.txt" in refused(invoke([*args, "--out", mine, *extra]))
        assert snapshot(mine) == before
    # (c) a planted run manifest in a model's subfolder, next to the user's files
    planted = tmp_path / "planted"
    user_folder(planted / tiny_llama_dir.name, ["notes.txt", "results.csv"])
    plant_manifest(planted / tiny_llama_dir.name, "heads")
    before = snapshot(planted)
    assert "notes.txt" in refused(invoke([*args, "--out", planted, "--overwrite"]))
    assert snapshot(planted) == before
    # (b) its own earlier comparison: --overwrite or --resume, nothing without
    own = tmp_path / "own"
    ok(invoke([*args, "--out", own]))
    inventory = read_inventory(own)
    assert inventory["writer"] == "comparison" and "report.html" in inventory["files"] and recorded_exactly(own)
    assert read_inventory(own / tiny_llama_dir.name)["writer"] == "run"
    before = snapshot(own)
    line = refused(invoke([*args, "--out", own]))
    assert "--overwrite" in line and "--resume" in line
    assert snapshot(own) == before
    inode = (own / "other-llama" / "results.csv").stat().st_ino
    ok(invoke([*args, "--out", own, "--overwrite", "--no-figures"]))
    assert (own / "other-llama" / "results.csv").stat().st_ino != inode and recorded_exactly(own)
    kept = snapshot(own / "other-llama")
    assert "Keeping the finished run" in ok(invoke([*args, "--out", own, "--resume", "--no-figures"])).output
    assert snapshot(own / "other-llama") == kept
    # (d) a model being measured inside the comparison folder: refused, the model intact
    inside = Path(shutil.copytree(tiny_llama_dir, own / "models" / "inner"))
    before = snapshot(own)
    assert "inner" in refused(invoke(["heads", inside, other, *common, "--out", own, "--overwrite"]))
    assert snapshot(own) == before


# ---- report -----------------------------------------------------------------------------------------------


def small_run(folder: Path, scale: float, metrics: tuple[str, ...] = ("p0_mass",)) -> Path:
    """A run folder as a sinkscope before inventories wrote it (2 layers x 2 heads; few figures to draw)."""
    from sinkscope.store.results import Row
    from sinkscope.store.results import rows_to_frame

    rows = []
    for metric in metrics:
        for layer in range(2):
            rows += [Row(metric, metric, layer, head, scale * (0.2 + 0.1 * layer + 0.05 * head), 16) for head in range(2)]
            rows.append(Row(metric, metric, layer, None, scale * (0.225 + 0.1 * layer), 32))
        rows.append(Row(metric, metric, None, None, scale * 0.275, 64))
    folder.mkdir(parents=True)
    rows_to_frame(rows).to_csv(folder / "results.csv", index=False)
    plant_manifest(folder)
    return folder


@pytest.fixture
def golden(tmp_path) -> tuple[Path, Path]:
    """Two run folders written before inventories (no .sinkscope-files)."""
    return small_run(tmp_path / "llama", 1.0), small_run(tmp_path / "oss", 2.0, ("p0_mass", "sink_rate"))


def test_report_out_never_replaces_a_users_files(golden, tmp_path):
    llama, oss = golden
    mine = user_folder(tmp_path / "mine", ["notes.txt", "report.html", "figures/heatmap_p0_mass.png"])
    before = snapshot(mine)
    for runs in ([llama], [llama, oss]):
        for extra in ([], ["--overwrite"]):
            assert "notes.txt" in refused(invoke(["report", *runs, "--out", mine, *extra]))
            assert snapshot(mine) == before
    # a user's report.html alone is not taken for sinkscope's
    alone = user_folder(tmp_path / "alone", ["report.html"])
    before = snapshot(alone)
    refused(invoke(["report", llama, oss, "--out", alone, "--overwrite"]))
    assert snapshot(alone) == before
    # (c) a planted manifest next to the user's files
    planted = user_folder(tmp_path / "planted", ["notes.txt", "report.html"])
    plant_manifest(planted)
    before = snapshot(planted)
    refused(invoke(["report", llama, "--out", planted, "--overwrite"]))
    assert snapshot(planted) == before
    # another writer's folder, all sinkscope's: not a report's to fill
    toy = user_folder(tmp_path / "toy", ["toy.csv"])
    write_inventory(toy, "toy")
    before = snapshot(toy)
    assert "toy" in refused(invoke(["report", llama, oss, "--out", toy, "--overwrite"]))
    assert snapshot(toy) == before
    assert not (llama / "report.html").exists() and not (llama / INVENTORY).exists()


def test_report_out_replaces_its_own_report_only_with_overwrite(golden, tmp_path):
    llama, oss = golden
    out = tmp_path / "cmp"
    ok(invoke(["report", llama, oss, "--out", out]))
    assert read_inventory(out)["writer"] == "report" and recorded_exactly(out)
    assert any(p.name.startswith("overlay_") for p in (out / "figures").iterdir())
    before = snapshot(out)
    assert "--overwrite" in refused(invoke(["report", llama, oss, "--out", out]))  # HEAD rewrote it
    assert snapshot(out) == before
    ok(invoke(["report", llama, "--out", out, "--overwrite"]))  # one run's page now: the comparison's figures go
    assert not any(p.name.startswith("overlay_") for p in (out / "figures").iterdir())
    assert "sinkscope report: llama" in (out / "report.html").read_text() and recorded_exactly(out)
    assert no_leftovers(tmp_path, "cmp")


def test_report_rebuilds_a_runs_own_page_without_overwrite(golden, tiny_llama_dir, text_file, tmp_path):
    llama, _ = golden
    run = tmp_path / "run"  # Result.save draws the page inside the staging folder
    ok(invoke(["measure", tiny_llama_dir, "--probe", "p0_mass", "--text-file", text_file, "--seq-len", "16",
               "--n-seqs", "1", "--no-progress", "--out", run]))
    inventory = read_inventory(run)
    assert inventory["writer"] == "run" and "report.html" in inventory["files"] and recorded_exactly(run)
    for _ in range(2):  # rebuilding a run's own report is the command's purpose
        assert ok(invoke(["report", run])).stdout.strip() == str(run / "report.html")
        assert read_inventory(run)["writer"] == "run" and recorded_exactly(run)
    ok(invoke(["report", llama]))  # a run folder written before inventories: rebuilt, and recorded from now on
    assert read_inventory(llama)["writer"] == "run" and recorded_exactly(llama)
    # a run folder holding something sinkscope did not write: left alone
    for stray in ("notes.txt", "figures/mine.png"):
        user_folder(run, [stray])
        before = snapshot(run)
        assert stray in refused(invoke(["report", run]))
        assert snapshot(run) == before
        (run / stray).unlink()
    assert no_leftovers(tmp_path, "run")


def test_a_report_that_fails_midway_leaves_the_old_one_whole(golden, tmp_path, monkeypatch):
    from sinkscope.report import build_report, figures

    llama, oss = golden
    out = tmp_path / "page"
    build_report([llama], out=out)
    before = snapshot(out)
    real, calls = figures.save_figure, []

    def disk_full_at_the_second(fig, stem):
        calls.append(stem)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(fig, stem)

    monkeypatch.setattr(figures, "save_figure", disk_full_at_the_second)
    with pytest.raises(OSError):
        build_report([oss], out=out, overwrite=True)  # HEAD drew into out/figures: two runs' figures mixed
    assert snapshot(out) == before
    assert no_leftovers(tmp_path, "page")


# ---- sweep ------------------------------------------------------------------------------------------------

SWEEP = ["sweep", "--variants", "baseline", "--seeds", "0", "--steps", "2", "--batch-size", "4", "--eval-windows",
         "2", "--task-set", "vocab=16", "--set", "n_layer=1", "--set", "n_embd=32", "--set", "n_head=2", "--no-probe",
         "--device", "cpu"]


def test_sweep_refuses_a_folder_it_did_not_write(tmp_path):
    # (a) a user's folder with a table1.csv of its own (HEAD trained into it and rewrote the table)
    mine = user_folder(tmp_path / "mine", ["notes.txt", "table1.csv"])
    before = snapshot(mine)
    assert "notes.txt" in refused(invoke([*SWEEP, "--out", mine]))
    assert snapshot(mine) == before
    # (c) a planted run manifest next to the user's files; a planted sweep.json does not make notes.txt a sweep's
    for planted_name, plant in (("planted", plant_manifest),
                                ("planted-sweep", lambda f: (f / "sweep.json").write_text(
                                    json.dumps({"variants": ["baseline"], "seeds": [0], "task": "trigger"})))):
        planted = user_folder(tmp_path / planted_name, ["notes.txt", "sweep.md"])
        plant(planted)
        before = snapshot(planted)
        refused(invoke([*SWEEP, "--out", planted]))
        assert snapshot(planted) == before
    # another writer's folder (sinkscope's, not a sweep's)
    run = user_folder(tmp_path / "run", ["results.csv"])
    write_inventory(run, "run")
    before = snapshot(run)
    assert "run writer" in refused(invoke([*SWEEP, "--out", run]))
    assert snapshot(run) == before


@pytest.mark.slow  # trains
def test_sweep_continues_its_own_folder_and_records_it(tmp_path):
    from sinkscope.lab.sweep import lock_sweep_dir

    out = tmp_path / "sw"
    ok(invoke([*SWEEP, "--out", out]))
    inventory = read_inventory(out)
    assert inventory["writer"] == "sweep" and sorted(inventory["trees"]) == ["engine", "submitit"]
    assert {"sweep.json", "losses.csv", "table1.csv", "sweep.md"} <= set(inventory["files"])
    assert "baseline seed 0: kept" in ok(invoke([*SWEEP, "--out", out])).output  # a rerun continues, as documented
    with lock_sweep_dir(out):  # a second sweep into the same folder while one runs
        assert "another sinkscope sweep" in refused(invoke([*SWEEP, "--out", out]))
    # a sweep folder written before inventories: recognised by its sweep.json and fixed names
    (out / INVENTORY).unlink()
    assert "baseline seed 0: kept" in ok(invoke([*SWEEP, "--out", out])).output
    assert read_inventory(out)["writer"] == "sweep"
    # ... but never a user's file in it
    (out / INVENTORY).unlink()
    user_folder(out, ["notes.txt"])
    before = snapshot(out)
    assert "notes.txt" in refused(invoke([*SWEEP, "--out", out]))
    assert snapshot(out) == before


# ---- toy --------------------------------------------------------------------------------------------------

TOY = ["toy", "--loads", "1", "--conditions", "blind", "--variants", "baseline", "--seeds", "0", "--steps", "2",
       "--batch-size", "8", "--threads", "1"]


def test_toy_never_replaces_a_users_files(tmp_path):
    # (a) a user's folder with a toy.csv of its own (HEAD rewrote it)
    mine = user_folder(tmp_path / "mine", ["notes.txt", "toy.csv"])
    alone = user_folder(tmp_path / "alone", ["toy.csv"])
    for folder in (mine, alone):
        before = snapshot(folder)
        for extra in ([], ["--overwrite"]):
            assert "toy.csv" in refused(invoke([*TOY, "--out", folder, *extra]))
            assert snapshot(folder) == before
    # (c) a planted manifest next to the user's files
    planted = user_folder(tmp_path / "planted", ["notes.txt", "toy.md"])
    plant_manifest(planted)
    before = snapshot(planted)
    refused(invoke([*TOY, "--out", planted, "--overwrite"]))
    assert snapshot(planted) == before
    # another writer's folder: not the toy task's to replace
    run = user_folder(tmp_path / "run", ["results.csv"])
    write_inventory(run, "run")
    before = snapshot(run)
    assert "run writer" in refused(invoke([*TOY, "--out", run, "--overwrite"]))
    assert snapshot(run) == before


@pytest.mark.slow  # trains
def test_toy_replaces_its_own_output_only_with_overwrite(tmp_path, monkeypatch):
    import sinkscope.lab.toy as toy

    out = tmp_path / "toy"
    ok(invoke([*TOY, "--out", out]))
    inventory = read_inventory(out)
    assert inventory["writer"] == "toy" and inventory["files"] == sorted(toy.TOY_FILES)
    before = snapshot(out)
    assert "--overwrite" in refused(invoke([*TOY, "--out", out]))  # HEAD rewrote it
    assert snapshot(out) == before
    inode = (out / "toy.csv").stat().st_ino
    ok(invoke([*TOY, "--out", out, "--overwrite"]))
    assert (out / "toy.csv").stat().st_ino != inode and read_inventory(out)["writer"] == "toy"
    # a crash while writing leaves the earlier output whole (HEAD had replaced toy.csv already)
    before = snapshot(out)

    def disk_full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("sinkscope.report.lab_figures.toy_error_by_load", disk_full)  # the figure, last written
    refused(invoke([*TOY, "--out", out, "--overwrite"]))
    assert snapshot(out) == before and no_leftovers(tmp_path, "toy")
    monkeypatch.undo()
    # written before inventories (recognised by its toy.md): replaced with --overwrite
    (out / INVENTORY).unlink()
    ok(invoke([*TOY, "--out", out, "--overwrite"]))
    assert read_inventory(out)["writer"] == "toy"
    assert (out.stat().st_mode & 0o777) == default_folder_mode()  # ordinary permissions, not mkdtemp's 0700
