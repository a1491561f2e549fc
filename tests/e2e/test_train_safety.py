"""The trainer never runs code it was handed, never deletes what it did not write, and says what
went wrong in one sentence (src/sinkscope/train/{loop,checkpoint,data}.py, `sinkscope train`).

Every training here is the trigger task on a one-layer model (a few steps, a 16-token vocabulary,
four validation windows) on one thread: a fraction of a second each.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import SAMPLE_TEXT, make_tokenizer
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.store.files import INVENTORY, exclusive_lock, lock_path, read_inventory, write_inventory
from sinkscope.train import checkpoint as ckpt
from sinkscope.train import data as tdata
from sinkscope.train.loop import read_log, train
from sinkscope.train.config import TrainOptions
from sinkscope.train.model import GPT

MODEL = ["n_layer=1", "n_head=2", "n_embd=32", "block_size=16"]
CLI = ["--task", "trigger", "--task-set", "vocab=16", "--set", "n_layer=1", "--set", "n_head=2", "--set", "n_embd=32",
       "--set", "block_size=16", "--batch-size", "4", "--warmup-steps", "1", "--eval-every", "2",
       "--checkpoint-every", "2", "--no-progress"]


def quiet(_message: str) -> None:
    pass


def options(out, **kw) -> TrainOptions:
    base = dict(out=str(out), task="trigger", task_options=["vocab=16"], steps=4, batch_size=4, warmup_steps=1,
                eval_every=2, eval_windows=4, checkpoint_every=2, overrides=list(MODEL), progress=False)
    base.update(kw)
    return TrainOptions(**base)


def invoke(args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error_line(result) -> str:
    """The single ``error:`` line of a failed command (exit 1, no traceback), returned for matching."""
    assert result.exit_code == 1, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], result.stderr
    return errors[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def siblings(folder: Path) -> list[str]:
    """Hidden entries beside ``folder`` that a writer left (staging, replacement, lock)."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one thread is several times faster than two on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A finished 4-step checkpoint (checkpoints at steps 2 and 4), copied by the tests that change one."""
    folder = tmp_path_factory.mktemp("base") / "ckpt"
    train(options(folder), log=quiet)
    return folder


def copy_of(base: Path, tmp_path: Path, name: str = "ckpt") -> Path:
    target = tmp_path / name
    shutil.copytree(base, target)
    return target


def nan_at(monkeypatch, step: int, exc: type[BaseException] | None = None):
    """Make training fail at ``step`` (its loss NaN, or ``exc`` raised); calls counts training forwards."""
    original = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        if targets is not None and torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] >= step:
                if exc is not None:
                    raise exc()
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    return calls


# ---- 1. code in a tokenizer folder ----------------------------------------------------------------------


def _code_tokenizer(folder: Path, marker: Path) -> Path:
    """A working tokenizer folder whose tokenizer_config.json points (auto_map) at a planted .py file that
    writes ``marker`` when it runs."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tokenizer.json").is_file():
        make_tokenizer().save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PlantedTokenizer"
    config["auto_map"] = {"AutoTokenizer": ["planted.PlantedTokenizer", "planted.PlantedTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "planted.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class PlantedTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    return folder


@pytest.fixture
def no_prompt(monkeypatch, tmp_path):
    """Any prompt is recorded and answered "y" (as a user pressing y would), and stdin is closed."""
    import transformers.dynamic_module_utils as dynamic

    asked = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": (asked.append(prompt), "y")[1])
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    return asked


def test_a_tokenizer_folder_needing_code_is_one_sentence_never_a_prompt(tmp_path, no_prompt):
    marker = tmp_path / "MARKER"
    tokenizer = _code_tokenizer(tmp_path / "tok", marker)
    text = tmp_path / "text.txt"
    text.write_text((SAMPLE_TEXT + "\n\n") * 30, encoding="utf-8")
    with pytest.raises(SinkscopeError, match=r"needs code from its folder .*--trust-remote-code") as info:
        train(TrainOptions(out=str(tmp_path / "out"), text_file=str(text), tokenizer=str(tokenizer), steps=2,
                           batch_size=2, warmup_steps=0, eval_windows=2, overrides=list(MODEL), progress=False), log=quiet)
    assert "\n" not in str(info.value)
    assert no_prompt == [] and not marker.exists()
    result = invoke(["train", "--text-file", text, "--tokenizer", tokenizer, "--steps", "2", "--out", tmp_path / "cli",
                     "--no-progress", "--set", "n_layer=1"])
    assert "needs code from its folder" in one_error_line(result)
    assert no_prompt == [] and not marker.exists()
    # the flag lets it run (the user's choice)
    assert type(tdata.load_tokenizer(str(tokenizer), trust_remote_code=True)).__name__ == "PlantedTokenizer"
    assert marker.exists()


@pytest.mark.slow  # trains
def test_a_checkpoints_tokenizer_never_runs_code(base, tmp_path, no_prompt):
    marker = tmp_path / "MARKER"
    folder = _code_tokenizer(copy_of(base, tmp_path), marker)
    with pytest.raises(SinkscopeError, match="needs code from its folder"):
        ckpt.load_checkpoint(folder)
    for flag in ([], ["--trust-remote-code"]):  # the flag is for a model's repository, not a checkpoint's tokenizer
        result = invoke(["sinks", folder, "--n-seqs", "1", "--no-figures", "--no-progress", "--out", tmp_path / "run",
                         *flag])
        assert "needs code" in one_error_line(result)
    write_inventory(folder, "checkpoint")  # as if the trainer had saved a tokenizer with its code file
    with pytest.raises(SinkscopeError, match="needs code from its folder"):  # --trust-remote-code is for --tokenizer
        train(TrainOptions(out=str(folder), resume=True, steps=6, trust_remote_code=True, progress=False), log=quiet)
    assert no_prompt == [] and not marker.exists()


# ---- 2. no pickle -------------------------------------------------------------------------------------------


class _Planted:
    """A pickle that writes a marker file when it is loaded."""

    marker = ""

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.slow  # trains (its fixture)
def test_caches_and_optimizer_state_are_loaded_without_pickle(tmp_path, monkeypatch, base):
    seen = []
    original = np.load
    monkeypatch.setattr(tdata.np, "load", lambda *a, **kw: (seen.append(kw), original(*a, **kw))[1])
    from sinkscope.data.corpus import Corpus

    corpus = Corpus("words", [SAMPLE_TEXT * 4, SAMPLE_TEXT * 3], {"kind": "texts"})
    tokenizer = make_tokenizer()
    stream = tdata.token_stream(corpus, tokenizer)
    starts, _ = tdata.passage_index(corpus, tokenizer)
    # a cache entry holding a pickle (object array) is rebuilt, never unpickled
    marker = tmp_path / "MARKER"
    _Planted.marker = str(marker)
    for path in (tmp_path / "cache" / "tokens").glob("*.npy"):
        np.save(path, np.array([_Planted()], dtype=object), allow_pickle=True)
    assert np.array_equal(tdata.token_stream(corpus, tokenizer), stream)
    assert np.array_equal(tdata.passage_index(corpus, tokenizer)[0], starts)
    assert not marker.exists()
    assert seen and all(kw.get("allow_pickle") is False for kw in seen)
    # optimizer.pt: weights_only, and a pickle that needs code is one sentence
    folder = copy_of(base, tmp_path)
    torch.save({"step": 4, "optimizer": {"x": _Planted()}}, folder / "optimizer.pt")
    with pytest.raises(SinkscopeError, match="optimizer.pt .* damaged or incomplete"):
        ckpt.load_checkpoint(folder, for_training=True)
    assert not marker.exists()


@pytest.mark.slow  # trains (its fixture `base`)
@pytest.mark.parametrize("content", [
    b"junk",
    {"step": 4},  # no optimizer state
    ["a", "list"],
    "state of another step",
    "no batch order",
], ids=["junk", "no-optimizer", "list", "other-step", "no-batches"])
def test_a_damaged_optimizer_state_is_one_sentence(base, tmp_path, content):
    folder = copy_of(base, tmp_path)
    state = torch.load(base / "optimizer.pt", weights_only=True)
    if content == b"junk":
        (folder / "optimizer.pt").write_bytes(content)
    else:
        if content == "state of another step":
            content = {**state, "step": 2}
        elif content == "no batch order":
            content = {**state, "train_state": {**state["train_state"], "batches": None}}
        torch.save(content, folder / "optimizer.pt")
    before = snapshot(folder)
    result = invoke(["train", "--resume", "--out", folder, "--steps", "6", "--no-progress"])
    assert "optimizer.pt" in one_error_line(result)
    assert snapshot(folder) == before


@pytest.mark.slow  # trains (its fixture `base`)
def test_a_batch_order_that_does_not_fit_is_one_sentence(base, tmp_path):
    folder = copy_of(base, tmp_path)
    state = torch.load(base / "optimizer.pt", weights_only=True)
    state["train_state"]["batches"]["generator"] = torch.zeros(3, dtype=torch.uint8)
    torch.save(state, folder / "optimizer.pt")
    with pytest.raises(SinkscopeError, match="optimizer.pt .* does not fit"):
        train(TrainOptions(out=str(folder), resume=True, steps=6, progress=False), log=quiet)


# ---- 3. --overwrite, and what the trainer may replace ------------------------------------------------------


@pytest.mark.slow  # trains
@pytest.mark.parametrize("failure", ["diverged", "interrupted"])
def test_overwrite_keeps_the_old_checkpoint_until_the_first_new_one(base, tmp_path, monkeypatch, failure):
    folder = copy_of(base, tmp_path)
    before = snapshot(folder)
    seen = []
    original = GPT.forward

    def forward(self, idx, targets=None, **kw):  # during the replacement, the old folder is whole and loadable
        if targets is not None and torch.is_grad_enabled():
            seen.append((ckpt.read_config(folder)["step"], snapshot(folder) == before))
            if len(seen) == 2:
                if failure == "interrupted":
                    raise KeyboardInterrupt
                logits, loss = original(self, idx, targets, **kw)
                return logits, loss * float("nan")
        return original(self, idx, targets, **kw)

    monkeypatch.setattr(GPT, "forward", forward)
    expected = KeyboardInterrupt if failure == "interrupted" else SinkscopeError
    with pytest.raises(expected):
        train(options(folder, overwrite=True, seed=1, checkpoint_every=3), log=quiet)
    assert seen == [(4, True), (4, True)]
    assert snapshot(folder) == before
    assert ckpt.load_checkpoint(folder, for_training=True)[3]["step"] == 4
    assert siblings(folder) == []


@pytest.mark.slow  # trains
def test_overwrite_replaces_a_checkpoint_at_its_first_new_checkpoint(base, tmp_path):
    folder = copy_of(base, tmp_path)
    train(options(folder, overwrite=True, seed=1, steps=3, checkpoint_every=2), log=quiet)
    meta = ckpt.read_config(folder)
    assert meta["step"] == 3 and meta["seed"] == 1
    assert [int(r["step"]) for r in read_log(folder)] == [0, 2, 3]
    assert set(read_inventory(folder)["files"]) == {p.name for p in folder.iterdir() if p.name != INVENTORY}
    assert siblings(folder) == []


@pytest.mark.slow  # trains
def test_every_checkpoint_folder_records_its_files(tmp_path, monkeypatch):
    out = tmp_path / "early"
    nan_at(monkeypatch, 1)
    with pytest.raises(SinkscopeError, match="no checkpoint had been written yet"):
        train(options(out), log=quiet)
    assert sorted(p.name for p in out.iterdir()) == [INVENTORY, "log.csv"]
    assert read_inventory(out) == {"writer": "checkpoint", "files": ["log.csv"], "trees": []}
    with pytest.raises(SinkscopeError, match="already exists; pass --overwrite"):
        train(options(out), log=quiet)
    monkeypatch.undo()
    train(options(out, overwrite=True, steps=2), log=quiet)
    assert ckpt.read_config(out)["step"] == 2
    assert set(read_inventory(out)["files"]) == {"config.json", "log.csv", "model.safetensors", "optimizer.pt",
                                                 "tokenizer.json", "tokenizer_config.json", "validation.txt"}


@pytest.mark.slow  # trains
@pytest.mark.parametrize("layout", ["checkpoint", "log-only", "legacy-checkpoint", "legacy-log-only", "subfolder"])
def test_folders_holding_foreign_files_are_never_replaced(base, tmp_path, layout):
    if layout == "log-only" or layout == "legacy-log-only":
        folder = tmp_path / "ckpt"
        folder.mkdir()
        shutil.copy(base / "log.csv", folder / "log.csv")
        if layout == "log-only":
            (folder / INVENTORY).write_text(json.dumps({"sinkscope_files": 1, "writer": "checkpoint",
                                                        "files": ["log.csv"], "trees": []}))
    else:
        folder = copy_of(base, tmp_path)
        if layout == "legacy-checkpoint":
            (folder / INVENTORY).unlink()
    if layout == "subfolder":
        (folder / "run").mkdir()
        (folder / "run" / "results.csv").write_text("mine")
    else:
        (folder / "notes.txt").write_text("mine")
    before = snapshot(folder)
    for extra in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(SinkscopeError, match="holds files sinkscope did not write|holds folders that are not part "
                                                 "of a checkpoint|no trainer checkpoint to resume"):
            train(options(folder, **extra), log=quiet)
        assert snapshot(folder) == before
    # without the user's file, the same folder is sinkscope's: --overwrite replaces it
    shutil.rmtree(folder / "run") if layout == "subfolder" else (folder / "notes.txt").unlink()
    train(options(folder, overwrite=True, steps=2), log=quiet)
    assert ckpt.read_config(folder)["step"] == 2


@pytest.mark.slow  # trains
def test_a_file_that_appears_during_training_is_never_deleted(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    original = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kw):
        if targets is not None and torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 3:
                (out / "notes.txt").write_text("mine")
        return original(self, idx, targets, **kw)

    monkeypatch.setattr(GPT, "forward", forward)
    with pytest.raises(SinkscopeError, match=r"checkpoint of step 4: .* now holds files that are not part of the "
                                             r"checkpoint \(notes.txt\)"):
        train(options(out), log=quiet)
    assert (out / "notes.txt").read_text() == "mine"
    assert ckpt.read_config(out)["step"] == 2 and siblings(out) == []


@pytest.mark.slow  # trains (its fixture `base`)
def test_inputs_inside_out_are_refused(base, tmp_path):
    folder = copy_of(base, tmp_path)
    before = snapshot(folder)
    with pytest.raises(SinkscopeError, match="the tokenizer folder .* lies inside --out"):
        train(TrainOptions(out=str(folder), tokenizer=str(folder), overwrite=True, progress=False), log=quiet)
    with pytest.raises(SinkscopeError, match="the text file .* lies inside --out"):
        train(TrainOptions(out=str(folder), text_file=str(folder / "validation.txt"), overwrite=True,
                           progress=False), log=quiet)
    assert snapshot(folder) == before


# ---- 4. one training per --out --------------------------------------------------------------------------------


@pytest.mark.slow  # trains
def test_a_second_training_into_the_same_out_fails_at_once(tmp_path, monkeypatch):
    out = tmp_path / "ckpt"
    lock = lock_path(out)
    with exclusive_lock(lock, lambda owner: f"held by {owner}"):
        with pytest.raises(SinkscopeError, match=f"another sinkscope training \\(process .*\\) is writing {out} right now"):
            train(options(out), log=quiet)
        result = invoke(["train", *CLI, "--steps", "2", "--out", out])
        assert "is writing" in one_error_line(result)
        assert not out.exists()
    # and the lock is held for the whole training
    original = GPT.forward
    busy = []

    def forward(self, idx, targets=None, **kw):
        if targets is not None and torch.is_grad_enabled() and not busy:
            with pytest.raises(SinkscopeError, match="held"):
                with exclusive_lock(lock, lambda owner: "held"):
                    pass
            busy.append(True)
        return original(self, idx, targets, **kw)

    monkeypatch.setattr(GPT, "forward", forward)
    train(options(out, steps=2), log=quiet)
    assert busy == [True] and not lock.exists() and siblings(out) == []


# ---- 5. a full disk ---------------------------------------------------------------------------------------------


def _fail_second(monkeypatch, writer: str):
    """Make the ``writer`` of the second checkpoint fail the way a full disk (or a broken writer) does."""
    import safetensors.torch

    calls = {"n": 0}

    def failing(original, error):
        def write(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:
                raise error
            return original(*args, **kwargs)
        return write

    if writer == "safetensors":
        monkeypatch.setattr(safetensors.torch, "save_file",
                            failing(safetensors.torch.save_file, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    elif writer == "torch":
        monkeypatch.setattr(torch, "save", failing(torch.save, RuntimeError("PytorchStreamWriter failed writing file "
                                                                           "data/0: file write failed")))
    else:
        from transformers import PreTrainedTokenizerFast

        monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained",
                            failing(PreTrainedTokenizerFast.save_pretrained, Exception("No space left on device")))


@pytest.mark.slow  # trains
@pytest.mark.parametrize("writer", ["safetensors", "torch", "tokenizer"])
def test_a_full_disk_names_the_step_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, writer):
    out = tmp_path / "ckpt"
    _fail_second(monkeypatch, writer)
    result = invoke(["train", *CLI, "--steps", "4", "--out", out])
    line = one_error_line(result)
    assert line.startswith(f"error: could not write the checkpoint of step 4 into {out} (")
    assert f"the checkpoint of step 2 in {out} is unchanged and still valid" in line
    if writer == "safetensors":
        assert "(No space left on device)" in line
    monkeypatch.undo()
    model, _, meta, state = ckpt.load_checkpoint(out, for_training=True)
    assert meta["step"] == 2 and state["step"] == 2
    assert siblings(out) == []
    train(TrainOptions(out=str(out), resume=True, progress=False), log=quiet)  # and it resumes
    assert ckpt.read_config(out)["step"] == 4


@pytest.mark.slow  # trains
def test_a_full_disk_before_any_checkpoint_says_so(base, tmp_path, monkeypatch):
    import safetensors.torch

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(SinkscopeError, match=r"step 2 .*no checkpoint had been written yet"):
        train(options(tmp_path / "new"), log=quiet)
    folder = copy_of(base, tmp_path)
    before = snapshot(folder)
    with pytest.raises(SinkscopeError, match=r"step 2 .*is unchanged and still holds what it held before this "
                                             r"--overwrite \(its checkpoint of step 4\)"):
        train(options(folder, overwrite=True), log=quiet)
    assert snapshot(folder) == before and siblings(folder) == [] and siblings(tmp_path / "new") == []


# ---- 6. a damaged config.json -----------------------------------------------------------------------------------


def _damage(meta: dict, form: str):
    model = dict(meta["model"])
    return {
        "no-model": {k: v for k, v in meta.items() if k != "model"},
        "empty-model": {**meta, "model": {}},
        "trainer-string": {**meta, "sinkscope_trainer": "one"},
        "trainer-bool": {**meta, "sinkscope_trainer": True},
        "model-list": {**meta, "model": [1, 2]},
        "model-string": {**meta, "model": "baseline"},
        "block-size-string": {**meta, "model": {**model, "block_size": "16"}},
        "n-layer-float": {**meta, "model": {**model, "n_layer": 1.5}},
        "n-head-zero": {**meta, "model": {**model, "n_head": 0}},
        "variant-list": {**meta, "variant": ["baseline"], "model": {**model, "variant": ["baseline"]}},
        "window-string": {**meta, "model": {**model, "window": "128"}},
        "unknown-field": {**meta, "model": {**model, "n_layers": 2}},
        "step-list": {**meta, "step": [4]},
        "no-step": {k: v for k, v in meta.items() if k != "step"},
        "train-options-string": {**meta, "train_options": "trigger"},
        "task-options-numbers": {**meta, "train_options": {**meta["train_options"], "task_options": [16]}},
        "steps-string": {**meta, "train_options": {**meta["train_options"], "steps": "4"}},
        "data-list": {**meta, "data": []},
    }[form]


FORMS = ["no-model", "empty-model", "trainer-string", "trainer-bool", "model-list", "model-string",
         "block-size-string", "n-layer-float", "n-head-zero", "variant-list", "window-string", "unknown-field",
         "step-list", "no-step", "train-options-string", "task-options-numbers", "steps-string", "data-list"]


@pytest.mark.slow  # trains (its fixture `base`)
@pytest.mark.parametrize("form", FORMS)
def test_a_damaged_config_is_one_sentence_everywhere(base, tmp_path, form):
    from sinkscope.run.loaders import load_model
    from sinkscope.models.model_config import context_length, has_phantom_key, layer_count
    from sinkscope.models.resolve import resolve_source
    from sinkscope.train.tasks import checkpoint_windows

    folder = copy_of(base, tmp_path)
    (folder / "config.json").write_text(json.dumps(_damage(json.loads((base / "config.json").read_text()), form)))
    before = snapshot(folder)
    source = resolve_source(str(folder))
    assert source.kind == "checkpoint"
    for read in (lambda: ckpt.read_config(folder), lambda: ckpt.load_checkpoint(folder),
                 lambda: checkpoint_windows(folder, n_seqs=1, seed=0), lambda: context_length(source),
                 lambda: layer_count(source), lambda: has_phantom_key(source), lambda: load_model(source, device="cpu")):
        with pytest.raises(SinkscopeError, match="config.json") as info:
            read()
        assert "\n" not in str(info.value)
    one_error_line(invoke(["sinks", folder, "--n-seqs", "1", "--no-figures", "--no-progress", "--out", tmp_path / "run"]))
    one_error_line(invoke(["train", "--resume", "--out", folder, "--steps", "6", "--no-progress"]))
    assert snapshot(folder) == before and not (tmp_path / "run").exists()


# ---- 7. options that contradict or make no sense ----------------------------------------------------------------


@pytest.mark.slow  # trains (its fixture `base`)
def test_resume_and_overwrite_contradict(base, tmp_path):
    folder = copy_of(base, tmp_path)
    before = snapshot(folder)
    line = one_error_line(invoke(["train", "--resume", "--overwrite", "--out", folder, "--no-progress"]))
    assert "--resume" in line and "--overwrite" in line and "contradict" in line
    assert snapshot(folder) == before


@pytest.mark.slow  # trains
def test_resume_with_other_steps_warns_and_is_recorded(tmp_path, capsys):
    out = tmp_path / "ckpt"
    train(options(out, steps=4, stop_at=2), log=quiet)
    capsys.readouterr()
    train(TrainOptions(out=str(out), resume=True, steps=6, stop_at=4, progress=False), log=quiet)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "--steps 6 changes the checkpoint's steps=4" in warnings[0]
    meta = ckpt.read_config(out)
    assert meta["rescheduled"] == [{"at_step": 2, "steps_before": 4, "steps_after": 6}]
    assert meta["train_options"]["steps"] == 6
    train(TrainOptions(out=str(out), resume=True, steps=8, progress=False), log=quiet)  # the history is kept
    assert ckpt.read_config(out)["rescheduled"] == [{"at_step": 2, "steps_before": 4, "steps_after": 6},
                                                    {"at_step": 4, "steps_before": 6, "steps_after": 8}]
    capsys.readouterr()
    result = invoke(["train", "--resume", "--out", out, "--steps", "8", "--no-progress"])  # same steps: no warning
    assert result.exit_code == 0 and "warning:" not in result.stderr


@pytest.mark.slow  # trains
def test_the_cli_shows_the_rescheduling_warning_with_the_progress_bar(tmp_path):
    out = tmp_path / "ckpt"
    train(options(out, steps=4, stop_at=2), log=quiet)
    result = invoke(["train", "--resume", "--out", out, "--steps", "6"])  # progress bar on
    assert result.exit_code == 0, result.output
    lines = result.stderr.replace("\r", "\n").splitlines()
    assert any(line.startswith("warning: --steps 6 changes the checkpoint's steps=4") for line in lines)


@pytest.mark.parametrize("args", [
    ["--checkpoint-every", "0"], ["--checkpoint-every", "-2"], ["--eval-every", "0"], ["--eval-every", "-1"],
    ["--steps", "0"], ["--batch-size", "0"], ["--grad-accum", "0"], ["--warmup-steps", "-1"],
    ["--warmup-steps", "4"], ["--stop-at", "0"], ["--stop-at", "9"], ["--seed", "-1"], ["--lr", "0"],
    ["--lr", "nan"], ["--lr", "inf"], ["--min-lr", "-1"], ["--lb-lambda", "nan"], ["--lb-lambda", "-1"],
    ["--force-sink-k", "-1"], ["--set", "n_layer=0"], ["--task-set", "vocab=0"], ["--device", "tpu"],
], ids=lambda a: "".join(a))
def test_nonsense_values_are_one_sentence_before_any_file(tmp_path, args):
    out = tmp_path / "ckpt"
    one_error_line(invoke(["train", *CLI, "--steps", "4", *args, "--out", out]))
    assert not out.exists() and siblings(out) == []


@pytest.mark.slow  # trains (its fixture `base`)
@pytest.mark.parametrize("args", [["--checkpoint-every", "0"], ["--eval-every", "-1"], ["--steps", "1"]])
def test_nonsense_values_on_resume_are_one_sentence(base, tmp_path, args):
    folder = copy_of(base, tmp_path)
    before = snapshot(folder)
    one_error_line(invoke(["train", "--resume", "--out", folder, "--no-progress", *args]))
    assert snapshot(folder) == before


def test_out_may_not_be_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("mine")
    for out in (".", str(tmp_path.parent)):
        line = one_error_line(invoke(["train", *CLI, "--steps", "2", "--overwrite", "--out", out]))
        assert "current folder" in line
    assert (tmp_path / "mine.txt").read_text() == "mine"
