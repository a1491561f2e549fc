"""Probe recipes: a TOML file naming a command and its options, run by ``sinkscope run``.

    # probes/sinks-smollm2.toml
    command = "sinks"
    description = "..."
    [options]
    seq_len = 512
    n_seqs = 16

``--set key=value`` overrides an option (the value is parsed as TOML, so ``--set n_seqs=8``
is an int and ``--set bos='"add"'`` or ``--set bos=add`` a string). Unknown keys (top-level ones
too: an option written above ``[options]`` is not silently ignored) and wrong types are refused
with one sentence, before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import get_type_hints

from sinkscope.commands import discover, get_command
from sinkscope.errors import SinkscopeError

#: what a recipe may hold at its top level; every option goes under [options].
TOP_LEVEL_KEYS = ("command", "description", "options")


def _parse_value(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string


def _check_type(key: str, value, hint) -> None:
    if str(hint).startswith("tuple"):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise SinkscopeError(f"option {key!r} must be a list of strings, not {value!r}.")
        return
    allowed = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}
    names = [t for t in allowed if t.__name__ in str(hint)]
    if value is None and "None" in str(hint):
        return
    if names and not any(isinstance(value, allowed[t]) and not (t is not bool and isinstance(value, bool))
                         for t in names):
        raise SinkscopeError(f"option {key!r} must be {' or '.join(t.__name__ for t in names)}, not {value!r}.")


def load_recipe(path: str, overrides: list[str] = ()) -> tuple[str, object]:
    """Read a recipe and apply ``key=value`` overrides; returns (command, options dataclass)."""
    file = Path(path)
    if not file.is_file():
        raise SinkscopeError(f"no recipe file at {path}.")
    try:
        recipe = tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise SinkscopeError(f"the recipe {path} is not valid TOML ({error}).") from error
    command = recipe.get("command")
    if command not in discover():
        raise SinkscopeError(f"the recipe {path} names the command {command!r}; known: {', '.join(sorted(discover()))}.")
    options_cls = get_command(command).options
    unknown = [key for key in recipe if key not in TOP_LEVEL_KEYS]
    if unknown:
        fields = {f.name for f in dataclasses.fields(options_cls)}
        hint = " (an option: put it under [options])" if unknown[0] in fields else ""
        raise SinkscopeError(f"the recipe {path} has the unknown top-level key {unknown[0]!r}{hint}; "
                             f"a recipe holds {', '.join(TOP_LEVEL_KEYS)} at its top level.")
    if not isinstance(recipe.get("options", {}), dict):
        raise SinkscopeError(f"the options of the recipe {path} must be a table ([options] followed by key = value "
                             f"lines), not {recipe['options']!r}.")
    options = dict(recipe.get("options", {}))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SinkscopeError(f"--set takes key=value, not {item!r}.")
        options[key.strip()] = _parse_value(value.strip())
    hints = get_type_hints(options_cls)
    fields = {f.name for f in dataclasses.fields(options_cls)}
    for key, value in options.items():
        if key not in fields:
            raise SinkscopeError(f"unknown option {key!r} for {command}; known: {', '.join(sorted(fields))}.")
        _check_type(key, value, hints[key])
        if isinstance(value, list):
            options[key] = tuple(value)
    return command, options_cls(**options)


def run_recipe(path: str, overrides: list[str] = (), log=None):
    """Load and run a recipe; returns the run folder (None on data-parallel processes other than 0)."""
    from sinkscope.pipeline import execute

    command, options = load_recipe(path, overrides)
    result = execute(get_command(command), options, log=log)
    return None if result is None else result.path
