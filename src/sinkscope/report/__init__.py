"""Tables -> figures -> one self-contained report.html. Never loads a model; every figure is drawn here.

Lives here: ``build.py`` (the page from sections), one section module per command (``circuit``,
``inject``, ``stream``, ...) and per kind of run (``generic``, ``lengths``, ``steps``, ``tokens``),
``figures.py`` and ``curves.py`` (the shared drawing), ``lab_figures.py`` (the sweep's and the toy task's
figures), ``explorer_page.py`` and ``static/`` (the attention explorer), ``runs.py``, ``page.py``,
``folder.py``; ``summary.py`` (the numbers a command prints, ``ls runs``) and ``compare.py`` (the
differences between runs, ``compare.csv``; ``compare_section.py`` their table on a comparison page). ``build_report`` and ``read_run`` are imported on first use, so that a light module
(``folder.py``) does not pay for matplotlib.
May import: stats, data, models, store, runtime; never forward, probes or capture (a contract).
Add here: a figure (in the section of the command that measures it).
"""

from __future__ import annotations

__all__ = ["build_report", "read_run"]


def build_report(*args, **kwargs):
    """Write ``report.html`` for one run or a comparison (:func:`sinkscope.report.build.build_report`)."""
    from sinkscope.report.build import build_report as build

    return build(*args, **kwargs)


def read_run(*args, **kwargs):
    """A run folder's table and manifest (:func:`sinkscope.report.runs.read_run`)."""
    from sinkscope.report.runs import read_run as read

    return read(*args, **kwargs)
