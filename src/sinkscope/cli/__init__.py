"""The ``sinkscope`` command line: typer declarations over the library (``app`` is the entry point).

Every anticipated failure is a :class:`~sinkscope.errors.SinkscopeError` whose one sentence is
printed as ``error: ...`` with exit code 1 (never a traceback); Ctrl-C exits 130 wherever it lands.

The package: ``base.py`` (the app and its error policy), ``commands/spec.py`` (the options the commands
share), ``measure.py`` (the measuring commands: ``execute(plan(...))``), ``lab.py`` (train, sweep,
toy, run) and ``inspect.py`` (report, ls). Importing it registers every command on ``app``.
"""

from __future__ import annotations

import os
import sys

from sinkscope.cli import measuring_commands  # noqa: I001,F401 - registration order is the listing order: measuring commands first
from sinkscope.cli import inspect, lab  # noqa: F401 - report and ls, then the lab commands
from sinkscope.cli.application import app

__all__ = ["app", "main"]




def main() -> None:  # pragma: no cover - console entry for python -m
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app(prog_name="sinkscope")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

