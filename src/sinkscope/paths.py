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
