"""``report/folder.py``: where a report may go, what an old report folder is, how the new one moves in.

Folders are made by hand in ``tmp_path``: a page carrying sinkscope's generator tag, figure files,
a user's file. The reference is the writers' rule (SPEC.md, ``fileio.check_replaceable``): empty
or absent is written, sinkscope's own files need ``overwrite``, anything else is refused.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from sinkscope.errors import SinkscopeError
from sinkscope.report.folder import (_check_report_folder, _fresh_folder, _install_report, _remove_stale_temporaries,
                                     report_folder_legacy)

PAGE = '<!doctype html><html><head><meta name="generator" content="sinkscope 1.0"></head></html>'


def test_a_fresh_folder_never_meets_an_earlier_one(tmp_path):
    assert _fresh_folder(tmp_path / "cmp") == tmp_path / "cmp"
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp-2").write_text("")
    assert _fresh_folder(tmp_path / "cmp") == tmp_path / "cmp-3"


def test_an_old_report_folder_is_recognised_by_its_page(tmp_path):
    assert report_folder_legacy(tmp_path) is None  # empty
    (tmp_path / "report.html").write_text("<html>a user's page</html>")
    assert report_folder_legacy(tmp_path) is None
    (tmp_path / "report.html").write_text(PAGE)
    legacy = report_folder_legacy(tmp_path)
    assert legacy("report.html") and legacy("figures/heatmap_p0_mass.png") and legacy("figures/x.svg")
    assert not legacy("notes.txt") and not legacy("figures/deep/x.png") and not legacy("figures/x.txt")


def test_the_report_folder_rules(tmp_path):
    out = tmp_path / "out"
    assert _check_report_folder(out, overwrite=False, own_run=False) == ("report", [])  # absent
    out.mkdir()
    assert _check_report_folder(out, overwrite=False, own_run=False) == ("report", [])  # empty
    (out / "report.html").write_text(PAGE)
    with pytest.raises(SinkscopeError, match="--overwrite"):
        _check_report_folder(out, overwrite=False, own_run=False)
    assert _check_report_folder(out, overwrite=True, own_run=False) == ("report", [])
    (out / "mine.txt").write_text("a user's file")
    with pytest.raises(SinkscopeError):
        _check_report_folder(out, overwrite=True, own_run=False)
    with pytest.raises(SinkscopeError, match="holds files sinkscope did not write"):
        _check_report_folder(out, overwrite=False, own_run=True)


def test_the_staged_report_moves_in_and_the_old_figures_go(tmp_path):
    out, stage = tmp_path / "out", tmp_path / ".out.report-x"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "old.png").write_bytes(b"old")
    (stage / "figures").mkdir(parents=True)
    (stage / "figures" / "new.png").write_bytes(b"new")
    (stage / "report.html").write_text(PAGE)
    _install_report(stage, out)
    assert [p.name for p in (out / "figures").iterdir()] == ["new.png"]
    assert (out / "report.html").read_text() == PAGE and not (stage / "figures").exists()
    assert not [p for p in tmp_path.iterdir() if ".figures.old-" in p.name]


def test_a_killed_builds_temporaries_are_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stale = Path(tempfile.mkdtemp(prefix=".out.report-", dir=tmp_path))  # as build_report stages a page
    other = Path(tempfile.mkdtemp(prefix=".other.report-", dir=tmp_path))
    _remove_stale_temporaries(out)
    assert not stale.exists() and other.exists()
