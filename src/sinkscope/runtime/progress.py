"""The progress bar of the forward loop and the trainer: tqdm's, chosen quietly.

``tqdm.auto`` picks the notebook widget in any Jupyter kernel and, where ipywidgets is not
installed, warns "IProgress not found" on every bar. Here the widget is chosen only in a Jupyter
kernel whose ipywidgets imports; everywhere else (a terminal, a script, a kernel without
ipywidgets) the plain text bar is, and nothing is printed about it.
"""

from __future__ import annotations

import os
import sys


def in_notebook() -> bool:
    """Whether we run in a Jupyter kernel (notebook, lab, VS Code, Colab), told as ``tqdm.autonotebook`` tells it."""
    if "IPython.utils._process_emscripten" in sys.modules:  # JupyterLite
        return True
    if "ipykernel.zmqshell" not in sys.modules:  # a terminal, a script, IPython in a console
        return False
    if any(name == "QT_API" or name.startswith("SPYDER") for name in os.environ):  # qtconsole, Spyder
        return False
    try:
        shell = sys.modules["IPython"].get_ipython()
    except Exception:  # noqa: BLE001 - no IPython shell after all
        return False
    return shell is not None and not any(word in type(shell).__name__.lower() for word in ("qt", "spyder"))


def bar_class() -> type:
    """``tqdm.notebook.tqdm`` in a Jupyter kernel whose ipywidgets imports, else the plain ``tqdm.tqdm``."""
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401 - what the widget bar draws with
            from tqdm import notebook

            if notebook.IProgress is not None:  # tqdm found the widget it needs
                return notebook.tqdm
        except Exception:  # noqa: BLE001 - missing or broken ipywidgets: the plain bar, silently
            pass
    from tqdm import tqdm

    return tqdm


def progress_bar(*args, **kwargs):
    """A tqdm progress bar (the arguments are tqdm's) of the class :func:`bar_class` chooses."""
    return bar_class()(*args, **kwargs)
