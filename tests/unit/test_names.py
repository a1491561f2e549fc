"""One meaning per name (issue 55, item 3): no two modules share a basename (a command's module in
``commands/`` and its report section in ``report/`` aside), no name lives in two places through a
re-export, and no ``noqa: F401`` import slips in unseen."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from repo_paths import REPO

SRC = REPO / "src" / "sinkscope"
#: the ``noqa: F401`` imports that are not re-exports: (module, why).
F401_ALLOWED = {
    "cli/__init__.py": "importing the command modules registers their commands on the app",
    "runtime/progress.py": "the widget bar is used only if ipywidgets imports",
}


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_share_a_basename_but_a_command_and_its_report_section():
    by_name = defaultdict(list)
    for path in _modules():
        if path.name != "__init__.py":
            by_name[path.stem].append(path.relative_to(SRC).parent.as_posix())
    commands = {p.stem for p in (SRC / "commands").glob("*.py")}
    repeated = {stem: folders for stem, folders in by_name.items() if len(folders) > 1
                and not (stem in commands and sorted(folders) == ["commands", "report"])}
    assert repeated == {}, f"rename one of each: {repeated}"


def test_no_noqa_f401_import_but_the_allowed_ones():
    found = []
    for path in _modules():
        rel = path.relative_to(SRC).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"noqa:[ \w,]*F401", line) and rel not in F401_ALLOWED:
                found.append(f"{rel}:{number}")
    assert found == [], "a re-export lets a name live in two places: import it from its own module instead"


def _defined() -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for path in _modules():
        tree = ast.parse(path.read_text())
        here = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                here.add(node.name)
            elif isinstance(node, ast.Assign):
                here.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                here.add(node.target.id)
        names[_name(path)] = here
    for module in list(names):  # a package's submodules are its names too
        parent, _, child = module.rpartition(".")
        if parent:
            names.setdefault(parent, set()).add(child)
    return names


def test_internals_import_each_name_from_the_module_that_defines_it():
    """``from sinkscope.a import x`` where a only imported x is a name living in two places (packages'
    ``__init__`` exports for users aside: ``sinkscope.probes``' probe-writing names)."""
    defined = _defined()
    packages = {_name(p) for p in _modules() if p.name == "__init__.py"}
    wrong = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sinkscope.")):
                continue
            module = node.module.removeprefix("sinkscope.")
            if module in packages or module not in defined:
                continue
            wrong += [f"{_name(path)}: {a.name} from {module}" for a in node.names if a.name not in defined[module]]
    assert wrong == []
