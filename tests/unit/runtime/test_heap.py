"""``sinkscope.runtime.heap``: glibc's mmap threshold, fixed per process at the lowest size asked for.

``glibc_mallopt`` is looked up once (None off glibc, or where the C library cannot be loaded or
has no ``mallopt``). ``fix_mmap_threshold(size)`` returns True where the threshold in force is
at most ``size``: set now, or set lower before (mallopt is then not called again). The
environment variable ``SINKSCOPE_MMAP_THRESHOLD`` overrides the size (bytes) or turns it off.
Each test starts and ends with nothing remembered, so no faked answer outlives one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest

from sinkscope.runtime import heap

ON_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
#: a run's threshold where one is fixed (a size the environment may give; runs fix none by default)
RUN_16_MIB = 16 << 20


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Nothing remembered before or after; ``find_library`` answers glibc's soname at once (no ldconfig)."""
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libc.so.6")
    monkeypatch.delenv(heap.ENVIRONMENT, raising=False)
    heap.forget()
    yield
    heap.forget()


@pytest.fixture
def calls(monkeypatch) -> list[tuple[int, int]]:
    """A fake glibc whose mallopt records (option, value) and succeeds."""
    seen: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, option, value):
            seen.append((option.value, value.value))
            return 1

    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda *args, **kwargs: ("glibc", "2.36"))
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: Libc())
    return seen


def test_the_lowest_threshold_asked_for_wins_and_mallopt_runs_only_to_lower_it(calls):
    assert heap.fix_mmap_threshold(RUN_16_MIB) is True
    assert heap.fix_mmap_threshold(RUN_16_MIB) is True  # already in force
    assert heap.fix_mmap_threshold(heap.STREAM_THRESHOLD_BYTES) is True  # lowered
    assert heap.fix_mmap_threshold(RUN_16_MIB) is True  # 1 MiB stays
    assert calls == [(heap.M_MMAP_THRESHOLD, 16 << 20), (heap.M_MMAP_THRESHOLD, 1 << 20)]
    assert heap.fixed_threshold() == 1 << 20


def test_the_environment_sets_the_size_or_turns_it_off(calls, monkeypatch):
    monkeypatch.setenv(heap.ENVIRONMENT, "off")
    assert heap.fix_mmap_threshold(RUN_16_MIB) is False
    assert calls == [] and heap.fixed_threshold() is None
    monkeypatch.setenv(heap.ENVIRONMENT, "4194304")
    assert heap.fix_mmap_threshold(RUN_16_MIB) is True
    assert calls == [(heap.M_MMAP_THRESHOLD, 4 << 20)]
    heap.forget()
    monkeypatch.setenv(heap.ENVIRONMENT, "a lot")  # not a size: the caller's default
    assert heap.fix_mmap_threshold(RUN_16_MIB) is True
    assert calls[-1] == (heap.M_MMAP_THRESHOLD, 16 << 20)
    heap.forget()
    monkeypatch.setenv(heap.ENVIRONMENT, str(64 << 20))  # above what glibc accepts: the default
    assert heap.fix_mmap_threshold(heap.STREAM_THRESHOLD_BYTES) is True
    assert calls[-1] == (heap.M_MMAP_THRESHOLD, 1 << 20)


@pytest.mark.skipif(not ON_GLIBC, reason="glibc only")
def test_on_glibc_the_threshold_is_set_and_the_library_opened_once(monkeypatch):
    opened = []
    real_cdll = ctypes.CDLL
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: opened.append(a) or real_cdll(*a, **k))
    assert heap.fix_mmap_threshold(RUN_16_MIB) is True
    assert heap.fix_mmap_threshold(heap.STREAM_THRESHOLD_BYTES) is True
    assert len(opened) == 1 and heap.glibc_mallopt.cache_info().misses == 1


@pytest.mark.parametrize("system, libc", [("Darwin", ("", "")), ("Windows", ("", "")), ("Linux", ("musl", "1.2")),
                                          ("Linux", ("", ""))])
def test_off_glibc_nothing_is_touched(monkeypatch, system, libc):
    monkeypatch.setattr(platform, "system", lambda: system)
    monkeypatch.setattr(platform, "libc_ver", lambda *args, **kwargs: libc)

    def no_c_library(*args, **kwargs):
        raise AssertionError("the C library must not be opened off glibc")

    monkeypatch.setattr(ctypes, "CDLL", no_c_library)
    assert heap.fix_mmap_threshold() is False and heap.fixed_threshold() is None


def test_a_c_library_that_cannot_be_loaded_or_has_no_mallopt_gives_false(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda *args, **kwargs: ("glibc", "2.36"))

    def unloadable(*args, **kwargs):
        raise OSError("cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", unloadable)
    assert heap.fix_mmap_threshold() is False
    heap.forget()
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: object())  # no mallopt attribute
    assert heap.fix_mmap_threshold() is False


def test_mallopt_refusing_gives_false_and_remembers_nothing(monkeypatch):
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda *args, **kwargs: ("glibc", "2.36"))

    class Libc:
        def mallopt(self, option, value):
            return 0  # glibc's "failed"

    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: Libc())
    assert heap.fix_mmap_threshold(RUN_16_MIB) is False and heap.fixed_threshold() is None


def test_run_probes_fixes_the_run_threshold_or_what_the_environment_asks(calls, monkeypatch):
    """Every measuring run goes through ``run_probes``, which fixes 4 MiB (or the environment's size) first."""
    import numpy as np
    from transformers import LlamaConfig, LlamaForCausalLM

    from sinkscope.forward.runner import run_probes

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    run_probes(model, np.zeros((1, 8), dtype=np.int64), [], batch_size=1, progress=False)
    assert heap.RUN_THRESHOLD_BYTES == 4 << 20
    assert calls == [(heap.M_MMAP_THRESHOLD, 4 << 20)]
    heap.forget()
    monkeypatch.setenv(heap.ENVIRONMENT, str(RUN_16_MIB))
    run_probes(model, np.zeros((1, 8), dtype=np.int64), [], batch_size=1, progress=False)
    assert calls[-1] == (heap.M_MMAP_THRESHOLD, RUN_16_MIB)


def test_no_size_and_no_environment_leaves_glibc_alone(calls, monkeypatch):
    assert heap.fix_mmap_threshold(None) is False
    assert calls == [] and heap.fixed_threshold() is None
    monkeypatch.setenv(heap.ENVIRONMENT, str(8 << 20))
    assert heap.fix_mmap_threshold(None) is True
    assert calls == [(heap.M_MMAP_THRESHOLD, 8 << 20)]
