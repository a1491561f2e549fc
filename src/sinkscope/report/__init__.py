"""Tables -> figures -> one self-contained report.html. Never loads a model."""

from sinkscope.report.build import build_report, read_run

__all__ = ["build_report", "read_run"]
