"""Tables -> figures -> one self-contained report.html. Never loads a model.

``build_report`` (``build.py``) and ``read_run`` (``runs.py``) are imported on first use, so that a
light module of this package (``folder.py``, which the torch-free plan asks whether a folder is a
report's) does not pay for matplotlib.
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
