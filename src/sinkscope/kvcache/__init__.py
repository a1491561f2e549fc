"""Bounded and quantised key-value caches: which keys a cache keeps and how it stores them.

Lives here: ``policies.py`` (full, window, StreamingLLM sinks, H2O: which keys a cache keeps),
``quant.py`` (KIVI's and per-token quantisers), ``slots.py`` (which cached slots are quantised and
which are protected).
May import: capture (records), data, models, store, runtime; never forward or anything above.
Add here: a new cache policy (a small class in ``policies.py``) or quantisation scheme.
"""
