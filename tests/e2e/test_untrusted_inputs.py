"""Nothing in a file the user was handed runs, and nothing of theirs is overwritten (issue 23).

Planted progress files, pickled weights, a GGUF edited in the middle, planted lock files, inputs
inside the folder a run replaces, and a grep that every ``from_pretrained`` passes
``trust_remote_code`` explicitly.
"""

from __future__ import annotations

import ast
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sinkscope.store import files as fileio
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.store.statefile import load_state, read_header, save_state
from repo_paths import REPO

runner = CliRunner()
SRC = REPO / "src" / "sinkscope"


class _Planted:
    """A pickle that, when loaded, writes a marker file (what a planted file would do)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "code ran"))


def _run_args(model_dir, text_file, out) -> list[str]:
    return ["sinks", str(model_dir), "--text-file", str(text_file), "--seq-len", "16", "--n-seqs", "2",
            "--no-figures", "--no-progress", "--out", str(out)]


def _one_sentence(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.output.rstrip().endswith(errors[0]), result.output
    return errors[0]


# ---- progress files ------------------------------------------------------------------------------


def test_a_planted_pickle_progress_file_is_never_loaded(tiny_llama_dir, text_file, tmp_path):
    marker = tmp_path / "pwned"
    out = tmp_path / "run"
    with open(tmp_path / ".run.progress.pt", "wb") as handle:  # the name earlier versions read
        pickle.dump({"fingerprint": "x", "payload": _Planted(marker)}, handle)
    line = _one_sentence(runner.invoke(app, [*_run_args(tiny_llama_dir, text_file, out), "--resume"]))
    assert "pickle" in line and "not read" in line
    assert not marker.exists()


def test_a_pickle_under_the_new_name_is_refused_as_damaged(tiny_llama_dir, text_file, tmp_path):
    marker = tmp_path / "pwned"
    out = tmp_path / "run"
    torch.save({"fingerprint": "x", "payload": _Planted(marker)}, tmp_path / ".run.progress.safetensors")
    line = _one_sentence(runner.invoke(app, [*_run_args(tiny_llama_dir, text_file, out), "--resume"]))
    assert "damaged or was not written by sinkscope" in line
    assert not marker.exists()


def test_the_fingerprint_is_checked_before_anything_else_is_read(tiny_llama_dir, text_file, tmp_path):
    from safetensors.torch import save

    out = tmp_path / "run"
    # a well-formed header with another run's fingerprint, and a skeleton that cannot be read
    blob = save({"t0": torch.zeros(2)}, metadata={"sinkscope_state": "1", "header": '{"fingerprint": "other"}',
                                                  "skeleton": "not json"})
    (tmp_path / ".run.progress.safetensors").write_bytes(blob)
    line = _one_sentence(runner.invoke(app, [*_run_args(tiny_llama_dir, text_file, out), "--resume"]))
    assert "started with other options" in line


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}"])
def test_a_damaged_progress_file_is_one_sentence(content, tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    (tmp_path / ".run.progress.safetensors").write_bytes(content)
    line = _one_sentence(runner.invoke(app, [*_run_args(tiny_llama_dir, text_file, out), "--resume"]))
    assert "damaged or was not written by sinkscope" in line


def test_state_files_round_trip_nested_state(tmp_path):
    import numpy as np

    tree = {"probes": [{"quiet": {"median": {"sums": torch.arange(6.0).reshape(2, 3)}}, "n": 3, 7: None},
                       (torch.tensor([True, False]), np.arange(3))], "done": []}
    path = tmp_path / "state.safetensors"
    save_state(path, tree, header={"fingerprint": "abc", "next": 4})
    assert read_header(path) == {"fingerprint": "abc", "next": 4}
    back = load_state(path)
    assert torch.equal(back["probes"][0]["quiet"]["median"]["sums"], tree["probes"][0]["quiet"]["median"]["sums"])
    assert back["probes"][0]["n"] == 3 and back["probes"][0][7] is None
    assert isinstance(back["probes"][1], tuple) and torch.equal(back["probes"][1][0], tree["probes"][1][0])
    assert np.array_equal(back["probes"][1][1], np.arange(3))
    with pytest.raises(TypeError):
        save_state(path, {"x": object()}, header={})


# ---- remote code, pickled weights ------------------------------------------------------------------


def _from_pretrained_calls():
    """(file, line, call source) of every ``*.from_pretrained(...)`` call in the package."""
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "from_pretrained":
                yield path.relative_to(SRC), node


def test_every_from_pretrained_passes_trust_remote_code_explicitly():
    calls = list(_from_pretrained_calls())
    assert len(calls) >= 8  # run/loaders.py and train/data.py: the test looks where the calls are
    missing = [f"{path}:{node.lineno}" for path, node in calls
               if not any(k.arg == "trust_remote_code" for k in node.keywords)]
    assert not missing, f"from_pretrained without trust_remote_code=: {missing}"


def test_pickled_weights_that_need_code_are_one_sentence(tiny_llama_dir, text_file, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_llama_dir / name).is_file():
            shutil.copy(tiny_llama_dir / name, folder / name)
    marker = tmp_path / "pwned"
    torch.save({"model.embed_tokens.weight": _Planted(marker)}, folder / "pytorch_model.bin")
    line = _one_sentence(runner.invoke(app, _run_args(folder, text_file, tmp_path / "run")))
    assert "pickle" in line and "safetensors" in line
    assert not marker.exists()


def test_remote_code_is_refused_without_the_flag_and_never_prompts(tiny_llama_dir, text_file, tmp_path):
    import json

    folder = tmp_path / "remote"
    shutil.copytree(tiny_llama_dir, folder)
    marker = tmp_path / "pwned"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel", "AutoConfig": "modeling_evil.EvilConfig"}
    config["model_type"] = "evil"  # only the folder's code could build it
    (folder / "config.json").write_text(json.dumps(config))
    result = runner.invoke(app, _run_args(folder, text_file, tmp_path / "run"), input="y\ny\ny\n")
    assert "[y/N]" not in result.output
    assert "--trust-remote-code" in _one_sentence(result)
    assert not marker.exists()


# ---- GGUF cache key ---------------------------------------------------------------------------------


def test_the_gguf_cache_key_changes_when_the_middle_of_the_file_changes(tmp_path, monkeypatch):
    from sinkscope.run import loaders as sources

    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    data = bytearray(os.urandom(3 << 20))  # 3 MiB: the old key read the first and last MiB only
    path.write_bytes(bytes(data))
    first = sources.gguf_cache_dir(path)
    assert sources.gguf_cache_dir(path) == first  # stable, and memoised (gguf-hashes.json)
    stat = path.stat()
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert sources.gguf_cache_dir(path) != first
    index = (tmp_path / "cache" / "gguf-hashes.json").read_text()
    assert os.path.realpath(path) in index


# ---- lock files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("plant", [os.symlink, os.link], ids=["symlink", "hard link"])
def test_a_planted_lock_never_truncates_or_removes_its_target(plant, tmp_path):
    from sinkscope.store.results import lock_run_dir
    from sinkscope.store.files import lock_path

    target = tmp_path / "precious.txt"
    target.write_text("1234\n")  # looks like a process id: only the link count tells a hard link apart
    out = tmp_path / "run"
    plant(target, lock_path(out))
    with pytest.raises(SinkscopeError, match="not a sinkscope lock file"):
        with lock_run_dir(out):
            pass
    assert target.read_text() == "1234\n"
    assert os.path.lexists(lock_path(out))


def test_a_stale_lock_of_a_killed_run_is_replaced_and_a_live_one_refuses(tmp_path):
    from sinkscope.store.results import lock_run_dir
    from sinkscope.store.files import lock_path

    out = tmp_path / "run"
    lock_path(out).write_text("99999\n")  # a killed process's lock: no flock held
    with lock_run_dir(out):
        assert lock_path(out).read_text().strip() == str(os.getpid())
        with pytest.raises(SinkscopeError, match="is writing"):
            with lock_run_dir(out):
                pass
    assert not lock_path(out).exists()


# ---- inputs inside the output folder, revisions of local models ---------------------------------------


def test_the_model_inside_out_is_never_replaced(tiny_llama_dir, text_file, tmp_path):
    root = tmp_path / "R"
    shutil.copytree(tiny_llama_dir, root / "mymodel")
    (root / "manifest.json").write_text('{"format_version": 1, "command": "sinks"}')
    before = sorted(p.name for p in (root / "mymodel").iterdir())
    result = runner.invoke(app, [*_run_args(root / "mymodel", text_file, root), "--overwrite"])
    _one_sentence(result)
    assert sorted(p.name for p in (root / "mymodel").iterdir()) == before


def test_a_text_file_inside_out_is_refused(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    inside = out / "text.txt"
    shutil.copy(text_file, inside)
    args = _run_args(tiny_llama_dir, inside, out)
    line = _one_sentence(runner.invoke(app, [*args, "--overwrite"]))
    assert inside.is_file() and ("lies inside" in line or "did not write" in line)


def test_a_revision_of_a_local_folder_is_one_sentence(tiny_llama_dir, text_file, tmp_path):
    line = _one_sentence(runner.invoke(app, [*_run_args(tiny_llama_dir, text_file, tmp_path / "r"),
                                             "--revision", "main"]))
    assert "revision" in line and "hub" in line


def test_overwrite_replaces_a_run_of_ours_but_not_a_planted_manifest(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, _run_args(tiny_llama_dir, text_file, out)).exit_code == 0
    assert fileio.read_inventory(out)["writer"] == "run"
    assert runner.invoke(app, [*_run_args(tiny_llama_dir, text_file, out), "--overwrite"]).exit_code == 0
    (out / "notes.txt").write_text("mine")
    line = _one_sentence(runner.invoke(app, [*_run_args(tiny_llama_dir, text_file, out), "--overwrite"]))
    assert "notes.txt" in line and (out / "notes.txt").read_text() == "mine"


def test_a_run_folder_inside_the_model_folder_is_refused(tiny_llama_dir, text_file, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    line = _one_sentence(runner.invoke(app, _run_args(model, text_file, model / "run")))
    assert "lies inside the model" in line and not (model / "run").exists()
