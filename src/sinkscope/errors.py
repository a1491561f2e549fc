"""The one exception type users see.

Every anticipated failure (missing model, unsupported architecture, too-short text,
an existing run folder, ...) raises :class:`SinkscopeError` with one sentence that says what
happened and what to do. The CLI prints that sentence and exits with ``exit_code`` (1), never
a traceback; :class:`Interrupted` (Ctrl-C) exits 130 wherever it happens.
"""

from __future__ import annotations

import re

#: the command line's flag where it is not the option's name with dashes (a repeated option is singular).
FLAGS = {"probes": "probe", "params": "param", "plugins": "plugin", "cutoffs": "cutoff"}
_OPTION = re.compile("\x02([a-z_0-9]+)(?:=(True|False))?\x03")


def option(name: str, value: bool | None = None) -> str:
    """An option named in a sentence, phrased by whoever shows the sentence (:func:`phrase`): ``--seq-len``
    on the command line and ``seq_len`` in the Python API; a boolean ``value`` names the switch as set
    (``option("figures", False)``: ``--no-figures`` / ``figures=False``)."""
    return f"\x02{name}{'' if value is None else f'={value}'}\x03"


def phrase(message: str, style: str = "cli") -> str:
    """``message`` with its :func:`option` names in the words of ``style``: ``"cli"`` or ``"api"``."""
    def word(match: re.Match) -> str:
        name, value = match.group(1), match.group(2)
        if style == "api":
            return name if value is None else f"{name}={value}"
        flag = "--" + FLAGS.get(name, name).replace("_", "-")
        return flag if value != "False" else "--no-" + flag[2:]
    return _OPTION.sub(word, message)


class SinkscopeError(RuntimeError):
    """A failure explained in one sentence, meant to be shown to the user as is.

    The sentence names options with :func:`option`; ``str(error)`` phrases them for the command line
    and ``error.phrased("api")`` for the Python API, so one message serves both. ``raw`` keeps the
    names unphrased (for a sentence that quotes another).
    """

    #: the process exit status the CLI uses for this failure
    exit_code = 1

    def __str__(self) -> str:
        return phrase(str(self.args[0]), "cli") if self.args else ""

    @property
    def raw(self) -> str:
        return str(self.args[0]) if self.args else ""

    def phrased(self, style: str) -> str:
        return phrase(self.raw, style)


class Interrupted(SinkscopeError):
    """Ctrl-C, with a sentence saying what was kept; exits 130 like any interrupted command."""

    exit_code = 130


def suggest(word: str, known) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` names, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
