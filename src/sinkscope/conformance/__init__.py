"""Conformance checks across every causal-LM family transformers ships (``tiny.py``: tiny random models)."""
