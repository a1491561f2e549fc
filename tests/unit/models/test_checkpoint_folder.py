"""models/checkpoint_folder.py: what a trainer checkpoint is on disk, read without torch (the folder's marker,
a damaged config, the files sinkscope did not write). The save and recovery paths are tested end to end in
tests/integration/test_checkpoint_recovery.py."""

from __future__ import annotations

import json
import sys

from sinkscope.models.checkpoint_folder import foreign_files, interrupted_save, interrupted_save_message, is_checkpoint


def test_the_marker_makes_a_checkpoint(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    assert not is_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert not is_checkpoint(folder)  # a Hugging Face folder
    (folder / "config.json").write_text(json.dumps({"sinkscope_trainer": 1}))
    assert is_checkpoint(folder)
    (folder / "config.json").write_text("[" * 100000 + "]" * 100000)
    assert not is_checkpoint(folder)  # damaged: no checkpoint here, resolving the model names the file


def test_a_users_file_is_foreign_and_an_absent_folder_has_no_leftover(tmp_path):
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    assert foreign_files(folder) == ["notes.txt"]
    assert interrupted_save(tmp_path / "absent") is None and interrupted_save_message(tmp_path / "absent") is None


def test_the_module_imports_no_torch():
    """The command line resolves a MODEL before torch loads: nothing here may import it."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(sys.modules["sinkscope.models.checkpoint_folder"].__file__).read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(name.split(".")[0] in ("torch", "transformers") for name in imported)


def test_the_loops_own_files_written_after_the_inventory_are_not_foreign(tmp_path):
    """The monitor writes monitor_windows.npz after the folder's inventory (step 0, before any checkpoint); the
    checkpoint copies it into the new folder (CARRIED_FILES), so it must not block the replacement."""
    from sinkscope.models.checkpoint_folder import CARRIED_FILES, WRITER
    from sinkscope.store.files import write_inventory

    (tmp_path / "monitor.csv").write_text("step\n")
    write_inventory(tmp_path, WRITER)
    (tmp_path / "monitor_windows.npz").write_bytes(b"written after the inventory")
    (tmp_path / "notes.txt").write_text("a user's file")
    assert "monitor_windows.npz" in CARRIED_FILES
    assert foreign_files(tmp_path) == ["notes.txt"]
