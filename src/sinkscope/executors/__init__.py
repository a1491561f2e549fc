"""Where jobs run: in this process, in spawned local processes, on a Ray cluster, or on SLURM through submitit.

A *job* (:class:`~sinkscope.executors.jobs.Job`) is a picklable call with a name and a log file: one
plan of a comparison (``executors.plan_job``), one (variant, seed) of a sweep. Every engine runs
the jobs with :func:`~sinkscope.executors.jobs.run_job`, which sends the job's output to its log and
turns a failure into an :class:`~sinkscope.executors.jobs.Outcome` holding one sentence, so one job
that fails never stops the others. Results travel through the shared filesystem (each job writes
its own folder atomically); only the small outcomes come back through the engine.

Modules: ``options`` (the ``--executor`` options, torch-free, checked before anything loads),
``jobs`` (jobs, outcomes, the progress line), ``local`` (this process, or ``--jobs N`` spawned
processes), ``ray_engine`` (``--executor ray``), ``slurm`` (``--executor slurm``, submitit).
The engines are the peers' own (sparse-attention-hub and nnsight use Ray, saev uses submitit):
sinkscope schedules nothing itself.
"""
