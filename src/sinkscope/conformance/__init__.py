"""Conformance across every causal-LM family transformers ships: tiny random models, one matrix.

Lives here: ``matrix.py`` (``python -m sinkscope.conformance.matrix``: every model type checked),
``tiny.py``, ``shrink.py``, ``overrides.py`` (tiny configs from config classes), ``kinds.py``
(which families have softmax attention).
May import: the API and everything below it.
Add here: a family's tiny-config override, when its config class cannot be shrunk on its own.
"""
