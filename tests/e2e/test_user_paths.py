"""``~`` in a path is expanded the same way everywhere, and a name that is not UTF-8 is refused
before anything loads (issue 38, class 4; ``paths.user_path``, applied where options are made).

``HOME`` points at a folder of the test, so ``~`` is known; the working directory is another
one, where a literal ``~`` folder would appear if any writer took the path as given.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from repo_paths import GOLDEN
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.commands.spec import RunOptions
from sinkscope.runtime.paths import user_path

runner = CliRunner()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "home"
    folder.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.chdir(work)
    return folder


def _no_literal_tilde(tmp_path: Path) -> None:
    assert not any(p.name == "~" for p in tmp_path.rglob("*")), "a folder named ~ was made"


def test_user_path_expands_a_leading_tilde_only(home):
    assert user_path("~/runs/x", "--out") == str(home / "runs" / "x")
    assert user_path("runs/~x", "--out") == "runs/~x" and user_path(None, "--out") is None
    with pytest.raises(SinkscopeError, match=r"--out caf\\udce9 holds bytes that are not UTF-8"):
        user_path("caf\udce9", "--out")
    assert RunOptions(out="~/o", text_file="~/t.txt", model="~/m").out == str(home / "o")


def test_sinks_with_a_quoted_tilde_out_writes_under_home(home, tmp_path, tiny_llama_dir, text_file):
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--out", "~/runs/x", "--no-figures", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert (home / "runs" / "x" / "results.csv").is_file()
    _no_literal_tilde(tmp_path)


def test_a_recipes_tilde_out_and_text_file_both_expand(home, tmp_path, tiny_llama_dir, text_file):
    shutil.copy(text_file, home / "book.txt")
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'command = "sinks"\n[options]\nmodel = "{tiny_llama_dir}"\ntext_file = "~/book.txt"\n'
                      'out = "~/recipe-run"\nseq_len = 16\nn_seqs = 2\nfigures = false\nprogress = false\n')
    result = runner.invoke(app, ["run", str(recipe)])
    assert result.exit_code == 0, result.output
    assert (home / "recipe-run" / "results.csv").is_file()
    _no_literal_tilde(tmp_path)


def test_a_recipes_out_of_home_itself_is_refused_not_made(home, tmp_path, tiny_llama_dir, text_file):
    (home / "notes.txt").write_text("mine")
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'command = "sinks"\n[options]\nmodel = "{tiny_llama_dir}"\ntext_file = "{text_file}"\n'
                      'out = "~"\nseq_len = 16\nn_seqs = 2\n')
    result = runner.invoke(app, ["run", str(recipe)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert (home / "notes.txt").read_text() == "mine"
    _no_literal_tilde(tmp_path)


def test_report_takes_tilde_runs_and_out(home, tmp_path):
    shutil.copytree(GOLDEN / "run_tiny_llama", home / "run")
    result = runner.invoke(app, ["report", "~/run", "--out", "~/page"])
    assert result.exit_code == 0, result.output
    assert (home / "page" / "report.html").is_file()
    _no_literal_tilde(tmp_path)


@pytest.mark.parametrize("command", ["sinks", "stream", "heads", "inject"])
def test_an_out_that_is_not_utf8_is_one_sentence_before_loading(command, home, tiny_llama_dir, text_file, monkeypatch):
    import sinkscope.run.loaders

    monkeypatch.setattr(sinkscope.run.loaders, "load_model", None)  # reaching the load would be a TypeError
    result = runner.invoke(app, [command, str(tiny_llama_dir), "--text-file", str(text_file),
                                 "--out", os.fsdecode(b"caf\xe9")])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert "not UTF-8" in result.output and "--out" in result.output
    assert not any(p.name.startswith("caf") for p in Path.cwd().iterdir())
