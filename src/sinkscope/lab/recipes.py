"""Probe recipes: a TOML file naming a command and its options, run by ``sinkscope run``.

One command:

    # recipes/sinks-smollm2.toml
    command = "sinks"
    description = "..."
    [options]
    seq_len = 512
    n_seqs = 16

Several steps, run in order (``train``, ``sinks`` and ``report`` steps; e.g. train two models,
probe both, compare them on one page):

    description = "..."
    [vars]
    root = "reports/trigger"              # used below as {root}
    [[steps]]
    command = "train"
    [steps.options]
    task = "trigger"
    out = "{root}/ckpt-baseline"
    [[steps]]
    command = "report"
    [steps.options]
    runs = ["{root}/ckpt-baseline"]

``{name}`` in a string option (or in a list of strings) is replaced by ``[vars]``'s ``name``.
``--set key=value`` overrides an option (the value is parsed as TOML, so ``--set n_seqs=8``
is an int and ``--set bos='"add"'`` or ``--set bos=add`` a string); in a recipe with steps it
applies to every step whose command has that option, ``--set train.steps=100`` to the steps of
one command only, and ``--set vars.root=runs/x`` changes a variable. Unknown keys and wrong types
are refused with one sentence, before any model is loaded or trained; so are unknown top-level
keys (an option written above ``[options]`` is not silently ignored).

A recipe is a file someone hands you, like a model: code it names runs only when the command line
opts in. A step's ``trust_remote_code = true`` (the model folder's own Python code) needs
``sinkscope run --trust-remote-code``; a ``plugins = [...]`` file needs the same file given with
``--plugin`` (or ``--set plugins=...``); ``--allow-recipe-code`` allows both for every recipe given.
Anything else is refused in one sentence before the first step runs (:func:`check_recipe_code`),
and a run that does execute code first says which (``recipe_code_notes``).

A recipe decides what is measured, never where it runs: a step whose options choose an executor, a
launcher other than local, or SLURM or Ray options (a ``sweep`` step's ``launcher = "submitit"`` or
``slurm = [...]``) is refused in one sentence before the first step runs, unless ``sinkscope run``
is given ``--allow-recipe-executor`` or the value with ``--set`` (:func:`check_recipe_executor`). A
step's ``jobs`` (local processes on this machine) is allowed.

The measuring commands are the pipeline's (``commands/``: ``sinks``, ``measure``, ...); ``train``
and ``report`` steps run the trainer and the report; ``sweep`` and ``toy`` steps run
``sinkscope sweep`` (``sweep.SweepOptions``) and ``sinkscope toy`` (``toy.ToyOptions``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import get_type_hints

from sinkscope.commands import discover
from sinkscope.executors.settings import EXECUTOR_FIELDS
from sinkscope.errors import SinkscopeError, option
from sinkscope.runtime.paths import user_path

#: what a recipe may hold at its top level; every option goes under [options] (or a step's).
TOP_LEVEL_KEYS = ("command", "description", "options", "steps", "vars")


@dataclass
class ReportOptions:
    """A ``report`` step: ``sinkscope report RUN ... --label ... --out ...``."""

    runs: list[str] = dataclasses.field(default_factory=list)  # run folders and trainer checkpoints
    labels: list[str] | None = None  # one per run, in order (default: folder names)
    out: str | None = None  # default: as `sinkscope report`
    overwrite: bool = False  # replace a report sinkscope wrote at out (never other files)

    def __post_init__(self):
        from sinkscope.store.files import expand_paths

        expand_paths(self, out="out")
        self.runs = [user_path(run, "runs") for run in self.runs]


def _report(options: ReportOptions, log=None):
    from sinkscope.report import build_report

    if not options.runs:
        raise SinkscopeError("a report step needs runs = [...] (run folders or checkpoints).")
    if options.labels and len(options.labels) != len(options.runs):
        raise SinkscopeError(f"give one label per run ({len(options.runs)}), not {len(options.labels)}.")
    return build_report(options.runs, out=options.out, labels=options.labels, overwrite=options.overwrite)


def _train(options, log=None):
    from sinkscope.train.loop import train

    return train(options, log=log)


def _train_options():
    from sinkscope.train.config import TrainOptions

    return TrainOptions


def _measure(name: str):
    """The runner of a measuring command: its plan (made when the step runs, so a model an earlier step
    trains exists by then), then the pipeline; returns the run folder. ``name_prefix``: a step without
    an ``out`` writes to ``reports/<time>-<command>-<recipe>-<model>-...``."""
    def run(options, log=None, name_prefix=None, executor_options=None):
        from sinkscope.run.dispatch import execute, written_path
        from sinkscope.run.plan import plan

        return written_path(execute(plan(name, options, name_prefix=name_prefix), log=log, executor_options=executor_options))
    return run


def _sweep_options():
    from sinkscope.lab.sweep import SweepOptions

    return SweepOptions


def _sweep(options, log=None, executor_options=None):
    from sinkscope.lab.sweep import sweep, sweep_executor

    in_process = executor_options is None or executor_options.in_process  # the command line's --executor, else the step's own launcher
    return sweep(options, log=log, executor_options=sweep_executor(options) if in_process else executor_options)


def _toy_options():
    from sinkscope.lab.toy import ToyOptions

    return ToyOptions


def _toy(options, log=None, executor_options=None):
    from sinkscope.lab.toy import run_toy

    return run_toy(options, log=log, executor_options=executor_options)


def _commands() -> dict:
    """command -> (options dataclass or a function returning it, runner(options, log=...))."""
    measuring = {name: (command.options, _measure(name)) for name, command in discover().items()}
    return {**measuring, "train": (_train_options, _train), "report": (ReportOptions, _report),
            "sweep": (_sweep_options, _sweep), "toy": (_toy_options, _toy)}


_VAR = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _options_class(command: str):
    cls = _commands()[command][0]
    return cls if dataclasses.is_dataclass(cls) else cls()


def _parse_value(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text  # a bare word is a string


def _check_type(key: str, value, hint) -> None:
    text = str(hint)
    if value is None and "None" in text:
        return
    if key == "seq_len" and isinstance(value, list):  # several lengths: seq_len = [128, 512, 2048]
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise SinkscopeError(f"option 'seq_len' must be an integer or a list of integers, not {value!r}.")
        return
    if text.startswith(("list[", "tuple[")) or "list[" in text:
        if text.startswith(("list[int", "tuple[int")):  # e.g. seeds = [0, 1, 2]
            if not (isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool)
                                                             for v in value)):
                raise SinkscopeError(f"option {key!r} must be a list of integers, not {value!r}.")
            return
        if not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise SinkscopeError(f"option {key!r} must be a list of strings, not {value!r}.")
        return
    allowed = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}
    names = [t for t in allowed if t.__name__ in text]
    if names and not any(isinstance(value, allowed[t]) and not (t is not bool and isinstance(value, bool))
                         for t in names):
        raise SinkscopeError(f"option {key!r} must be {' or '.join(t.__name__ for t in names)}, not {value!r}.")


def _substitute(value, variables: dict, where: str):
    if isinstance(value, list):
        return [_substitute(v, variables, where) for v in value]
    if not isinstance(value, str):
        return value

    def one(match):
        name = match.group(1)
        if name not in variables:
            raise SinkscopeError(f"{where} uses {{{name}}}, which [vars] does not define.")
        value = variables[name]
        if isinstance(value, (list, dict)):
            raise SinkscopeError(f"{where} uses {{{name}}}, whose value in [vars] is {value!r}; a variable stands "
                                 f"in a text, so give it a string or a number.")
        return str(value)

    return _VAR.sub(one, value)


def _build(command: str, options: dict, variables: dict, where: str):
    options_cls = _options_class(command)
    hints = get_type_hints(options_cls)
    fields = {f.name for f in dataclasses.fields(options_cls)}
    values = {}
    for key, value in options.items():
        if key not in fields:
            raise SinkscopeError(f"unknown option {key!r} for {command}; known: {', '.join(sorted(fields))}.")
        value = _substitute(value, variables, where)
        _check_type(key, value, hints[key])
        values[key] = tuple(value) if isinstance(value, list) and (str(hints[key]).startswith("tuple[")
                                                                   or key == "seq_len") else value
    return options_cls(**values)


#: what one ``[[steps]]`` table holds; its options go under ``[steps.options]``.
STEP_KEYS = ("command", "options")


def _check_step_shape(step, what: str, commands: dict) -> None:
    """One sentence for a step that is not a table of ``command`` and ``options`` (``steps = [1, 2]``, an
    option written at the step's own level, where it would be ignored)."""
    if not isinstance(step, dict):
        raise SinkscopeError(f"{what} is {step!r}, not a table; write each step as [[steps]] followed by "
                             f"command = \"...\" and [steps.options].")
    unknown = [key for key in step if key not in STEP_KEYS]
    if unknown:
        command = step.get("command")
        known = isinstance(command, str) and command in commands
        option_here = known and unknown[0] in {f.name for f in dataclasses.fields(_options_class(command))}
        hint = " (an option: put it under [steps.options])" if option_here else ""
        raise SinkscopeError(f"{what} has the unknown key {unknown[0]!r}{hint}; a step holds "
                             f"{' and '.join(STEP_KEYS)}.")


#: the bundled recipes' folder before it was named recipes/ (read for one release, with a notice).
OLD_RECIPES_FOLDER = "probes"


def moved_recipe(file: Path, say=None) -> Path:
    """``probes/NAME.toml`` that no longer exists beside a ``recipes/NAME.toml`` that does: the recipe, with a
    one-line notice (the bundled recipes moved to recipes/; the old name keeps working for one release)."""
    if file.is_file() or file.parent.name != OLD_RECIPES_FOLDER:
        return file
    moved = file.parent.parent / "recipes" / file.name
    if not moved.is_file():
        return file
    (say or (lambda message: print(message, file=sys.stderr)))(
        f"note: {file} has moved to {moved}; running that (the old folder name works for one release).")
    return moved


def load_steps(path: str, overrides: list[str] = ()) -> list[tuple[str, object]]:
    """Read a recipe (one command or ``[[steps]]``) and apply ``key=value`` overrides.

    Returns the steps as ``(command, options dataclass)`` in order; every step is checked
    before the first runs.
    """
    file = moved_recipe(Path(path))
    if not file.is_file():
        raise SinkscopeError(f"no recipe file at {path}.")
    try:
        recipe = tomllib.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise SinkscopeError(f"the recipe {path} is not UTF-8 text (byte {error.start} cannot be read); save it as "
                             "UTF-8.") from error
    except tomllib.TOMLDecodeError as error:
        raise SinkscopeError(f"the recipe {path} is not valid TOML ({error}).") from error
    except RecursionError:  # a hostile file: arrays nested thousands deep
        raise SinkscopeError(f"the recipe {path} is not a recipe (its values are nested too deeply to read).") from None
    commands = _commands()
    unknown = [key for key in recipe if key not in TOP_LEVEL_KEYS]
    if unknown:
        command = recipe.get("command")
        known = isinstance(command, str) and command in commands
        fields = {f.name for f in dataclasses.fields(_options_class(command))} if known else set()
        hint = " (an option: put it under [options])" if unknown[0] in fields else ""
        raise SinkscopeError(f"the recipe {path} has the unknown top-level key {unknown[0]!r}{hint}; "
                             f"a recipe holds {', '.join(TOP_LEVEL_KEYS)} at its top level.")
    if "steps" in recipe:
        if "command" in recipe:
            raise SinkscopeError(f"the recipe {path} has both command and [[steps]]; use one.")
        raw_steps = recipe["steps"]
        if not isinstance(raw_steps, list) or not raw_steps:
            raise SinkscopeError(f"the recipe {path} has an empty [[steps]] list.")
    else:
        raw_steps = [{"command": recipe.get("command"), "options": recipe.get("options", {})}]
    if not isinstance(recipe.get("vars", {}), dict):
        raise SinkscopeError(f"[vars] of the recipe {path} must be a table ([vars] followed by name = value lines), "
                             f"not {recipe['vars']!r}.")
    variables = dict(recipe.get("vars", {}))
    steps = []
    for n, step in enumerate(raw_steps, 1):
        what = f"step {n} of the recipe {path}" if "steps" in recipe else f"the recipe {path}"
        _check_step_shape(step, what, commands)
        command = step.get("command")
        if not isinstance(command, str) or command not in commands:
            form = "" if isinstance(command, str) else ", each a string (command = \"sinks\")"
            raise SinkscopeError(f"{what} names the command {command!r}; known: {', '.join(sorted(commands))}{form}.")
        if not isinstance(step.get("options", {}), dict):
            raise SinkscopeError(f"the options of {what} must be a table ([options] followed by key = value "
                                 f"lines), not {step['options']!r}.")
        steps.append((command, dict(step.get("options", {}))))
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SinkscopeError(f"--set takes key=value, not {item!r}.")
        value = _parse_value(value.strip())
        scope, dot, name = key.partition(".")
        if dot and scope == "vars":
            variables[name] = value
            continue
        if dot and scope not in commands:
            raise SinkscopeError(f"--set {key}: {scope!r} is not a command or vars; use {', '.join(sorted(commands))} "
                                 "or vars.")
        name = name if dot else key
        targets = [(command, options) for command, options in steps if not dot or command == scope]
        if not targets:
            raise SinkscopeError(f"--set {key}: the recipe has no {scope} step.")
        if len(steps) > 1:  # only the steps whose command has the option (one step: unknown keys fail below)
            targets = [(c, o) for c, o in targets if name in {f.name for f in dataclasses.fields(_options_class(c))}]
            if not targets:
                raise SinkscopeError(f"--set {key}: no step of the recipe has the option {name!r}.")
        for _, options in targets:
            options[name] = value
    return [(command, _build(command, options, variables, f"step {n} ({command})"))
            for n, (command, options) in enumerate(steps, 1)]


def load_recipe(path: str, overrides: list[str] = ()) -> tuple[str, object]:
    """A one-command recipe: (command, options dataclass); see :func:`load_steps` for several."""
    steps = load_steps(path, overrides)
    if len(steps) != 1:
        raise SinkscopeError(f"the recipe {path} has {len(steps)} steps; load it with load_steps.")
    return steps[0]


#: the options of a step that make Python code run: the model's own code, a probe plugin file.
CODE_OPTIONS = ("trust_remote_code", "plugins")


def _set_on_command_line(overrides: list[str]) -> set[str]:
    """The option names ``--set`` gives (``plugins=...`` or ``measure.plugins=...``)."""
    names = set()
    for item in overrides:
        key = item.partition("=")[0].strip()
        scope, dot, name = key.partition(".")
        if scope != "vars":
            names.add(name if dot else key)
    return names


def _same_file(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def check_recipe_code(path: str, steps: list[tuple[str, object]], overrides: list[str] = (), *,
                      allow_code: bool = False, trust_remote_code: bool = False,
                      plugins: tuple[str, ...] = ()) -> None:
    """Refuse, in one sentence, code the recipe file names that the command line did not opt in to.

    ``trust_remote_code = true`` needs ``trust_remote_code`` (``run --trust-remote-code``); a plugin
    file needs to be among ``plugins`` (``run --plugin``); ``allow_code`` (``--allow-recipe-code``)
    allows both. Values given with ``--set`` are the command line's own.
    """
    if allow_code:
        return
    from_cli = _set_on_command_line(list(overrides))
    for n, (command, options) in enumerate(steps, 1):
        where = f"step {n} ({command}) of the recipe {path}" if len(steps) > 1 else f"the recipe {path}"
        if getattr(options, "trust_remote_code", False) and "trust_remote_code" not in from_cli and not trust_remote_code:
            raise SinkscopeError(
                f"{where} sets trust_remote_code = true, which lets the model's own Python code run; if you trust "
                f"that code, run the recipe with {option('trust_remote_code', True)} (or --allow-recipe-code).")
        if "plugins" in from_cli:
            continue
        for plugin in getattr(options, "plugins", ()) or ():
            if not any(_same_file(plugin, given) for given in plugins):
                raise SinkscopeError(
                    f"{where} names the probe plugin {plugin}, a Python file that would run; if you trust it, give it "
                    f"on the command line too ({option('plugins')} {plugin}) or run with --allow-recipe-code.")


#: the options of a step that choose where its runs go: an executor, a launcher other than local, SLURM's
#: or Ray's parameters. A step's ``jobs`` (local processes on this machine) is not among them.
EXECUTOR_OPTIONS = ("launcher", "slurm", *(name for name in EXECUTOR_FIELDS if name != "jobs"))


def _field_default(options, name: str):
    """The default of the dataclass field ``name`` of ``options``."""
    field = next(f for f in dataclasses.fields(options) if f.name == name)
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else None


def _picks_executor(options, name: str) -> bool:
    """Whether the step's option ``name`` (one of :data:`EXECUTOR_OPTIONS`) chooses where its runs go."""
    value = getattr(options, name)
    if name == "launcher":
        return value not in (None, "local")
    return value not in (None, "", (), []) and value != _field_default(options, name)


def _shown(value) -> str:
    """``value`` as a sentence quotes it: Python's repr (a newline shows as ``\\n``), at most 60 characters."""
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_recipe_executor(path: str, steps: list[tuple[str, object]], overrides: list[str] = (), *,
                          allow: bool = False) -> None:
    """Refuse, in one sentence, a step whose options choose where its runs go (:data:`EXECUTOR_OPTIONS`:
    ``launcher = "submitit"``, ``slurm = [...]``, an executor or its options), unless the command line opts
    in: ``allow`` (``run --allow-recipe-executor``), or the option given with ``--set`` (the command line's
    own). Whatever is allowed, a text among those options that holds a control character is refused (it
    would reach a batch script)."""
    from sinkscope.executors.settings import check_text

    from_cli = _set_on_command_line(list(overrides))
    for n, (command, options) in enumerate(steps, 1):
        where = f"step {n} ({command}) of the recipe {path}" if len(steps) > 1 else f"the recipe {path}"
        names = {f.name for f in dataclasses.fields(options)}
        for name in (name for name in EXECUTOR_OPTIONS if name in names):
            value = getattr(options, name)
            for text in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(text, str):
                    check_text(text, f"{where}'s option {name}")
            if allow or name in from_cli or not _picks_executor(options, name):
                continue
            raise SinkscopeError(
                f"{where} sets {name} = {_shown(value)}, which chooses where its runs go, and a recipe says what is "
                f"measured, not where it runs; choose the executor on the command line ({option('executor')}), or, "
                f"if you trust the recipe, run it with {option('allow_recipe_executor', True)}.")


def recipe_code_notes(steps: list[tuple[str, object]]) -> list[str]:
    """One line per piece of code the steps will run, said before the first step runs."""
    notes = []
    for n, (command, options) in enumerate(steps, 1):
        for plugin in getattr(options, "plugins", ()) or ():
            notes.append(f"step {n} ({command}) runs the probe plugin {Path(plugin).expanduser().resolve()}")
        if getattr(options, "trust_remote_code", False):
            what = getattr(options, "model", None) or getattr(options, "tokenizer", None) or "its model"
            notes.append(f"step {n} ({command}) may run the Python code of {what} (trust_remote_code)")
    return notes


#: the options of a step that name something it reads from disk (a model folder or file, a text, a tokenizer
#: folder, run folders for a report).
READ_OPTIONS = ("model", "text_file", "tokenizer", "runs")


def recipe_read_notes(recipe: str, steps: list[tuple[str, object]]) -> list[str]:
    """One line per path a step will read outside the recipe's folder and the working folder, said before
    the first step runs (a recipe is a file someone hands you: ``text_file = "~/.ssh/id_rsa"`` would
    otherwise land in tokens.npy and the report with only its name printed). A hub id (no such path on
    disk and no slash-led form) is not a path; a path an earlier step writes is inside the folders."""
    inside = [Path(recipe).expanduser().resolve().parent, Path.cwd().resolve()]
    notes = []
    for n, (command, options) in enumerate(steps, 1):
        for name in READ_OPTIONS:
            value = getattr(options, name, None)
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if not isinstance(item, str) or not item:
                    continue
                place = Path(item).expanduser()
                if not (place.exists() or place.is_absolute() or item.startswith(("~", "."))):
                    continue  # a hub id such as HuggingFaceTB/SmolLM2-135M
                place = place.resolve()
                if not any(place == folder or folder in place.parents for folder in inside):
                    notes.append(f"step {n} ({command}) reads {place} ({name}), outside the recipe's folder and the "
                                 "working folder")
    return notes


def _with_command_line_code(steps, trust_remote_code: bool, plugins: tuple[str, ...]):
    """``run --trust-remote-code`` and ``--plugin`` apply to every step that has the option."""
    out = []
    for command, options in steps:
        names = {f.name for f in dataclasses.fields(options)}
        changes = {}
        if trust_remote_code and "trust_remote_code" in names:
            changes["trust_remote_code"] = True
        if plugins and "plugins" in names:
            given = tuple(getattr(options, "plugins", ()) or ())
            changes["plugins"] = given + tuple(p for p in plugins if not any(_same_file(p, g) for g in given))
        out.append((command, dataclasses.replace(options, **changes) if changes else options))
    return out


def run_recipe(path: str, overrides: list[str] = (), log=None, **code):
    """Load and run a recipe's steps in order; returns what the last step returns (a folder or page)."""
    return run_recipes([path], overrides, log=log, **code)[0]


def run_recipes(paths: list[str], overrides: list[str] = (), log=None, *, allow_code: bool = False,
                trust_remote_code: bool = False, plugins: tuple[str, ...] = (), executor_options=None,
                allow_recipe_executor: bool = False) -> list:
    """Several recipes, one after the other, every one checked (and ``--set`` applied to each) before
    the first step runs; returns what each recipe's last step returns.

    Code a recipe names runs only with the command line's opt-in (:func:`check_recipe_code`):
    ``allow_code`` (``--allow-recipe-code``), ``trust_remote_code`` (``--trust-remote-code``) and
    ``plugins`` (``--plugin``, also loaded by every measuring step that takes plugins). Where the runs go
    is the command line's too (:func:`check_recipe_executor`): a step's own executor, launcher, SLURM or
    Ray options need ``allow_recipe_executor`` (``--allow-recipe-executor``). ``engine``
    (``--executor``, ``executors.settings.ExecutorOptions``) runs the runs of each measuring, ``sweep`` and
    ``toy`` step. The steps run in order (a step may need an earlier one's output), except that on an
    engine other than in-process, consecutive measuring steps (which read models and write only
    their own folders) go as one batch: the Pythia suite's 8 series are one SLURM array.
    """
    if not paths:
        raise SinkscopeError("give at least one recipe file.")
    paths = [str(moved_recipe(Path(path), log)) for path in paths]  # probes/NAME.toml: recipes/NAME.toml
    plugins = tuple(plugins)
    commands = _commands()
    loaded = []
    for path in paths:
        steps = load_steps(path, overrides)
        check_recipe_code(path, steps, overrides, allow_code=allow_code, trust_remote_code=trust_remote_code,
                          plugins=plugins)
        check_recipe_executor(path, steps, overrides, allow=allow_recipe_executor)
        loaded.append(_with_command_line_code(steps, trust_remote_code, plugins))
    say = log or (lambda message: print(message, file=sys.stderr))
    for path, steps in zip(paths, loaded):
        for note in recipe_code_notes(steps):
            say(f"{Path(path).name}: {note}")
        for note in recipe_read_notes(path, steps):
            say(f"{Path(path).name}: {note}")
    from sinkscope.store.files import check_inputs_outside

    for path, steps in zip(paths, loaded):  # a step replaces its out: never the recipe being run
        for _, options in steps:
            if getattr(options, "out", None):
                check_inputs_outside(options.out, {"the recipe": path}, flag=option("out"))
    measuring = set(discover())
    batched = executor_options is not None and not executor_options.in_process
    results = []
    for path, steps in zip(paths, loaded):
        result, batch = None, []
        for command, options in steps:  # a measuring step without an out is named after the recipe
            if batched and command in measuring:  # planned now; run with the next measuring steps as one batch
                from sinkscope.run.plan import plan

                batch.append(plan(command, options, name_prefix=Path(path).stem))
                continue
            if batch:
                result, batch = _run_batch(batch, executor_options, log), []
            extra = {"name_prefix": Path(path).stem} if command in measuring else {}
            if executor_options is not None and (command in measuring or command in ("sweep", "toy")):
                extra["executor_options"] = executor_options
            result = commands[command][1](options, log=log, **extra)
        if batch:
            result = _run_batch(batch, executor_options, log)
        results.append(result)
    return results


def _run_batch(groups: list, executor_options, log):
    """Consecutive measuring steps' plans as one batch on the engine (one Ray submission, one SLURM
    array: ``executors.execute_groups``); returns the last step's folder or page."""
    from sinkscope.run.dispatch import execute_groups

    return execute_groups(groups, executor_options, log=log)[-1]
