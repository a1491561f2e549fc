"""sinkscope: measure attention sinks in causal language models.

The data flow (see DESIGN.md)::

    source -> model+tokenizer -> windows -> forward loop (+hook points) -> probes
           -> accumulators -> results table + manifest + tokens -> figures -> report.html

Where things live: ``run/`` runs every measuring command (``commands/``) once;
``capture/`` names the hook points and attaches them to a model; ``probes/`` is what we
measure; ``forward/runner.py`` is the only forward loop; ``store/results.py`` is the table format;
``report/`` turns tables into figures. ``sinkscope.measure(...)`` is the Python API.
"""

from sinkscope.errors import SinkscopeError
from sinkscope.version import __version__


def measure(*args, **kwargs):
    """Run a measuring command or named probes on a model (see :func:`sinkscope.api.measure`)."""
    from sinkscope.api import measure as _measure

    return _measure(*args, **kwargs)


__all__ = ["SinkscopeError", "__version__", "measure"]
