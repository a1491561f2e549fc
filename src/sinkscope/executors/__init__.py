"""Where jobs run: in this process, in spawned local processes, on a Ray cluster, or on SLURM through submitit.

A *job* (:class:`~sinkscope.executors.jobs.Job`) is a picklable call with a name and a log file: one
plan of a comparison (``run.dispatch.run_in_worker``), one (variant, seed) of a sweep. Every executor
runs the jobs with :func:`~sinkscope.executors.jobs.run_job`, which sends the job's output to its log
and turns a failure into an :class:`~sinkscope.executors.jobs.Outcome` holding one sentence, so one
job that fails never stops the others. Results travel through the shared filesystem (each job writes
its own folder atomically); only the small outcomes come back, never a pickle found on disk.

Lives here: ``settings.py`` (the ``--executor`` options, torch-free, checked before anything loads),
``jobs.py`` (jobs, outcomes, the progress line), ``local.py`` (this process, or ``--jobs N`` spawned
processes), ``ray_tasks.py`` (``--executor ray``), ``slurm.py`` (``--executor slurm``), ``run.py``.
May import: runtime and errors only (a contract: an executor knows nothing of what a job measures).
Add here: a new executor (one module, and its name in ``settings.EXECUTORS``).
"""
