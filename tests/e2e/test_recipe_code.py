"""A recipe is a file someone hands you: code it names runs only when the command line opts in
(issue 38, class 1; src/sinkscope/lab/recipes.py ``check_recipe_code``).

The planted code writes a marker file when it runs, so "it did not run" is checked on the disk,
not on the message. When code is allowed, the run first says which file it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.probes import others_can_write
from sinkscope.lab.recipes import check_recipe_code, load_steps

runner = CliRunner()

PLUGIN = '''
open({marker!r}, "w").write("ran")
from sinkscope.capture import hooks
from sinkscope.probes import Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row


@register_probe("planted_{tag}", metrics={{"planted_{tag}": MetricInfo("x", "x", "x", "test", per="model")}})
class Planted(Probe):
    def setup(self):
        self.seen = 0

    @observes(hooks.TOKENS)
    def tokens(self, layer, ids):
        pass

    def rows(self):
        return [Row(self.name, "planted_{tag}", None, None, 1.0, 1)]
'''


def _plugin(folder: Path, marker: Path, tag: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"evil_{tag}.py"
    path.write_text(PLUGIN.format(marker=str(marker), tag=tag), encoding="utf-8")
    return path


def _recipe(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _one_sentence(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def _remote_code_folder(tiny_llama_dir: Path, tmp_path: Path, marker: Path) -> Path:
    folder = tmp_path / "remote"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel", "AutoConfig": "modeling_evil.EvilConfig"}
    config["model_type"] = "evil"  # only the folder's code could build it
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_recipes_trust_remote_code_needs_the_command_line(tiny_llama_dir, text_file, tmp_path):
    marker = tmp_path / "pwned"
    folder = _remote_code_folder(tiny_llama_dir, tmp_path, marker)
    recipe = _recipe(tmp_path / "r.toml", f'command = "sinks"\n[options]\nmodel = "{folder}"\ntext_file = "{text_file}"\n'
                                          f'trust_remote_code = true\nseq_len = 16\nn_seqs = 2\nout = "{tmp_path / "o"}"\n')
    sentence = _one_sentence(runner.invoke(app, ["run", str(recipe)]))
    assert "trust_remote_code = true" in sentence and "--trust-remote-code" in sentence
    assert not marker.exists() and not (tmp_path / "o").exists()

    allowed = runner.invoke(app, ["run", str(recipe), "--trust-remote-code"])  # opted in: the code runs, and is named
    assert f"running the model folder's own code: {folder / 'modeling_evil.py'}" in allowed.output
    assert marker.exists()


def test_a_multi_step_recipe_with_trust_in_its_second_step_is_refused_before_the_first(tmp_path, text_file):
    recipe = _recipe(tmp_path / "r.toml", f'''
[[steps]]
command = "sinks"
[steps.options]
model = "{tmp_path / 'none'}"
out = "{tmp_path / 'first'}"
[[steps]]
command = "train"
[steps.options]
out = "{tmp_path / 'ckpt'}"
tokenizer = "{tmp_path / 'tok'}"
text_file = "{text_file}"
trust_remote_code = true
''')
    sentence = _one_sentence(runner.invoke(app, ["run", str(recipe)]))
    assert "step 2 (train)" in sentence and "trust_remote_code" in sentence
    assert not (tmp_path / "first").exists()


def test_a_recipes_plugin_needs_the_same_file_on_the_command_line(tiny_llama_dir, text_file, tmp_path):
    marker = tmp_path / "pwned"
    elsewhere = _plugin(tmp_path / "elsewhere", marker, "a")
    work = tmp_path / "work"
    work.mkdir()
    recipe = _recipe(work / "r.toml", f'command = "measure"\n[options]\nmodel = "{tiny_llama_dir}"\n'
                                      f'text_file = "{text_file}"\nprobes = ["planted_a"]\nplugins = ["../elsewhere/evil_a.py"]\n'
                                      f'seq_len = 16\nn_seqs = 2\nout = "{tmp_path / "o"}"\nfigures = false\n')
    cwd = os.getcwd()
    os.chdir(work)
    try:
        sentence = _one_sentence(runner.invoke(app, ["run", str(recipe)]))
        assert "../elsewhere/evil_a.py" in sentence and "--plugin" in sentence and "--allow-recipe-code" in sentence
        assert not marker.exists()
        other = _one_sentence(runner.invoke(app, ["run", str(recipe), "--plugin", str(tmp_path / "other.py")]))
        assert "evil_a.py" in other and not marker.exists()  # another file on the command line opts nothing in

        allowed = runner.invoke(app, ["run", str(recipe), "--plugin", str(elsewhere)])
        assert allowed.exit_code == 0, allowed.output
        assert f"runs the probe plugin {elsewhere.resolve()}" in allowed.output
        assert marker.exists()
    finally:
        os.chdir(cwd)


def test_allow_recipe_code_opts_in_to_everything_the_recipe_names(tiny_llama_dir, text_file, tmp_path):
    marker = tmp_path / "pwned"
    plugin = _plugin(tmp_path / "plugins", marker, "b")
    recipe = _recipe(tmp_path / "r.toml", f'command = "measure"\n[options]\nmodel = "{tiny_llama_dir}"\n'
                                          f'text_file = "{text_file}"\nprobes = ["planted_b"]\nplugins = ["{plugin}"]\n'
                                          f'seq_len = 16\nn_seqs = 2\nout = "{tmp_path / "o"}"\nfigures = false\n')
    result = runner.invoke(app, ["run", str(recipe), "--allow-recipe-code"])
    assert result.exit_code == 0, result.output
    assert f"runs the probe plugin {plugin.resolve()}" in result.output and marker.exists()


def test_set_on_the_command_line_is_the_users_own_choice(tmp_path):
    """``--set plugins=[...]`` and ``--set trust_remote_code=true`` are typed by the user: no second opt-in."""
    recipe = _recipe(tmp_path / "r.toml", 'command = "measure"\n[options]\nprobes = ["p0_mass"]\n')
    steps = load_steps(str(recipe), ['plugins=["x.py"]', "trust_remote_code=true"])
    check_recipe_code(str(recipe), steps, ['plugins=["x.py"]', "trust_remote_code=true"])  # no error
    planted = _recipe(tmp_path / "p.toml", 'command = "measure"\n[options]\nprobes = ["p0_mass"]\nplugins = ["x.py"]\n')
    with pytest.raises(SinkscopeError, match="names the probe plugin x.py"):
        check_recipe_code(str(planted), load_steps(str(planted)), [])
    check_recipe_code(str(planted), load_steps(str(planted)), [], plugins=(str(Path("x.py").resolve()),))


def test_a_plugin_anyone_can_write_gets_a_warning(tmp_path, capsys):
    from sinkscope.probes import load_plugin

    private = _plugin(tmp_path / "private", tmp_path / "m1", "c")
    os.chmod(private.parent, 0o755)
    os.chmod(private, 0o644)
    assert others_can_write(private) is None
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777 | stat.S_ISVTX)  # like /tmp
    planted = _plugin(shared, tmp_path / "m2", "d")
    os.chmod(planted, 0o644)
    assert "folder everyone can write" in others_can_write(planted)
    os.chmod(planted, 0o666)
    assert others_can_write(planted) == "is writable by everyone"
    load_plugin(str(planted))
    err = capsys.readouterr().err
    assert err.count("warning: the probe plugin") == 1 and str(planted.resolve()) in err


def test_a_recipe_nested_too_deeply_is_one_sentence(tmp_path):
    recipe = _recipe(tmp_path / "deep.toml", 'command = "sinks"\n[options]\nmodel = ' + "[" * 100000 + "]" * 100000 + "\n")
    sentence = _one_sentence(runner.invoke(app, ["run", str(recipe)]))
    assert "deep.toml" in sentence and "nested too deeply" in sentence


# ---- issue 60: a recipe says what is measured, never where it runs -------------------------------------


def _sweep_recipe(tmp_path: Path, options: str) -> Path:
    return _recipe(tmp_path / "sweep.toml", f'command = "sweep"\n[options]\nvariants = ["baseline"]\nseeds = [0]\n'
                                            f'out = "{tmp_path / "sw"}"\n{options}')


@pytest.mark.parametrize("options, named", [
    ('launcher = "submitit"\n', "launcher = 'submitit'"),
    ('slurm = ["slurm_partition=gpu"]\n', "slurm = ['slurm_partition=gpu']"),
])
def test_a_recipe_that_picks_an_executor_is_refused_before_anything_runs(tmp_path, options, named, monkeypatch):
    import sinkscope.executors.settings as choose_executor

    monkeypatch.setattr(choose_executor.shutil, "which", lambda name: f"/usr/bin/{name}")  # as on a login node
    sentence = _one_sentence(runner.invoke(app, ["run", str(_sweep_recipe(tmp_path, options))]))
    assert named in sentence and "chooses where its runs go" in sentence
    assert "--allow-recipe-executor" in sentence and "--executor" in sentence
    assert not (tmp_path / "sw").exists()


def test_a_step_that_picks_an_executor_is_refused_before_the_first_step(tmp_path):
    recipe = _recipe(tmp_path / "r.toml", f'''
[[steps]]
command = "report"
[steps.options]
runs = ["{tmp_path / 'none'}"]
out = "{tmp_path / 'page'}"
[[steps]]
command = "sweep"
[steps.options]
out = "{tmp_path / 'sw'}"
launcher = "submitit"
''')
    sentence = _one_sentence(runner.invoke(app, ["run", str(recipe)]))
    assert "step 2 (sweep)" in sentence and "--allow-recipe-executor" in sentence
    assert not (tmp_path / "page").exists() and not (tmp_path / "sw").exists()


def test_a_newline_in_a_recipes_slurm_value_is_refused_even_when_allowed(tmp_path):
    recipe = _sweep_recipe(tmp_path, 'launcher = "submitit"\nslurm = ["slurm_comment=x\\necho pwned > /tmp/x"]\n')
    sentence = _one_sentence(runner.invoke(app, ["run", str(recipe), "--allow-recipe-executor"]))
    assert "option slurm holds the control character '\\n'" in sentence
    assert not (tmp_path / "sw").exists()


def test_allow_recipe_executor_and_set_are_the_command_lines_own(tmp_path):
    from sinkscope.lab.recipes import check_recipe_executor

    planted = _sweep_recipe(tmp_path, 'launcher = "submitit"\njobs = 2\n')
    steps = load_steps(str(planted))
    with pytest.raises(SinkscopeError, match="--allow-recipe-executor"):
        check_recipe_executor(str(planted), steps)
    check_recipe_executor(str(planted), steps, allow=True)  # opted in
    plain = _sweep_recipe(tmp_path, "jobs = 2\n")  # local processes on this machine: allowed
    check_recipe_executor(str(plain), load_steps(str(plain)))
    given = ["launcher=submitit", 'slurm=["slurm_partition=gpu"]']  # typed by the user
    check_recipe_executor(str(plain), load_steps(str(plain), given), given)


def test_with_allow_recipe_executor_the_recipes_launcher_is_used(tmp_path, monkeypatch):
    """Opted in, the step's launcher picks SLURM: here, a machine without sbatch, its own sentence."""
    import sinkscope.executors.settings as choose_executor

    pytest.importorskip("submitit")
    monkeypatch.setattr(choose_executor.shutil, "which", lambda name: None)
    result = runner.invoke(app, ["run", str(_sweep_recipe(tmp_path, 'launcher = "submitit"\n')), "--allow-recipe-executor"])
    assert "submits with sbatch, which this machine does not have" in _one_sentence(result)


def test_a_recipe_says_which_paths_outside_its_folders_it_reads(tmp_path, monkeypatch, tiny_llama_dir, text_file):
    """issue 60, item 7: ``text_file = "~/.secret"`` is said, by its full path, before the first step runs."""
    from sinkscope.lab.recipes import recipe_read_notes

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    secret = elsewhere / "secret.txt"
    secret.write_text(text_file.read_text())
    monkeypatch.chdir(work)
    recipe = work / "r.toml"
    recipe.write_text(f'command = "sinks"\n[options]\nmodel = "{tiny_llama_dir}"\ntext_file = "{secret}"\n'
                      'seq_len = 16\nn_seqs = 1\nfigures = false\nout = "run"\n')
    (work / "local.txt").write_text("x")
    notes = recipe_read_notes(str(recipe), load_steps(str(recipe)))
    assert notes == [f"step 1 (sinks) reads {Path(tiny_llama_dir).resolve()} (model), outside the recipe's folder "
                     "and the working folder",
                     f"step 1 (sinks) reads {secret.resolve()} (text_file), outside the recipe's folder and the "
                     "working folder"]
    result = runner.invoke(app, ["run", str(recipe)])
    assert result.exit_code == 0, result.output
    assert f"r.toml: step 1 (sinks) reads {secret.resolve()} (text_file)" in result.output.splitlines()[1]
    inside = work / "r2.toml"
    inside.write_text('command = "sinks"\n[options]\nmodel = "HuggingFaceTB/SmolLM2-135M"\ntext_file = "local.txt"\n')
    assert recipe_read_notes(str(inside), load_steps(str(inside))) == []  # a hub id, a file in the working folder


def test_the_old_recipes_folder_name_works_for_one_release_with_a_notice(tmp_path, monkeypatch):
    from repo_paths import REPO

    monkeypatch.chdir(REPO)
    result = runner.invoke(app, ["run", "probes/sinks-smollm2.toml", "--set", "n_seqs=0"])
    assert "note: probes/sinks-smollm2.toml has moved to recipes/sinks-smollm2.toml" in result.output
    assert "--n-seqs must be at least 1" in result.output  # the recipe itself was read, then its options checked
    assert runner.invoke(app, ["run", "probes/no-such.toml"]).output.strip().endswith("no recipe file at probes/no-such.toml.")
