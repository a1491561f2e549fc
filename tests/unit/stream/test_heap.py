"""``sinkscope.stream.heap.fix_mmap_threshold``: glibc's mmap threshold, fixed once per process.

It returns a bool: True on Linux with glibc (``mallopt`` succeeded), False elsewhere (another
system or C library) and False where the C library cannot be loaded or has no ``mallopt``; the
answer is cached, so ``mallopt`` runs at most once per process. The cache is cleared before and
after every test, so no faked answer outlives one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from sinkscope.stream import heap


@pytest.fixture
def asked(monkeypatch) -> list[str]:
    """The names ``ctypes.util.find_library`` is asked for.

    On Linux it runs ``ldconfig -p`` in a subprocess; here it answers glibc's soname at once (the
    module's own fallback).
    """
    names: list[str] = []
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: names.append(name) or "libc.so.6")
    return names


@pytest.fixture
def fresh(asked):
    """``fix_mmap_threshold`` with an empty cache, emptied again afterwards."""
    heap.fix_mmap_threshold.cache_clear()
    yield heap.fix_mmap_threshold
    heap.fix_mmap_threshold.cache_clear()


def test_it_returns_a_bool_and_is_computed_once(fresh, asked, monkeypatch):
    calls = []
    real_cdll = ctypes.CDLL

    def counting_cdll(*args, **kwargs):
        calls.append(args)
        return real_cdll(*args, **kwargs)

    monkeypatch.setattr(ctypes, "CDLL", counting_cdll)
    first = fresh()
    assert isinstance(first, bool)
    assert fresh() is first and fresh() is first
    assert fresh.cache_info().hits == 2 and fresh.cache_info().misses == 1
    on_glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert len(calls) == (1 if on_glibc else 0)  # the C library is opened once at most
    assert asked == (["c"] if on_glibc else [])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_on_glibc_the_threshold_is_set(fresh):
    assert fresh() is True


@pytest.mark.parametrize("system, libc", [("Darwin", ("", "")), ("Windows", ("", "")), ("Linux", ("musl", "1.2")),
                                          ("Linux", ("", ""))])
def test_off_glibc_nothing_is_touched(fresh, monkeypatch, system, libc):
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "libc_ver", lambda *args, **kwargs: libc)

    def no_c_library(*args, **kwargs):
        raise AssertionError("the C library must not be opened off glibc")

    monkeypatch.setattr(ctypes, "CDLL", no_c_library)
    assert fresh() is False


def test_a_c_library_that_cannot_be_loaded_or_has_no_mallopt_gives_false(fresh, monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda *args, **kwargs: ("glibc", "2.36"))

    def unloadable(*args, **kwargs):
        raise OSError("cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", unloadable)
    assert fresh() is False
    fresh.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: object())  # no mallopt attribute
    assert fresh() is False


def test_mallopt_refusing_gives_false_and_gets_the_threshold_arguments(fresh, monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda *args, **kwargs: ("glibc", "2.36"))
    seen = []

    class Libc:
        def mallopt(self, option, value):
            seen.append((option.value, value.value))
            return 0  # glibc's "failed"

    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: Libc())
    assert fresh() is False
    assert seen == [(heap.M_MMAP_THRESHOLD, heap.MMAP_THRESHOLD_BYTES)] == [(-3, 1 << 20)]
