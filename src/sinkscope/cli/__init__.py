"""The ``sinkscope`` command line: typer declarations over the library (``app`` is the entry point).

Lives here: ``application.py`` (the app and its error policy: one sentence, exit 1; Ctrl-C 130,
SIGTERM 143), ``options.py`` (the options every command shares and the typed route: each CLI
parameter is a field of its command's options, checked at import), ``measuring_commands.py`` (the
measuring commands: ``execute(plan(...))``), ``lab.py`` (train, sweep, toy, run), ``inspect.py``
(report, ls). Importing the package registers every command on ``app``.
May import: everything; nothing imports it (``__main__`` aside).
Add here: a command's declaration, beside its options dataclass in ``commands/`` or the lab.
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

