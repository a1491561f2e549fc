"""``python -m sinkscope`` (``sinkscope/__main__.py``), run in-process with ``runpy``.

Run as ``__main__`` it starts the command-line app under the program name ``sinkscope``:
``--help`` prints the usage and every command and exits 0, ``--version`` prints the package
version, an unknown command exits 2 with click's usage error. Imported as a module it runs
nothing and exposes the CLI's app.
"""

from __future__ import annotations

import importlib
import runpy
import sys

import pytest


def run_main(monkeypatch, *args: str) -> int:
    """Run ``python -m sinkscope ARGS`` in this process; returns the exit status."""
    monkeypatch.setattr(sys, "argv", ["sinkscope", *args])
    with pytest.raises(SystemExit) as caught:
        runpy.run_module("sinkscope", run_name="__main__", alter_sys=False)
    return caught.value.code or 0


def test_help_prints_the_usage_and_the_commands(monkeypatch, capsys):
    from sinkscope.commands import discover

    assert run_main(monkeypatch, "--help") == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: sinkscope [OPTIONS] COMMAND [ARGS]...")  # the program name, not __main__.py
    assert "Measure attention sinks in causal language models." in out
    listed = {line.split()[0] for line in out.split("Commands:")[1].splitlines() if line.strip()}
    assert set(discover()) <= listed  # every measuring command is offered
    assert {"report", "train", "ls"} <= listed


def test_version_prints_the_package_version(monkeypatch, capsys):
    from importlib.metadata import version

    assert run_main(monkeypatch, "--version") == 0
    assert capsys.readouterr().out.strip() == f"sinkscope {version('sinkscope')}"


def test_an_unknown_command_is_a_usage_error(monkeypatch, capsys):
    assert run_main(monkeypatch, "sinkz") == 2
    err = capsys.readouterr().err
    assert "Usage: sinkscope" in err and "sinkz" in err


def test_importing_the_module_runs_nothing(monkeypatch, capsys):
    import sinkscope.cli

    monkeypatch.setattr(sys, "argv", ["sinkscope", "--help"])
    monkeypatch.delitem(sys.modules, "sinkscope.__main__", raising=False)
    try:
        module = importlib.import_module("sinkscope.__main__")
    finally:  # left imported, a later runpy.run_module would warn that it was found in sys.modules
        sys.modules.pop("sinkscope.__main__", None)
    assert module.app is sinkscope.cli.application.app
    assert capsys.readouterr().out == ""
