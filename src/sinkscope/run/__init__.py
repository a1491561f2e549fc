"""One measurement, end to end, by stage: plan -> prepare -> load -> measuring -> write.

Lives here: ``plan.py`` (torch-free: every check, each model resolved once -> ``Plan``),
``prepare.py``, ``load.py`` (with ``loaders.py``: a model and tokenizer per kind of source),
``measuring.py``, ``write.py`` and ``stages.py`` (one plan through every stage), ``result.py`` (the
``Result`` a run returns and saves), ``comparison.py`` (several plans, one page) and ``dispatch.py``
(``execute(plans)``: in this process or on an executor).
May import: executors, commands, train, forward, probes, capture, kvcache, stats, report, data,
models, store, runtime; never the CLI, the lab or the API.
Add here: a new stage of every run (each a function of the previous stage's record).
"""
