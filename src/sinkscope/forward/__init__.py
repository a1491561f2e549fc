"""The forward passes: the only places that run a model over token windows.

Lives here: ``runner.py`` (the forward loop: batches, interventions, out-of-memory back-off, the
memory check before a pass), ``distributed.py`` (torchrun data parallelism), ``explorer_pass.py``
(the explorer's patterns) and ``stream/`` (a long text read chunk by chunk through a bounded cache).
May import: probes, capture, kvcache, stats, data, models, store, runtime; never the report (the
report reads tables, never a model), run, commands or anything above.
Add here: a new way of reading windows through a model (it then gets a ``Command.read_windows``).
"""
