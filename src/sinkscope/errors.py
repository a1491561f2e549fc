"""The one exception type users see.

Every anticipated failure (missing model, unsupported architecture, too-short text,
an existing run folder, ...) raises :class:`SinkscopeError` with one sentence that says what
happened and what to do. The CLI prints that sentence and exits with ``exit_code`` (1), never
a traceback; :class:`Interrupted` (Ctrl-C) exits 130 wherever it happens.
"""


class SinkscopeError(RuntimeError):
    """A failure explained in one sentence, meant to be shown to the user as is."""

    #: the process exit status the CLI uses for this failure
    exit_code = 1


class Interrupted(SinkscopeError):
    """Ctrl-C, with a sentence saying what was kept; exits 130 like any interrupted command."""

    exit_code = 130


def suggest(word: str, known) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` names, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
