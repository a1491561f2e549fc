"""Where a report goes: the output folder checked, its old report recognised, the new one moved into place.

Every writer's rules (``fileio.check_replaceable``) apply: a run's own folder is rebuilt when it
holds nothing else; any other folder is written when absent or empty, and replaced with
``overwrite`` when it holds only sinkscope's files. ``build.build_report`` locks the folder, draws
the page into a staging folder beside it and calls :func:`_install_report` to rename it in.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sinkscope.errors import SinkscopeError, option
from sinkscope.store.files import check_replaceable, describe_entries, foreign_entries, is_temporary_name, read_inventory

#: writers whose folders may hold a report (a run's own, a comparison of several models, a report).
REPORT_WRITERS = ("report", "comparison", "run")
_GENERATOR = b'<meta name="generator" content="sinkscope'


def _same_folder(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _fresh_folder(folder: Path) -> Path:
    """``folder``, or ``folder-2``, ``folder-3``, ... if it exists: a default that never meets an earlier one."""
    candidate, k = folder, 2
    while candidate.exists() or candidate.is_symlink():
        candidate, k = folder.with_name(f"{folder.name}-{k}"), k + 1
    return candidate


def _is_sinkscope_page(path: Path) -> bool:
    """Whether ``path`` is a page sinkscope drew (its generator tag, near the top)."""
    try:
        with open(path, "rb") as handle:
            return _GENERATOR in handle.read(4096)
    except OSError:
        return False


def _is_figure_file(rel: str) -> bool:
    return rel.startswith("figures/") and rel.count("/") == 1 and rel.endswith((".png", ".svg"))


def report_folder_legacy(folder: Path):
    """``legacy`` for ``fileio.foreign_entries``: a report or comparison folder written before inventories.

    Recognised by a ``report.html`` sinkscope drew, or a run folder inside it (a comparison of
    several models written with ``--no-figures``); its files are then the page, ``figures/*.png``
    and ``*.svg``, and the fixed names of the run folders in it (``<run>/results.csv``, ...).
    None for any other folder (a user's ``report.html`` is not recognised).
    """
    from sinkscope.store.results import is_legacy_run_file, is_run_folder

    folder = Path(folder)
    try:
        children = [entry for entry in folder.iterdir() if entry.is_dir() and not entry.is_symlink()]
    except OSError:
        return None
    runs = {child.name for child in children if is_run_folder(child)}
    if not (_is_sinkscope_page(folder / "report.html") or runs):
        return None

    def legacy(rel: str) -> bool:
        if rel == "report.html":
            return _is_sinkscope_page(folder / rel)
        if _is_figure_file(rel):
            return True
        head, _, rest = rel.partition("/")
        return head in runs and is_legacy_run_file(rest)
    return legacy


def _check_report_folder(out: Path, overwrite: bool, own_run: bool) -> tuple[str, list[str]]:
    """Refuse an output folder the report may not write; returns the writer and trees its inventory keeps.

    One run's own folder is rebuilt without ``overwrite`` when it holds nothing sinkscope did not
    write; any other folder follows ``fileio.check_replaceable`` (with ``overwrite`` for one that
    already holds sinkscope's files), and must be a report's, a comparison's or a run's.
    """
    from sinkscope.store.results import run_folder_legacy

    inventory = read_inventory(out) if out.is_dir() else None
    trees = inventory["trees"] if inventory else []
    if own_run:
        legacy = run_folder_legacy(out)
        foreign = foreign_entries(out, legacy)
        if foreign or (inventory is None and legacy is None):
            what = describe_entries(foreign) if foreign else "no record of what wrote it"
            raise SinkscopeError(f"the run folder {out} holds files sinkscope did not write ({what}); sinkscope "
                                 "rebuilds a run's report only in a folder holding nothing else: build it elsewhere "
                                 f"with {option('out')} DIR, or move them.")
        return "run", trees
    if inventory is not None and inventory["writer"] not in REPORT_WRITERS:
        raise SinkscopeError(f"the folder {out} was written by sinkscope's {inventory['writer'] or 'unknown'} writer, "
                             f"not by a report; choose another {option('out')}.")
    check_replaceable(out, overwrite, kind="report", legacy=report_folder_legacy(out),
                      hint="pass --overwrite to replace its report")
    if inventory is not None:
        return inventory["writer"], trees
    from sinkscope.store.results import is_run_folder  # a comparison of several models written before inventories

    held = [child for child in out.iterdir() if child.is_dir() and not child.is_symlink()] if out.is_dir() else []
    return ("comparison" if any(is_run_folder(child) for child in held) else "report"), trees


def _name(out: Path) -> str:
    return Path(os.path.abspath(out)).name


def _beside(out: Path) -> Path:
    """The folder holding ``out`` (where its lock and the report's temporaries go)."""
    return Path(os.path.abspath(out)).parent


def _remove_stale_temporaries(out: Path) -> None:
    """A killed build's staging folder or set-aside figures beside ``out`` (ours by name; we hold the lock)."""
    prefixes = (f".{_name(out)}.report-", f".{_name(out)}.figures.old-")
    for entry in _beside(out).iterdir():
        if (entry.name.startswith(prefixes) and is_temporary_name(entry.name) and entry.is_dir()
                and not entry.is_symlink()):
            shutil.rmtree(entry, ignore_errors=True)


def _install_report(stage: Path, out: Path) -> None:
    """Move the staged ``figures/`` and ``report.html`` into ``out`` (old figures aside, then removed)."""
    figures_dir = out / "figures"
    old = None
    if figures_dir.exists() or figures_dir.is_symlink():
        old = _beside(out) / f".{_name(out)}.figures.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(figures_dir, old)
    os.replace(stage / "figures", figures_dir)
    os.replace(stage / "report.html", out / "report.html")
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
