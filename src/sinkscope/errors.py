"""The one exception type users see.

Every anticipated failure (missing model, unsupported architecture, too-short text,
an existing run folder, ...) raises :class:`SinkscopeError` with one sentence that says what
happened and what to do. The CLI prints that sentence and exits non-zero, never a traceback.
"""


class SinkscopeError(RuntimeError):
    """A failure explained in one sentence, meant to be shown to the user as is."""
