"""The one exception type users see.

Every anticipated failure (missing model, unsupported architecture, too-short text,
an existing run folder, ...) raises :class:`SinkscopeError` with one sentence that says what
happened and what to do. The CLI prints that sentence and exits non-zero, never a traceback.
"""


class SinkscopeError(RuntimeError):
    """A failure explained in one sentence, meant to be shown to the user as is."""


def suggest(word: str, known) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``known`` names, or "" when none is close."""
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
