"""sinkscope: measure attention sinks in causal language models.

The data flow (see DESIGN.md)::

    source -> model+tokenizer -> windows -> forward loop (+capture) -> records -> probes
           -> accumulators -> results table + manifest + tokens -> figures -> report.html

Where things live: ``capture/`` is how a model family hands over its attention,
``probes/`` is what we measure, ``runner.py`` is the only forward loop, ``results.py``
is the table format, ``report/`` turns tables into figures.
"""

__version__ = "0.1.0"

from sinkscope.errors import SinkscopeError

__all__ = ["SinkscopeError", "__version__"]
