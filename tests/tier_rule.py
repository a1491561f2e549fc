"""The tier rule, enforced: a test that trains, spawns a Python process, builds the docs or sweeps
architectures is marked ``slow`` (docs/layout.md "Tests").

``make test`` runs the fast tier (``-m "not slow"``, pyproject's default) and ``make test-all``
runs everything. This plugin, loaded by conftest.py, watches every test that is *not* marked
slow, over its set-up, call and tear-down (fixtures included), and fails it when it

- runs an optimizer step (``torch.optim`` step hook: the trainer, the toy task, ``Trainer``), or
- starts a Python process: ``subprocess`` with a Python interpreter, ``torchrun`` or a console
  script of this environment, or a ``multiprocessing`` process (a pool's workers included), or
- loads a GGUF file (the real SmolLM2: its first load on a fresh machine dequantises for ~20 s).

Building the docs, executing the notebook, driving the browser and the whole conformance matrix
are marked by hand (they spawn, or are slow by nature); the rest of the
rule cannot be told from inside a test. A fast test that takes more than about 2 s is a bug in
the tier too: the terminal summary lists each one (a warning, not a failure: time depends on the
machine's load).
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

#: a fast test over this many seconds (set-up + call + tear-down) is listed at the end of the run.
FAST_TEST_SECONDS = 2.0

_VENV_BIN = Path(sys.executable).parent
_PYTHON_NAMES = ("python", "torchrun", "pytest", "mkdocs", "jupyter", "sinkscope")


class _Watch:
    """What the running test did that the rule names (None outside a watched test)."""

    def __init__(self):
        self.reasons: list[str] | None = None
        self.lock = threading.Lock()

    def note(self, reason: str) -> None:
        with self.lock:
            if self.reasons is not None and reason not in self.reasons:
                self.reasons.append(reason)


WATCH = _Watch()


def _is_python(argv0: str) -> bool:
    path = Path(argv0)
    if path.name.startswith(_PYTHON_NAMES) or os.path.realpath(argv0) == os.path.realpath(sys.executable):
        return True
    return path.parent == _VENV_BIN  # a console script of this environment runs Python


_popen_init = subprocess.Popen.__init__
_process_start = multiprocessing.process.BaseProcess.start


def _watched_popen(self, args, *rest, **kwargs):
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    first = os.fsdecode(argv[0]).split()[0] if argv else ""
    if _is_python(first):
        WATCH.note(f"spawns a Python process ({Path(first).name})")
    return _popen_init(self, args, *rest, **kwargs)


def _watched_start(self):
    WATCH.note("starts a multiprocessing process")
    return _process_start(self)


def _optimizer_stepped(*_args, **_kwargs):
    WATCH.note("trains (runs an optimizer step)")


def _watched_gguf(path, *args, **kwargs):
    if Path(path).stat().st_size > 2**20:  # a real model's file, not a test's stand-in
        WATCH.note("loads a GGUF file (the real SmolLM2)")
    return _load_gguf(path, *args, **kwargs)


_load_gguf = None


def pytest_configure(config):
    global _load_gguf
    from torch.optim.optimizer import register_optimizer_step_post_hook

    import sinkscope.run.loaders as sources

    subprocess.Popen.__init__ = _watched_popen
    multiprocessing.process.BaseProcess.start = _watched_start
    _load_gguf = sources._load_gguf
    sources._load_gguf = _watched_gguf
    config._tier_hook = register_optimizer_step_post_hook(_optimizer_stepped)
    config._tier_over = []


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_init
    multiprocessing.process.BaseProcess.start = _process_start
    if _load_gguf is not None:
        import sinkscope.run.loaders as sources

        sources._load_gguf = _load_gguf
    if getattr(config, "_tier_hook", None) is not None:
        config._tier_hook.remove()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    slow = item.get_closest_marker("slow") is not None
    WATCH.reasons = None if slow else []
    try:
        yield
    finally:
        WATCH.reasons = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if item.get_closest_marker("slow") is not None:
        return
    if report.when == "teardown":
        total = sum(getattr(item, "_tier_seconds", {}).values()) + report.duration
        if total > FAST_TEST_SECONDS:
            item.config._tier_over.append((total, item.nodeid))
    else:
        item.__dict__.setdefault("_tier_seconds", {})[report.when] = report.duration
    reasons = WATCH.reasons
    if reasons and report.passed and report.when in ("call", "teardown"):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} {', '.join(reasons)} but is not marked slow: mark it "
                           "@pytest.mark.slow (the tier rule, docs/layout.md \"Tests\"), or make it not do that.")
        WATCH.reasons = []  # one failure per test


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    over = sorted(getattr(config, "_tier_over", []), reverse=True)
    if over:
        terminalreporter.section("fast tests over the tier's 2 s")
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:6.2f}s {nodeid}")
