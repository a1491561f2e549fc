"""The lab: what runs many trainings or commands (recipes, sweeps, the toy task).

Lives here: ``recipes.py`` (``sinkscope run``: TOML recipes, their checks and steps), ``sweep.py``
(every variant x seed trained, probed and tabulated), ``toy.py`` (Wang 2026's toy superposition task).
May import: everything below the command line (run, executors, commands, train, forward, probes,
report, data, models, store, runtime); never the CLI.
Add here: a new kind of study that drives several runs; its figures go to ``report/`` (``report/lab_figures.py``).
"""
