"""Where sinkscope keeps caches (dequantised GGUF models, the bundled corpus)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The sinkscope cache folder.

    ``$SINKSCOPE_CACHE`` if set, else ``${XDG_CACHE_HOME:-~/.cache}/sinkscope``.
    """
    explicit = os.environ.get("SINKSCOPE_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "sinkscope"


def user_path(value: str | os.PathLike | None, option: str) -> str | None:
    """A path the user gave, as every writer and reader will use it: ``~`` expanded once, here.

    A launcher that quotes ``--out '~/runs/x'`` passes the ``~`` through; without this, folders were
    made as ``./~/runs`` while the table writer expanded it. A name that cannot be written as UTF-8
    (bytes such as ``caf\\xe9`` that the file system decoded with surrogates) is refused before
    anything loads, naming ``option``; None stays None.
    """
    if value is None:
        return None
    text = os.fspath(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        from sinkscope.errors import SinkscopeError

        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
        raise SinkscopeError(f"{option} {shown} holds bytes that are not UTF-8 text (position {error.start}); "
                             "give a name in UTF-8.") from None
    return os.path.expanduser(text) if text.startswith("~") else text
