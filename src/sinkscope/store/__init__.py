"""What is written and read back, atomically and safely: files, tables, states, the explorer format.

Lives here: ``files.py`` (atomic writes, inventories, JSON read safely, folder locks), ``results.py``
(the tidy table's schema, ``MetricInfo``, the manifest, the run folder), ``statefile.py`` (resume
checkpoints as safetensors + JSON, never pickles), ``explorer_format.py`` (explorer.npz, checked
before it is read), ``comparison_record.py`` (comparison.json).
May import: data, models, runtime, errors; never probes, report or anything above.
Add here: a new file format sinkscope writes (with its reader and its checks).
"""
