"""sinkscope: measure attention sinks in causal language models.

The data flow (DESIGN.md)::

    MODEL -> Source -> model + tokenizer -> windows -> forward loop (+ capture) -> records -> probes
          -> accumulators -> results table + manifest + tokens -> figures -> report.html

Lives here: ``api.py`` (``sinkscope.measure``, ``sinkscope.trace``), ``errors.py`` (the one error users see, and the value
checks at the boundary), ``version.py``; every other module lives in a package that answers one
question (docs/layout.md, generated from each package's card).
May import: the root's modules import their packages lazily; internals never import the root.
Add here: nothing; a new module goes into the package whose question it answers.
"""

from sinkscope.errors import SinkscopeError
from sinkscope.version import __version__


def measure(*args, **kwargs):
    """Run a measuring command or named probes on a model (see :func:`sinkscope.api.measure`)."""
    from sinkscope.api import measure as _measure

    return _measure(*args, **kwargs)


def trace(*args, **kwargs):
    """One prompt's attention patterns, scores, q/k/v and residual stream, keyed by TransformerLens's hook
    names (see :func:`sinkscope.api.trace`)."""
    from sinkscope.api import trace as _trace

    return _trace(*args, **kwargs)


__all__ = ["SinkscopeError", "__version__", "measure", "trace"]
