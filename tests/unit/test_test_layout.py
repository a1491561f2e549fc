"""The test suite's own shape (docs/layout.md "Tests"): every source module has a fast test of
its own, every test file sits in one of the three folders, and the tier rule is written down.

"A fast test of its own" is read off the test files' syntax: a test file that is not wholly
``slow`` imports the module by name (``import sinkscope.x``, ``from sinkscope.x import y``,
``from sinkscope import x``, ``importlib.import_module("sinkscope.x")``, or ``runpy.run_module``
for ``__main__``), at module level or inside a test or helper that is not marked ``slow``. A
module that is only reached through the CLI or another module does not count. Packages'
``__init__`` files holding only a docstring have nothing to test.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from repo_paths import REPO, TESTS

SRC = REPO / "src"
TIERS = ("unit", "integration", "e2e")


def source_modules() -> dict[str, Path]:
    """{dotted name: path} of every module under src/sinkscope with more than a docstring."""
    found = {}
    for path in sorted((SRC / "sinkscope").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        body = ast.parse(path.read_text(encoding="utf-8")).body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            body = body[1:]
        if body:
            found[".".join(parts)] = path
    return found


def _is_slow_mark(node: ast.AST) -> bool:
    return "mark.slow" in ast.unparse(node)


def _file_is_slow(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
               and _is_slow_mark(node.value) for node in tree.body)


def _imports(node: ast.AST, modules: set[str]) -> set[str]:
    """The sinkscope modules ``node`` imports by name (not descending into slow functions)."""
    out: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(_is_slow_mark, item.decorator_list)):
            continue
        if isinstance(item, ast.Import):
            out |= {a.name for a in item.names if a.name.startswith("sinkscope")}
        elif isinstance(item, ast.ImportFrom) and item.level == 0 and (item.module or "").startswith("sinkscope"):
            out.add(item.module)
            out |= {f"{item.module}.{a.name}" for a in item.names if f"{item.module}.{a.name}" in modules}
        elif isinstance(item, ast.Call) and item.args and isinstance(item.args[0], ast.Constant):
            name, arg = ast.unparse(item.func), item.args[0].value
            if isinstance(arg, str) and arg.startswith("sinkscope"):
                if name.endswith("import_module"):
                    out.add(arg)
                elif name.endswith("run_module"):
                    out.add(arg if arg.endswith("__main__") else f"{arg}.__main__")
        stack.extend(ast.iter_child_nodes(item))
    return out


def _has_fast_test(tree: ast.Module) -> bool:
    def tests(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                yield node
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                yield from (t for t in tests(node.body) if not any(map(_is_slow_mark, node.decorator_list)))
    return any(not any(map(_is_slow_mark, t.decorator_list)) for t in tests(tree.body))


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def fast_importers() -> dict[str, list[str]]:
    """{module: [fast test files importing it]} for every source module."""
    modules = source_modules()
    importers: dict[str, list[str]] = {name: [] for name in modules}
    for path in _test_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if _file_is_slow(tree) or not _has_fast_test(tree):
            continue
        for name in _imports(tree, set(modules)):
            if name in importers:
                importers[name].append(str(path.relative_to(TESTS)))
    return importers


def test_every_source_module_has_a_fast_test_of_its_own():
    missing = sorted(name for name, files in fast_importers().items() if not files)
    assert not missing, ("these modules have no fast test that imports them (write one under tests/unit/ or "
                         f"tests/integration/, see docs/layout.md): {', '.join(missing)}")


def test_the_coverage_reading_sees_imports_and_skips_slow_tests():
    """The reader above, on a made-up test file: what counts and what does not."""
    modules = {"sinkscope", "sinkscope.a", "sinkscope.a.b", "sinkscope.c", "sinkscope.d", "sinkscope.__main__"}
    tree = ast.parse(
        "import pytest\nfrom sinkscope.a import b\n"
        "def test_x():\n    import importlib, runpy\n    importlib.import_module('sinkscope.c')\n"
        "    runpy.run_module('sinkscope', run_name='__main__')\n"
        "@pytest.mark.slow\ndef test_y():\n    import sinkscope.d\n")
    assert _imports(tree, modules) == {"sinkscope.a", "sinkscope.a.b", "sinkscope.c", "sinkscope.__main__"}
    assert _has_fast_test(tree) and not _file_is_slow(tree)
    only_slow = ast.parse("import pytest\npytestmark = pytest.mark.slow\ndef test_z():\n    pass\n")
    assert _file_is_slow(only_slow)
    assert not _has_fast_test(ast.parse("import pytest\n@pytest.mark.slow\ndef test_z():\n    pass\n"))


def test_every_test_file_sits_in_a_tier_folder_under_a_unique_name():
    files = _test_files()
    outside = [str(p.relative_to(TESTS)) for p in files if p.relative_to(TESTS).parts[0] not in TIERS]
    assert not outside, f"test files outside tests/{{unit,integration,e2e}}/: {outside}"
    repeated = [name for name, n in Counter(p.name for p in files).items() if n > 1]
    assert not repeated, f"test file names used twice (pytest imports them by name): {repeated}"


def test_the_tier_rule_is_written_where_contributors_look():
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    marker = re.search(r'"slow: (.*?)",\n', pyproject).group(1)
    for words in ("trains", "spawns a Python process", "builds the docs", "sweeps architectures"):
        assert words in marker
    assert "-m 'not slow'" in pyproject
    layout = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    assert "make test-all" in layout and "spawns a Python process" in layout
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^test-all:", makefile, re.M) and "make test-all" in (REPO / ".ci" / "run").read_text()
