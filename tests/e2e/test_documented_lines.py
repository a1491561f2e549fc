"""Every documented line runs (issue 61): each shell command and Python block of README.md, docs/
(docs/*.md, docs/commands/, docs/results/, recipes/README.md as the site includes it, the tutorial
notebook) and the CLI's ``--help`` examples, as ``tests/doc_lines.py`` extracts them.

Fast tier (parsing only, nothing loads or runs):

- every ``sinkscope ...`` line goes through the real command line (click's parsing, each command's
  own argument handling and every check that needs no model: ``run.plan.plan`` with the models
  unresolved, the trainer's ``resolve_options``, the sweep's and toy's checks, a recipe's steps, the
  executors' options), so an unknown option, tier, variant or choice, an extra argument or a value of
  the wrong type fails here, naming the page and line;
- the other commands name what exists: ``make`` targets, ``pip`` extras, scripts and their options;
- every Python block parses, its imports and ``sinkscope.x.y`` names resolve, ``sinkscope.measure``'s
  keywords are options of the command, and attributes read off its result exist; the explorer's
  console calls name functions of its page API;
- a line that needs weights not available offline, a GPU, SLURM or a Ray cluster says so
  (``# needs: weights`` ...), and a marked line names what it needs.

Slow tier (tests/e2e/test_documented_lines_run.py, ``test_documented_lines_run`` and
``test_documented_python_blocks_run``): the sinkscope lines of README.md, getting-started, explorer,
lengths, docs/commands/ and the --help examples, and the Python blocks of README.md, getting-started,
api and explorer, run for real, page by page in a folder of its own, sizes shrunk (``--seq-len``,
``--n-seqs``, ``--length``, ``--steps``, ...; its ``shrink``) and hub ids replaced by tiny models of
the same architecture built from their configs; a marked line also runs as written, offline, and its
error must be one sentence. Each line has a time budget (its ``LINE_BUDGET_S``). The notebook runs in
tests/e2e/test_tutorial.py.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import re
import shlex
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from doc_lines import NEEDS, DocLine, all_lines
from repo_paths import REPO

LINES = all_lines()
SHELL = [line for line in LINES if line.kind == "shell"]
#: the first folder of a local path written in the docs (anything else of the form ORG/NAME is a hub id)
LOCAL_ROOTS = ("ckpt", "ckpt-trig", "runs", "reports", "sweeps", "recipes", "path", "big", "models", "ckpt/")
#: hub ids written bare (no ORG/)
BARE_HUB_IDS = ("gpt2", "gpt2-xl")
#: README's probe example, saved where a line names a plugin file
PLUGIN_FILES = ("my_probes.py",)


def _probe_example() -> str:
    match = re.search(r"<!-- probe-example -->\s*```python\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    assert match, "README.md lost its probe example"
    return match.group(1)


def _toml_blocks() -> dict[str, str]:
    return {line.name: line.text for line in LINES if line.kind == "toml" and line.name}


# ---- the command line with every heavy step replaced by its checks -------------------------------------


@contextlib.contextmanager
def checks_only(folder: Path):
    """The CLI as it is, minus what loads, trains, writes or submits: each command still runs every check
    that needs no model (see the module docstring). Runs in ``folder``, which holds the files lines name."""
    from sinkscope.models.resolve import Source
    from sinkscope.probes import PROBES

    (folder / "recipes").exists() or (folder / "recipes").symlink_to(REPO / "recipes")
    (folder / "runs").mkdir(exist_ok=True)  # what the lines before a page's `ls runs runs` wrote
    for name in PLUGIN_FILES:
        (folder / name).write_text(_probe_example(), encoding="utf-8")
    for name, text in _toml_blocks().items():
        (folder / name).write_text(text, encoding="utf-8")
    probes_before = dict(PROBES)

    def source(model, revision=None):
        location = model or "SmolLM2-135M-Instruct.Q4_1.gguf"
        return Source("hub", location, None, revision, label=Path(str(location)).name or "model")

    def train(options, log=None):
        from sinkscope.models.trainer_config import GPTConfig
        from sinkscope.train.config import apply_overrides, resolve_options

        resolved = resolve_options(options)
        apply_overrides(GPTConfig.from_tier(resolved.tier), resolved.overrides)

    def sweep(options, log=None, executor_options=None):
        from sinkscope.lab.sweep import check

        check(options)
        return Path(options.out) / "sweep.md"

    def recipe_commands(real):
        def commands():
            return {name: (options, lambda *args, **kwargs: None) for name, (options, _) in real().items()}
        return commands

    import sinkscope.executors.settings as settings
    import sinkscope.lab.recipes as recipes

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setattr("sinkscope.run.plan.resolve_source", source)
        patch.setattr("sinkscope.run.plan.checkpoint_series", lambda model: [])
        patch.setattr("sinkscope.run.plan._check_text_file", lambda options: None)
        patch.setattr("sinkscope.run.dispatch.execute", lambda plans, **kwargs: None)
        patch.setattr("sinkscope.train.loop.train", train)
        patch.setattr("sinkscope.lab.sweep.sweep", sweep)
        patch.setattr("sinkscope.lab.toy._run_toy", lambda *args, **kwargs: None)
        patch.setattr(recipes, "_commands", recipe_commands(recipes._commands))
        patch.setattr(recipes, "_run_batch", lambda *args, **kwargs: None)
        patch.setattr("sinkscope.report.build_report", lambda *args, **kwargs: "report.html")
        patch.setattr("sinkscope.cli.inspect._absent_hooks", lambda model, trust: {})
        patch.setattr(settings, "EXTRAS", {})  # ray and submitit need not be installed to parse a line
        patch.setattr(settings, "shutil", SimpleNamespace(which=lambda name: f"/usr/bin/{name}"))
        try:
            yield
        finally:
            PROBES.clear()
            PROBES.update(probes_before)


@functools.cache
def _click_app():
    """The click command typer builds from the app (built once: typer builds it anew on every invoke)."""
    import typer

    from sinkscope.cli import app

    return typer.main.get_command(app)


def invoke(argv: list[str]):
    return CliRunner().invoke(_click_app(), argv, prog_name="sinkscope")


def _torchrun_problem(line: DocLine) -> str | None:
    """torchrun's own options before ``-m``: the ones the docs use, with a positive count."""
    words = line.argv()
    before = words[1:words.index("-m")]
    if before[:1] != ["--nproc-per-node"] or len(before) != 2 or not before[1].isdigit() or int(before[1]) < 1:
        return f"torchrun's options are --nproc-per-node N, not {' '.join(before)!r}"
    return None


def _is_synopsis(line: DocLine) -> bool:
    """A usage pattern, not a line: an inline span that names a placeholder as an option's value
    (``--monitor-every N``), or any line with ``<name>`` or ``[--option ...]``."""
    if re.search(r"<[\w-]+>|\[--", line.text):
        return True
    return line.origin == "inline" and bool(re.search(r"--[\w-]+ [A-Z][A-Z_]*\b", line.text))


def test_every_sinkscope_line_parses_against_the_command_line(tmp_path, capsys):
    """Unknown options, tiers, variants, choices, extra arguments and wrong types, on every sinkscope line."""
    lines = [line for line in SHELL if line.sinkscope_argv() is not None and not _is_synopsis(line)]
    failures = []
    with checks_only(tmp_path):
        for line in lines:
            argv = line.sinkscope_argv()
            if line.argv()[0].endswith("torchrun"):
                problem = _torchrun_problem(line)
                if problem:
                    failures.append(f"{line}\n    {problem}")
                    continue
            result = invoke(argv)
            if result.exit_code != 0:
                said = result.output.strip().splitlines()
                if line.origin == "inline" and (result.exit_code != 2 or any("Missing argument" in s for s in said)):
                    continue  # prose naming a command and an option of it (`sinkscope run r.toml --trust-remote-code`):
                    # it parses (exit 2 is click's usage error), though what it names is not here to run
                failures.append(f"{line}\n    exit {result.exit_code}: {' / '.join(said[-3:])}")
    with capsys.disabled():
        print(f"\n[documented lines] {len(lines)} sinkscope lines parsed "
              f"({sum(l.origin == 'block' for l in lines)} in code blocks, {sum(l.origin == 'help' for l in lines)} "
              f"in --help, {sum(l.origin == 'notebook' for l in lines)} in the notebook, "
              f"{sum(l.origin == 'inline' for l in lines)} inline)")
    assert not failures, "documented lines the command line refuses:\n" + "\n".join(failures)


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _other_problem(line: DocLine) -> str | None:
    words = line.argv()
    program = words[0]
    if program == "make":
        targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), re.M))
        missing = [w for w in words[1:] if w not in targets]
        return f"no make target {missing}" if missing else None
    if program == "pip":
        extras = set(_pyproject()["project"]["optional-dependencies"])
        for word in words[2:]:
            match = re.match(r"^sinkscope\[([\w,-]+)\]$", word)
            if not match or not set(match.group(1).split(",")) <= extras:
                return f"{word!r} is no extra of pyproject.toml ({', '.join(sorted(extras))})"
        return None
    if program in ("python", "python3", ".venv/bin/python", "bash"):
        if words[1:2] == ["-m"]:
            module = words[2]
            if module.split(".")[0] != "sinkscope":
                return None  # python -m http.server
            spec = importlib.util.find_spec(module)
            if spec is None:
                return f"no module {module}"
            script, flags = Path(spec.origin), words[3:]
        else:
            script, flags = REPO / words[1], words[2:]
            if not script.is_file():
                return f"no file {words[1]}"
        text = script.read_text(encoding="utf-8")
        unknown = [f for f in flags if f.startswith("--") and f.split("=")[0] not in text]
        return f"{script.name} takes no {unknown}" if unknown else None
    return None


def test_every_other_command_names_what_exists():
    """make targets, pip extras, scripts and modules run with python, and the options given to them."""
    lines = [line for line in SHELL if line.sinkscope_argv() is None]
    failures = [f"{line}\n    {problem}" for line in lines if (problem := _other_problem(line))]
    assert not failures, "\n".join(failures)


# ---- Python blocks, dotted names, the explorer's console API ------------------------------------------


def _resolve(dotted: str):
    """The object a dotted name ``sinkscope.a.b.c`` names (the longest importable module, then attributes)."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for part in parts[k:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(dotted)


def test_every_dotted_sinkscope_name_resolves():
    names = [line for line in LINES if line.kind == "name"]
    failures = []
    for line in names:
        try:
            _resolve(line.text)
        except (ImportError, AttributeError) as error:
            failures.append(f"{line}\n    {type(error).__name__}: {error}")
    assert not failures, "names in the docs that do not exist:\n" + "\n".join(failures)


def _measure_keywords(command: str | None) -> set[str]:
    import inspect
    from dataclasses import fields

    from sinkscope.api import measure
    from sinkscope.commands import get_command
    from sinkscope.executors.settings import EXECUTOR_FIELDS

    own = {name for name in inspect.signature(measure).parameters if name != "options"}
    options = {f.name for f in fields(get_command(command or "measure").options)}
    return own | options | set(EXECUTOR_FIELDS)


def _python_problems(code: str) -> list[str]:
    """Imports and names that do not exist, ``sinkscope.measure`` keywords no option has, and attributes
    of its result that a Result does not have."""
    from sinkscope.commands import discover
    from sinkscope.run.result import ComparisonResult, Result

    try:
        tree = ast.parse(code)
    except SyntaxError as error:
        return [f"does not parse: {error}"]
    problems = []
    results: set[str] = set()  # names bound to sinkscope.measure(...)
    commands = set(discover())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sinkscope"):
            for alias in node.names:
                try:
                    _resolve(f"{node.module}.{alias.name}")
                except (ImportError, AttributeError):
                    problems.append(f"from {node.module} import {alias.name}: no such name")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sinkscope") and importlib.util.find_spec(alias.name) is None:
                    problems.append(f"import {alias.name}: no such module")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "sinkscope.measure":
            what = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
            allowed = _measure_keywords(what if what in commands else None)
            for keyword in node.keywords:
                if keyword.arg and keyword.arg not in allowed:
                    problems.append(f"sinkscope.measure({what!r}, ...) has no keyword {keyword.arg!r}")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and ast.unparse(node.value.func) == "sinkscope.measure":
            results |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    attributes = set(dir(Result)) | {f for f in Result.__dataclass_fields__} | set(dir(ComparisonResult))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in results \
                and node.attr not in attributes:
            problems.append(f"{node.value.id}.{node.attr}: a Result has no attribute {node.attr!r}")
    return problems


def test_every_python_block_names_what_exists():
    blocks = [line for line in LINES if line.kind == "python"]
    failures = [f"{line.where}\n    {problem}" for line in blocks for problem in _python_problems(line.text)]
    assert not failures, "\n".join(failures)


def test_the_explorer_console_calls_are_its_page_api():
    api = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "src/sinkscope/report/static/explorer").glob("*.js"))
    defined = set(re.findall(r"\bP\.(\w+)\s*=\s*function", api)) | {"ready"}
    calls = [(line, name) for line in LINES if line.kind == "js"
             for name in re.findall(r"sinkscopeExplorer\.(\w+)", line.text)]
    assert calls
    missing = [f"{line.where}: sinkscopeExplorer.{name}" for line, name in calls if name not in defined]
    assert not missing, missing


def test_the_recipes_written_in_the_docs_load(tmp_path):
    from sinkscope.lab.recipes import load_steps

    blocks = _toml_blocks()
    assert blocks, "the docs lost their example recipe"
    for name, text in blocks.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        assert load_steps(str(tmp_path / name))


# ---- what a line needs -------------------------------------------------------------------------------------


def _models(line: DocLine) -> list[str]:
    """The hub ids a sinkscope line names (positional models, --model)."""
    argv = line.sinkscope_argv() or []
    found = []
    for k, word in enumerate(argv):
        previous = argv[k - 1] if k else ""
        if word.startswith("-") or (previous.startswith("-") and previous != "--model" and "=" not in previous
                                    and previous not in ("--ablate-dormant", "--open", "--no-figures", "--no-progress",
                                                         "--no-exposure", "--no-bos-experiments", "--overwrite",
                                                         "--resume")):
            continue
        if previous == "--model" or (k > 0 and argv[0] != "run"):
            if word in BARE_HUB_IDS or (re.match(r"^[A-Za-z0-9][\w.-]*/[\w.+-]+$", word)
                                        and word.split("/")[0] not in LOCAL_ROOTS
                                        and not word.endswith((".toml", ".py", ".txt"))):
                found.append(word)
    return found


def needs_of(line: DocLine) -> set[str]:
    """What a line needs to run as written, read off its words."""
    argv = line.sinkscope_argv() or []
    words = set(argv)
    out = set()
    if _models(line):
        out.add("weights")
    if "cuda" in " ".join(argv).split() or any(w.split("=")[-1].startswith("cuda") for w in argv):  # --set x.device=cuda
        out.add("GPU")
    if "--executor" in argv and argv[argv.index("--executor") + 1] == "slurm" and "--slurm-cluster" not in words:
        out.add("SLURM")
    if "--ray-address" in words:
        out.add("Ray cluster")
    if "--loader" in argv and argv[argv.index("--loader") + 1] == "transformer-lens":
        out.add("TransformerLens 3")
    return out


def test_lines_that_need_weights_a_gpu_or_a_cluster_say_so():
    """Every line run as written (code blocks, help, notebook) that needs weights not available offline,
    a GPU, SLURM or a Ray cluster carries ``# needs: ...``, and a marked line needs what it names."""
    run = [line for line in SHELL if line.origin != "inline" and line.sinkscope_argv() is not None]
    unmarked = [f"{line}  (needs {', '.join(sorted(needs_of(line)))})" for line in run
                if needs_of(line) and not line.needs]
    assert not unmarked, "mark these lines with '# needs: ...' (" + ", ".join(NEEDS) + "):\n" + "\n".join(unmarked)
    stale = [f"{line}  (marked {line.needs!r})" for line in run if line.needs and line.needs not in needs_of(line)]
    assert not stale, "these lines are marked with a need they do not have:\n" + "\n".join(stale)


def test_one_convention_for_the_programs():
    """Commands are written ``sinkscope ...``, ``python ...`` and ``torchrun ...`` (the set-up's venv
    activated, getting-started says so once), never ``.venv/bin/...``."""
    venv = [str(line) for line in SHELL if line.argv()[0].startswith(".venv/")]
    assert not venv, "write these as the convention says (docs/getting-started.md):\n" + "\n".join(venv)
