"""Imports run one way, down the layers (DESIGN.md "Boundaries worth keeping"; docs/layout.md "Layers").

Three checks on the package's import graph, read by grimp from the source (imports inside functions
included, imports under ``TYPE_CHECKING`` not, since they never run):

- the import-linter ``layers`` contract in pyproject.toml is kept (``lint-imports``, in process);
- no module is in an import cycle, and no sub-package (``sinkscope.X``) is in a cycle with another;
- no module of the package imports the package root ``sinkscope`` (internals import submodules).
"""

from __future__ import annotations

import os

import pytest

from repo_paths import REPO

import grimp  # noqa: E402 - the test extra installs import-linter and grimp; missing, this file fails (never skips)


def _cycles(adjacency: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in adjacency:
        if root in index:
            continue
        work = [(root, iter(adjacency[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(adjacency.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, list[str]]:
    built = grimp.build_graph("sinkscope", include_external_packages=False, exclude_type_checking_imports=True)
    return {module: sorted(built.find_modules_directly_imported_by(module)) for module in sorted(built.modules)}


def test_the_layers_contract_is_kept(capsys):
    from importlinter.cli import lint_imports

    cwd = os.getcwd()
    os.chdir(REPO)  # the contract lives in pyproject.toml
    try:
        status = lint_imports(no_cache=True, no_logo=True)
    finally:
        os.chdir(cwd)
    assert status == 0, capsys.readouterr().out


def test_no_module_is_in_an_import_cycle(graph):
    assert _cycles(graph) == []


def test_no_sub_package_is_in_a_cycle_with_another(graph):
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    units: dict[str, set[str]] = {}
    for module, imported in graph.items():
        units.setdefault(unit(module), set()).update(unit(m) for m in imported if unit(m) != unit(module))
    assert _cycles({u: sorted(v) for u, v in units.items()}) == []


def test_internals_do_not_import_the_package_root(graph):
    assert [module for module, imported in graph.items() if "sinkscope" in imported and module != "sinkscope"] == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": []}) == []
