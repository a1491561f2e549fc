"""``sinkscope.runtime.paths.cache_root``: where caches go, from the environment.

``$SINKSCOPE_CACHE`` wins (``~`` expanded); else ``$XDG_CACHE_HOME/sinkscope``; else
``~/.cache/sinkscope``; an empty variable counts as unset. Nothing is created on disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sinkscope.runtime.paths import cache_root


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fake home folder, and neither cache variable set."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SINKSCOPE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return tmp_path / "home"


def test_sinkscope_cache_wins_over_xdg(home, tmp_path, monkeypatch):
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "mine"  # used as given: no "sinkscope" appended


def test_sinkscope_cache_expands_the_home_folder(home, monkeypatch):
    monkeypatch.setenv("SINKSCOPE_CACHE", "~/caches/ss")
    assert cache_root() == home / "caches" / "ss"


def test_xdg_cache_home_gets_a_sinkscope_folder(home, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "sinkscope"
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert cache_root() == home / "xdg" / "sinkscope"


def test_neither_variable_means_the_home_cache(home):
    assert cache_root() == home / ".cache" / "sinkscope"
    assert not home.exists()  # only a path: nothing is created


@pytest.mark.parametrize("variable", ["SINKSCOPE_CACHE", "XDG_CACHE_HOME"])
def test_an_empty_variable_counts_as_unset(home, monkeypatch, variable):
    monkeypatch.setenv(variable, "")
    assert cache_root() == home / ".cache" / "sinkscope"


def test_the_result_follows_the_environment_at_each_call(home, tmp_path, monkeypatch):
    first = cache_root()
    monkeypatch.setenv("SINKSCOPE_CACHE", str(tmp_path / "later"))
    assert cache_root() == tmp_path / "later" != first  # read at each call, never cached
