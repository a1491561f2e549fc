"""Recovery after a save killed between its two renames (src/sinkscope/train/checkpoint.py).

The swap moves ``ck`` aside to ``.ck.old-PID`` and renames the stage ``.ck.partial-PID_XXXX``
into place; a kill between the two leaves no ``ck``. Commands that look for the checkpoint name
the copy and how to restore it, ``train --resume`` puts it back, and the leftovers of killed
saves beside a complete checkpoint are removed when sinkscope wrote them and their process is
gone, never a file it did not write.

Checkpoints are written without training (an untrained GPT and an optimizer that has not
stepped); the crash is made by making every rename onto ``ck`` fail during a save (so the save's
own clean-up cannot put the old folder back either) or by arranging the folders by hand. Only
the last test trains (marked slow).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import make_tokenizer
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.store.files import read_inventory
from sinkscope.models.resolve import resolve_source
from sinkscope.models import checkpoint_folder
from sinkscope.train import checkpoint as ckpt
from sinkscope.train.loop import train
from sinkscope.train.config import TrainOptions
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.train.model import GPT

TRIGGER = dict(task="trigger", task_options=["vocab=16"], batch_size=8, warmup_steps=1, eval_every=3, eval_windows=8,
               checkpoint_every=3, overrides=["n_layer=1", "n_head=2", "n_embd=32", "block_size=20"], progress=False,
               device="cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def save(folder: Path, tokenizer, step: int) -> Path:
    """A resumable-looking checkpoint of step ``step`` (the trigger task's recorded options), untrained."""
    torch.manual_seed(step)
    model = GPT(GPTConfig(vocab_size=len(tokenizer), block_size=20, n_layer=1, n_head=2, n_embd=32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # never stepped
    options = {"task": "trigger", "task_options": ["vocab=16"], "steps": 10, "warmup_steps": 1, "batch_size": 8}
    return ckpt.save_checkpoint(folder, model, optimizer, step, {"batches": {}}, tokenizer,
                                {"tier": "micro", "task": "trigger", "seed": 0, "train_options": options})


def dead_pid() -> int:
    """A process id no process has now."""
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
        pid -= 1


def crash_between_renames(folder: Path, tokenizer, step: int, monkeypatch) -> Path:
    """Save ``step`` over the checkpoint in ``folder`` with every rename onto ``folder`` failing: the
    swap stops after its first rename and its clean-up cannot put the old folder back, as after a kill."""
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst) == folder:
            raise OSError(5, "Input/output error")
        return real(src, dst, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", replace)
        with pytest.raises(ckpt.CheckpointWriteError):
            save(folder, tokenizer, step)
    assert not folder.exists()
    (old,) = folder.parent.glob(f".{folder.name}.old-*")
    return old


def step_of(folder: Path) -> int:
    return ckpt.read_config(folder)["step"]


def test_commands_name_the_checkpoint_an_interrupted_save_left(tmp_path, tokenizer, monkeypatch):
    ck = tmp_path / "ck"
    save(ck, tokenizer, 1)
    old = crash_between_renames(ck, tokenizer, 2, monkeypatch)
    assert old.name == f".ck.old-{os.getpid()}" and step_of(old) == 1
    assert not list(tmp_path.glob(".ck.partial-*"))  # the save's clean-up removed its stage
    assert checkpoint_folder.interrupted_save(ck) == old

    with pytest.raises(SinkscopeError) as error:
        resolve_source(str(ck))
    message = str(error.value)
    assert message == (f"no checkpoint at {ck}, but {old} next to it is the checkpoint of step 1 saved before a save "
                       f"was interrupted; restore it with `mv {old} {ck}`, or run `sinkscope train --resume --out {ck}`, "
                       "which restores it.")
    monkeypatch.chdir(tmp_path)  # a bare name that would otherwise be read as a hub id
    with pytest.raises(SinkscopeError, match=r"^no checkpoint at ck, but \.ck\.old-\d+ next to it .* `mv \.ck\.old-\d+ ck`"):
        resolve_source("ck")
    result = CliRunner().invoke(app, ["sinks", "ck", "--no-progress"])
    assert result.exit_code != 0 and "no checkpoint at ck, but .ck.old-" in result.output, result.output
    assert not (tmp_path / "ck").exists() and old.is_dir()  # a reader changes nothing

    # a new training into the absent folder would remove the copy at its first save: refused without --overwrite
    with pytest.raises(SinkscopeError, match=r"there is no ck, but \.ck\.old-\d+ next to it is the checkpoint saved "
                                             r"before a save was interrupted; pass --resume"):
        train(TrainOptions(out="ck", steps=6, **TRIGGER), log=lambda _m: None)
    assert old.is_dir() and not (tmp_path / "ck").exists()


def test_resume_puts_the_checkpoint_back_and_cleans_the_leftovers(tmp_path, tokenizer, monkeypatch):
    """The layout a kill leaves: the previous checkpoint moved aside, the complete new one still staged."""
    ck = tmp_path / "ck"
    pid = dead_pid()
    save(tmp_path / "staged", tokenizer, 6)
    stage = tmp_path / f".ck.partial-{pid}_abc123xy"
    os.rename(tmp_path / "staged", stage)
    save(tmp_path / "previous", tokenizer, 5)
    old = tmp_path / f".ck.old-{pid}"
    os.rename(tmp_path / "previous", old)

    lines: list[str] = []
    # steps=3 is refused after the checkpoint is loaded: nothing trains
    with pytest.raises(SinkscopeError, match=r"the checkpoint in .*ck is at step 5, past steps=3"):
        train(TrainOptions(out=str(ck), resume=True, steps=3, progress=False, device="cpu"), log=lines.append)
    assert lines[0] == f"restored the checkpoint of step 5 that an interrupted save left at {old} to {ck}"
    assert step_of(ck) == 5 and not old.exists()
    assert lines[1] == f"removed what interrupted saves left beside {ck}: {stage.name}"
    assert not stage.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # the lock is gone too


def test_nothing_is_restored_that_is_incomplete_or_not_only_sinkscopes(tmp_path, tokenizer):
    ck = tmp_path / "ck"
    old = tmp_path / f".ck.old-{dead_pid()}"
    save(old, tokenizer, 1)
    (old / "optimizer.pt").unlink()  # a recorded file missing
    assert checkpoint_folder.interrupted_save(ck) is None and checkpoint_folder.restore_interrupted_save(ck) is None
    with pytest.raises(SinkscopeError, match="no model file or folder at"):
        resolve_source(str(ck))
    with pytest.raises(SinkscopeError, match="no trainer checkpoint to resume"):
        train(TrainOptions(out=str(ck), resume=True, progress=False, device="cpu"), log=lambda _m: None)
    assert old.is_dir() and not ck.exists()

    shutil.rmtree(old)
    save(old, tokenizer, 1)
    (old / "notes.txt").write_text("mine")  # a file sinkscope did not write
    assert checkpoint_folder.interrupted_save(ck) is None
    (old / "notes.txt").unlink()
    (old / "sub").mkdir()  # a checkpoint has no folders
    assert checkpoint_folder.interrupted_save(ck) is None
    (old / "sub").rmdir()
    assert checkpoint_folder.interrupted_save(ck) == old

    ck.mkdir()  # something is at PATH: never replaced
    assert checkpoint_folder.interrupted_save(ck) is None and checkpoint_folder.restore_interrupted_save(ck) is None
    ck.rmdir()
    ck.symlink_to(tmp_path / "elsewhere")  # a dangling link is something too
    assert checkpoint_folder.interrupted_save(ck) is None
    ck.unlink()
    assert checkpoint_folder.restore_interrupted_save(ck) == (old, " of step 1") and step_of(ck) == 1


def test_the_next_save_removes_only_stale_leftovers_sinkscope_wrote(tmp_path, tokenizer):
    ck = tmp_path / "ck"
    save(ck, tokenizer, 1)
    pid = dead_pid()
    stale = tmp_path / f".ck.old-{pid}"  # recorded files only, its process gone: removed
    save(stale, tokenizer, 0)
    half_removed = tmp_path / f".ck.partial-{pid}_aaaaaaaa"  # a stage, some recorded files already gone: removed
    save(half_removed, tokenizer, 0)
    (half_removed / "model.safetensors").unlink()
    kept = {}
    kept["foreign"] = tmp_path / f".ck.old-{pid - 1}"  # a user's file in it
    save(kept["foreign"], tokenizer, 0)
    (kept["foreign"] / "notes.txt").write_text("mine")
    kept["live"] = tmp_path / f".ck.old-{os.getppid()}"  # its process runs (not this one's: the swap reuses that name)
    save(kept["live"], tokenizer, 0)
    kept["unrecorded"] = tmp_path / f".ck.partial-{pid}_bbbbbbbb"  # killed before its inventory
    kept["unrecorded"].mkdir()
    (kept["unrecorded"] / "model.safetensors").write_bytes(b"half")
    kept["no_pid"] = tmp_path / ".ck.partial-cccccccc"  # a stage from before stages named their process
    save(kept["no_pid"], tokenizer, 0)
    kept["other_writer"] = tmp_path / f".ck.old-{pid - 2}"  # another writer's record
    save(kept["other_writer"], tokenizer, 0)
    record = (kept["other_writer"] / ".sinkscope-files").read_text().replace('"checkpoint"', '"run"')
    (kept["other_writer"] / ".sinkscope-files").write_text(record)
    target = tmp_path / "target"
    save(target, tokenizer, 0)
    kept["link"] = tmp_path / f".ck.old-{pid - 3}"  # a link is never followed
    kept["link"].symlink_to(target)
    other = tmp_path / f".other.old-{pid}"  # another folder's leftover
    save(other, tokenizer, 0)
    before = {name: sorted(p.name for p in path.iterdir()) for name, path in kept.items()}

    # a folder that is not a complete checkpoint removes nothing
    assert checkpoint_folder.clean_leftovers(tmp_path / "absent") == []
    save(ck, tokenizer, 2)  # the next save
    assert not stale.exists() and not half_removed.exists()
    assert {name: sorted(p.name for p in path.iterdir()) for name, path in kept.items()} == before
    assert (kept["foreign"] / "notes.txt").read_text() == "mine" and other.is_dir() and target.is_dir()
    assert checkpoint_folder.is_complete_checkpoint(target) and step_of(ck) == 2
    assert read_inventory(kept["live"])["writer"] == "checkpoint"
    assert [p.name for p in tmp_path.glob(".ck.partial-*")] and not list(tmp_path.glob(f".ck.partial-{os.getpid()}_*"))


def test_a_stage_names_its_process(tmp_path, tokenizer, monkeypatch):
    """The stage is ``.NAME.partial-PID_XXXX`` (so a later save can tell a dead writer's)."""
    seen = []
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        seen.append(Path(src).name)
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    save(tmp_path / "ck", tokenizer, 1)
    assert any(name.startswith(f".ck.partial-{os.getpid()}_") for name in seen)


@pytest.mark.slow  # trains
def test_resume_after_a_kill_between_the_renames_finishes_the_run(tmp_path, monkeypatch):
    """A real run stopped at step 3, its folder left as a kill between the renames leaves it, resumes
    to the result of an uninterrupted run."""
    quiet = lambda _m: None  # noqa: E731
    whole, ck = tmp_path / "whole", tmp_path / "ck"
    train(TrainOptions(out=str(whole), steps=6, **TRIGGER), log=quiet)
    train(TrainOptions(out=str(ck), steps=6, stop_at=3, **TRIGGER), log=quiet)
    old = tmp_path / f".ck.old-{dead_pid()}"
    os.rename(ck, old)
    lines: list[str] = []
    train(TrainOptions(out=str(ck), resume=True, progress=False, device="cpu"), log=lines.append)
    assert lines[0] == f"restored the checkpoint of step 3 that an interrupted save left at {old} to {ck}"
    assert step_of(ck) == 6 and not old.exists()
    from safetensors.torch import load_file

    a, b = load_file(str(whole / "model.safetensors")), load_file(str(ck / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
