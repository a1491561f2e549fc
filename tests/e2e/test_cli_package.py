"""The command line package (src/sinkscope/cli/): each module registers its own commands on one app,
the shared options are declared once, and the error policy's signal words (the rest of the command
line is exercised end to end by the other tests here)."""

from __future__ import annotations

import typing

import sinkscope
from sinkscope.cli import application as base, inspect, lab, measuring_commands as measure, options
from sinkscope.version import __version__


def _registered_by(module) -> set[str]:
    return {info.name or info.callback.__name__ for info in base.app.registered_commands
            if info.callback.__module__ == module.__name__}


def test_each_module_registers_its_own_commands():
    assert _registered_by(measure) == {"sinks", "selectivity", "heads", "inject", "circuit", "stream", "measure",
                                        "explore"}
    assert _registered_by(lab) == {"train", "sweep", "toy", "run"}
    assert _registered_by(inspect) == {"report", "ls"}
    names = [info.name or info.callback.__name__ for info in base.app.registered_commands]
    assert names[0] == "sinks" and len(names) == len(set(names)) == 14  # measuring commands listed first


def test_the_shared_options_are_declared_once_and_used_by_every_measuring_command():
    declared = {name: value for name, value in vars(options).items() if name.endswith(("Opt", "Arg"))}
    info = {name: typing.get_args(value)[1] for name, value in declared.items() if name.endswith("Opt")}
    flags = {name: (i.default, *i.param_decls) for name, i in info.items()}  # typer keeps the first flag as default
    assert flags["SeqLenOpt"] == ("--seq-len",) and flags["OutOpt"] == ("--out", "-o")
    import inspect

    for command in ("sinks", "selectivity", "heads", "circuit", "stream", "measure", "explore"):
        function = getattr(measure, command)
        shared = [p for p in inspect.signature(function).parameters.values() if p.annotation is options.DeviceOpt]
        assert len(shared) == 1 and "device" not in function.__code__.co_varnames[:function.__code__.co_argcount]
        assert inspect.signature(function).parameters["seed"].annotation in (options.SeedOpt,) or command == "inject"
    assert inspect.signature(measure.selectivity).parameters["n_seqs"].default == 256  # a command's own default


def test_the_interrupt_words_and_codes(monkeypatch):
    assert base._interrupted() == ("interrupted", 130)
    monkeypatch.setattr(base._Stop, "signal_name", "SIGTERM")
    assert base._interrupted() == ("stopped by SIGTERM", 143)


def test_one_version_everywhere():
    from importlib.metadata import version

    assert __version__ == sinkscope.__version__ == version("sinkscope")
