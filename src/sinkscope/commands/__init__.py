"""The measuring commands: each module declares one command (its options, probes and checks).

Lives here: ``spec.py`` (``RunOptions``, ``Command`` and the checks every command shares, torch-free)
and one module per command (``sinks``, ``selectivity``, ``heads``, ``inject``, ``circuit``,
``stream``, ``measure``, ``explore``), each registered with :func:`register_command`; every module
is imported on first use.
May import: train, forward, probes, capture, kvcache, stats, report, data, models, store, runtime;
never run (which runs them) or anything above.
Add here: a new command (one module; its CLI declaration in ``cli/measuring_commands.py``; its
report section in ``report/<command>.py``).
"""

from __future__ import annotations

import importlib
import pkgutil

from sinkscope.errors import SinkscopeError, suggest
from sinkscope.commands.spec import Command

COMMANDS: dict[str, Command] = {}
_discovered = False


def register_command(command: Command) -> Command:
    """Add ``command`` to the registry (by its name); returns it."""
    COMMANDS[command.name] = command
    return command


def discover() -> dict[str, Command]:
    """Import every module of this package once; returns the registry."""
    global _discovered
    if not _discovered:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
        _discovered = True
    return COMMANDS


def make_probes(command: Command, options, spec) -> list:
    """The command's probes for a model of ``spec``, built with their parameters."""
    from sinkscope.probes import get_probe

    return [get_probe(name)(spec, **params) for name, params in command.probes(options, spec)]


def get_command(name: str) -> Command:
    """The command registered as ``name``, or a one-sentence error with a suggestion."""
    commands = discover()
    if name not in commands:
        raise SinkscopeError(f"unknown command {name!r}{suggest(name, commands)}; "
                             f"known: {', '.join(sorted(commands))}.")
    return commands[name]
