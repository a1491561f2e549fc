"""``sinkscope.runtime.progress``: which progress bar is drawn, and that it is tqdm's with the caller's arguments.

``in_notebook`` says whether we run in a Jupyter kernel as tqdm.autonotebook tells it (JupyterLite;
a kernel's ZMQ shell, but not qtconsole or Spyder, nor a missing or odd IPython); ``bar_class``
picks tqdm's notebook bar only in such a kernel whose ipywidgets works, else the plain bar, quietly;
``progress_bar`` builds that class with the arguments given. The kernel is faked through
``sys.modules`` and the environment (monkeypatched, so nothing outlives a test).
"""

from __future__ import annotations

import io
import os
import sys
import types
import warnings

import pytest
import tqdm

from sinkscope.runtime import progress


@pytest.fixture
def terminal(monkeypatch):
    """No kernel module imported, no Qt or Spyder variable: a plain terminal."""
    for name in ("ipykernel.zmqshell", "IPython.utils._process_emscripten"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for name in list(os.environ):
        if name == "QT_API" or name.startswith("SPYDER"):
            monkeypatch.delenv(name)
    return monkeypatch


def fake_kernel(monkeypatch, shell_name: str = "ZMQInteractiveShell", *, shell=True, ipython=True):
    """Pretend a kernel is running: its zmqshell module imported and IPython's ``get_ipython``."""
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    if not ipython:
        monkeypatch.delitem(sys.modules, "IPython", raising=False)
        return
    cls = type(shell_name, (), {})
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: cls() if shell else None))


def test_a_terminal_is_no_notebook_and_gets_the_plain_bar(terminal):
    assert progress.in_notebook() is False
    assert progress.bar_class() is tqdm.tqdm


def test_jupyterlite_is_a_notebook(terminal):
    terminal.setitem(sys.modules, "IPython.utils._process_emscripten", types.ModuleType("emscripten"))
    assert progress.in_notebook() is True


def test_a_zmq_kernel_is_a_notebook(terminal):
    fake_kernel(terminal)
    assert progress.in_notebook() is True


@pytest.mark.parametrize("variable", ["QT_API", "SPYDER_ARGS"])
def test_qtconsole_and_spyder_are_not_notebooks(terminal, variable):
    fake_kernel(terminal)
    terminal.setenv(variable, "1")
    assert progress.in_notebook() is False


@pytest.mark.parametrize("shell_name", ["QtInteractiveShell", "SpyderShell"])
def test_a_qt_or_spyder_shell_is_not_a_notebook(terminal, shell_name):
    fake_kernel(terminal, shell_name)
    assert progress.in_notebook() is False


def test_no_shell_or_no_ipython_is_not_a_notebook(terminal):
    fake_kernel(terminal, shell=False)
    assert progress.in_notebook() is False
    fake_kernel(terminal, ipython=False)  # IPython not imported after all: the KeyError is caught
    assert progress.in_notebook() is False


def test_a_kernel_with_working_ipywidgets_gets_the_widget_bar(terminal):
    import tqdm.notebook

    fake_kernel(terminal)
    terminal.setitem(sys.modules, "ipywidgets", types.ModuleType("ipywidgets"))
    terminal.setattr(tqdm.notebook, "IProgress", object)  # as if tqdm had found the widget
    assert progress.bar_class() is tqdm.notebook.tqdm


def test_a_kernel_with_broken_widgets_gets_the_plain_bar_without_a_warning(terminal):
    import tqdm.notebook

    fake_kernel(terminal)
    terminal.setitem(sys.modules, "ipywidgets", types.ModuleType("ipywidgets"))

    class Broken:
        def __getattr__(self, name):
            raise RuntimeError("a widget library that fails when used")

    terminal.setattr(tqdm, "notebook", Broken())  # `from tqdm import notebook` gets it; IProgress raises
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert progress.bar_class() is tqdm.tqdm


def test_progress_bar_is_the_chosen_class_with_the_callers_arguments(terminal):
    out = io.StringIO()
    bar = progress.progress_bar(total=3, desc="windows", unit="win", file=out, mininterval=0)
    assert type(bar) is progress.bar_class()
    assert bar.total == 3 and bar.desc == "windows"
    for _ in range(3):
        bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "windows" in text and "3/3" in text and "win" in text


def test_a_disabled_bar_prints_nothing(terminal):
    out = io.StringIO()
    with progress.progress_bar(total=2, file=out, disable=True) as bar:
        bar.update(2)
    assert out.getvalue() == ""
