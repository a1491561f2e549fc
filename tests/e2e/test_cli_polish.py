"""The command line's small things (issue 23): help that can be pasted, --version and -h, the full
command listing, quick refusals before torch loads, and a plugin probe's errors in one sentence."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from repo_paths import REPO

SRC = str(REPO / "src")
runner = CliRunner()
COMMANDS = {info.name or info.callback.__name__: info.callback for info in app.registered_commands}


def _cli(args: list[str], cwd) -> tuple[int, str, str, set[str]]:
    """The CLI in a fresh interpreter: (exit code, stdout, stderr, heavy modules imported by the end)."""
    code = ("import sys\n"
            "sys.argv = ['sinkscope', *sys.argv[1:]]\n"
            "from sinkscope.cli import app\n"
            "try:\n"
            "    app(prog_name='sinkscope')\n"
            "except SystemExit as e:\n"
            "    status = e.code if isinstance(e.code, int) else 0\n"
            "else:\n"
            "    status = 0\n"
            "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
            "sys.exit(status)\n")
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}
    env.pop("SINKSCOPE_DEBUG", None)
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)
    lines = proc.stderr.splitlines()
    heavy = {m for m in lines[-1][len("HEAVY="):].split(",") if m}
    return proc.returncode, proc.stdout, "\n".join(lines[:-1]), heavy


# ---- 1. examples print whole at 80 columns ------------------------------------------------------------


def _examples(callback) -> list[str]:
    lines = [line.strip() for line in (inspect.getdoc(callback) or "").splitlines()]
    return [line for line in lines if line.startswith(("sinkscope ", "torchrun "))]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_example_prints_on_one_line_at_80_columns(name):
    examples = _examples(COMMANDS[name])
    assert examples, f"{name} --help shows no example"
    result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    printed = [line.strip() for line in result.output.splitlines()]
    for example in examples:
        assert example in printed, f"{name} --help wraps {example!r}:\n{result.output}"
    assert "\b" not in result.output


# ---- 2. --version and -h ---------------------------------------------------------------------------------


@pytest.mark.slow  # spawns Python
def test_version_prints_the_installed_version_without_torch(tmp_path):
    from importlib.metadata import version

    status, out, err, heavy = _cli(["--version"], tmp_path)
    assert status == 0, err
    assert out.strip() == f"sinkscope {version('sinkscope')}"
    assert not heavy


@pytest.mark.parametrize("name", [None, *sorted(COMMANDS)])
def test_dash_h_is_help_everywhere(name):
    args = [] if name is None else [name]
    short, long = runner.invoke(app, [*args, "-h"]), runner.invoke(app, [*args, "--help"])
    assert short.exit_code == 0 and long.exit_code == 0, short.output
    assert short.output == long.output and "-h, --help" in short.output


# ---- 3. ls commands lists them all ----------------------------------------------------------------------


def test_ls_commands_lists_every_command_with_its_summary():
    result = runner.invoke(app, ["ls", "commands"])
    assert result.exit_code == 0, result.output
    listed = {line.split()[0]: line.split(None, 1)[1] for line in result.output.splitlines() if line.strip()}
    assert set(listed) == set(COMMANDS) >= {"train", "sweep", "toy", "report", "run", "ls", "sinks", "measure"}
    for name, callback in COMMANDS.items():
        assert listed[name] == inspect.getdoc(callback).splitlines()[0]


# ---- 4. a missing model or text file and --out . fail before torch is imported ------------------------------


@pytest.mark.parametrize("args, sentence", [
    (["sinks", "/no/such/model"], "error: no model file or folder at /no/such/model."),
    (["heads", "/no/such/model", "EleutherAI/pythia-160m"], "error: no model file or folder at /no/such/model."),
    (["sinks", "EleutherAI/pythia-160m", "--text-file", "/no/such.txt"], "error: no text file at /no/such.txt."),
    (["sinks", "EleutherAI/pythia-160m", "--out", "."], "error: --out . is the current folder or one above it"),
    (["selectivity", "EleutherAI/pythia-160m", "--out", ".", "--resume"], "error: --out . is the current folder"),
    (["sinks", "EleutherAI/pythia-160m", "--out", "full"], "error: the folder full holds files sinkscope did not"),
])
@pytest.mark.slow  # spawns Python
def test_input_mistakes_fail_before_torch_is_imported(tmp_path, args, sentence):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    status, out, err, heavy = _cli(args, tmp_path)
    assert status == 1 and err.count("error:") == 1 and "Traceback" not in err, err
    assert err.startswith(sentence), err
    assert not heavy, f"{args} imported {heavy} before failing"


# ---- 5. --checkpoint-seconds must not be negative ---------------------------------------------------------


@pytest.mark.slow  # spawns Python
@pytest.mark.parametrize("value", ["-1", "nan"])
def test_negative_checkpoint_seconds_is_one_sentence(tmp_path, value):
    # a missing model too: the option is checked first, and old code fails fast instead of measuring
    status, out, err, heavy = _cli(["sinks", "/no/such/model", "--checkpoint-seconds", value], tmp_path)
    assert status == 1 and err.count("error:") == 1, err
    expected = "must be 0 or more" if value == "-1" else "must be a finite number"  # nan: checked where options are made
    assert err.startswith(f"error: --checkpoint-seconds {expected}"), err
    assert not heavy


# ---- 6. the progress bar in a notebook without ipywidgets ----------------------------------------------------


def _fake_kernel(monkeypatch):
    """Pretend to run in a Jupyter kernel (what tqdm.autonotebook looks at)."""
    ZMQInteractiveShell = type("ZMQInteractiveShell", (), {})
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=ZMQInteractiveShell))
    for name in list(os.environ):
        if name == "QT_API" or name.startswith("SPYDER"):
            monkeypatch.delenv(name)


def test_a_kernel_without_ipywidgets_gets_the_plain_bar_quietly(monkeypatch):
    import importlib

    import tqdm

    from sinkscope.runtime.progress import bar_class, in_notebook, progress_bar

    _fake_kernel(monkeypatch)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # `import ipywidgets` fails
    assert in_notebook()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bar_class() is tqdm.tqdm
        bar = progress_bar(total=2, disable=True)
        bar.update(2)
        bar.close()
    # what the runner used, tqdm.auto, warns here ("IProgress not found")
    for name in ("tqdm.auto", "tqdm.autonotebook"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.warns(Warning, match="IProgress"):
        importlib.import_module("tqdm.auto")


def test_the_widget_bar_only_in_a_kernel_with_ipywidgets(monkeypatch):
    import tqdm
    import tqdm.notebook

    from sinkscope.runtime.progress import bar_class, in_notebook

    monkeypatch.setitem(sys.modules, "ipywidgets", types.ModuleType("ipywidgets"))
    monkeypatch.setattr(tqdm.notebook, "IProgress", object)  # as if ipywidgets had been found
    assert not in_notebook() and bar_class() is tqdm.tqdm  # a terminal: the plain bar
    _fake_kernel(monkeypatch)
    assert bar_class() is tqdm.notebook.tqdm
    monkeypatch.setattr(tqdm.notebook, "IProgress", None)  # tqdm could not use this ipywidgets
    assert bar_class() is tqdm.tqdm


def test_the_runner_and_the_trainer_use_the_quiet_bar():
    import sinkscope.forward.runner
    import sinkscope.train.loop

    assert "progress_bar" in inspect.getsource(sinkscope.forward.runner._Bar)
    assert "tqdm.auto" not in inspect.getsource(sinkscope.forward.runner)
    assert "from sinkscope.runtime.progress import progress_bar" in inspect.getsource(sinkscope.train.loop)


# ---- 7. a plugin probe that raises: one sentence, its traceback under --debug -------------------------------

PLUGIN = '''
from sinkscope.capture import hooks
from sinkscope.probes import Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

FAIL_IN = {fail_in!r}


@register_probe("broken_probe", metrics={{"x": MetricInfo("x", "1", "x", "test", per="model")}})
class Broken(Probe):
    def setup(self):
        if FAIL_IN == "setup":
            raise KeyError("width")
        self.n = 0

    @observes(hooks.TOKENS)
    def tokens(self, layer, ids):
        if FAIL_IN == "tokens":
            self.n += 1 / 0
        self.n += ids.numel()

    def rows(self):
        if FAIL_IN == "rows":
            return [Row(self.name, "x", None, None, self.undefined, self.n)]
        return [Row(self.name, "x", None, None, float(self.n), self.n)]
'''


def _measure(plugin: Path, model: Path, text: Path, out: Path, *, fail_in: str, before=(), env=None):
    plugin.write_text(textwrap.dedent(PLUGIN.format(fail_in=fail_in)), encoding="utf-8")
    return runner.invoke(app, [*before, "measure", str(model), "--plugin", str(plugin), "--probe", "broken_probe",
                               "--text-file", str(text), "--seq-len", "16", "--n-seqs", "2", "--out", str(out),
                               "--no-progress", "--no-figures"], env=env)


@pytest.mark.parametrize("fail_in, kind", [("tokens", "ZeroDivisionError"), ("setup", "KeyError"),
                                           ("rows", "AttributeError")])
def test_a_plugin_probe_that_raises_is_one_sentence(tiny_llama_dir, text_file, tmp_path, fail_in, kind):
    plugin = tmp_path / f"probes_{fail_in}.py"
    result = _measure(plugin, tiny_llama_dir, text_file, tmp_path / "run", fail_in=fail_in,
                      env={"SINKSCOPE_DEBUG": ""})
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and result.output.count("error:") == 1, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: the probe 'broken_probe' of the plugin ") and str(plugin) in line, line
    assert f"failed in {fail_in}()" in line and kind in line and "--debug" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_prints_the_plugins_traceback(tiny_llama_dir, text_file, tmp_path, how):
    plugin = tmp_path / "probes_debug.py"
    before, env = (["--debug"], None) if how == "flag" else ((), {"SINKSCOPE_DEBUG": "1"})
    result = _measure(plugin, tiny_llama_dir, text_file, tmp_path / "run", fail_in="tokens", before=before, env=env)
    assert result.exit_code == 1, result.output
    assert "Traceback" in result.output and f'File "{plugin}"' in result.output, result.output
    assert "self.n += 1 / 0" in result.output
    assert result.output.strip().splitlines()[-1].startswith("error: the probe 'broken_probe' of the plugin ")


def test_a_builtin_probes_bug_still_surfaces(tiny_llama_dir, text_file, tmp_path, monkeypatch):
    from sinkscope.probes import get_probe

    cls = get_probe("p0_mass")

    def broken(self, layer, record):
        raise RuntimeError("our bug")

    monkeypatch.setattr(cls, cls.observers[next(iter(cls.observers))], broken)
    result = runner.invoke(app, ["measure", str(tiny_llama_dir), "--probe", "p0_mass", "--text-file",
                                 str(text_file), "--seq-len", "16", "--n-seqs", "2", "--out", str(tmp_path / "run"),
                                 "--no-progress", "--no-figures"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: sinkscope stopped on an unexpected RuntimeError: our bug") and "--debug" in line
    debug = runner.invoke(app, ["--debug", "measure", str(tiny_llama_dir), "--probe", "p0_mass", "--text-file",
                                str(text_file), "--seq-len", "16", "--n-seqs", "2", "--out", str(tmp_path / "run2"),
                                "--no-progress", "--no-figures"])
    assert debug.exit_code == 1 and "Traceback" in debug.output and 'raise RuntimeError("our bug")' in debug.output
