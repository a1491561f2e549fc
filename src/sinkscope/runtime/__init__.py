"""The process around a run: memory, the allocator, progress bars, paths.

Lives here: ``memory.py`` (what RAM and accelerators this process may still use), ``heap.py``
(glibc's mmap threshold), ``progress.py`` (bars that move, in a terminal or a notebook), ``paths.py``
(the cache root, ``~`` in user paths).
May import: errors and version only.
Add here: a question about the machine or the process, asked by several packages.
"""
