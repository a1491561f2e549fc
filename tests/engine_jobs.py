"""Job functions for the engines' tests that spawn processes (tests/e2e/test_engine_failures.py): kept in
a module of their own that imports nothing heavy, so that each spawned process (which imports the
function's module) starts in a fraction of a second."""

from __future__ import annotations

import os
import signal


def square(x: int) -> int:
    return x * x


def kill_myself(x: int) -> int:
    """Die as the out-of-memory killer ends a process: SIGKILL, no outcome sent."""
    os.kill(os.getpid(), signal.SIGKILL)
    return x
