"""Text and token windows: corpora, the bundled corpus's fetcher, BOS policies, junk batches.

Lives here: ``corpus.py`` (corpora -> deterministic token windows; long texts in segments), ``fetch.py``
(the bundled Austen corpus from Debian's r-cran-janeaustenr), ``bos.py`` (the ``--bos`` policies,
numpy-free), ``junk.py`` (the batches value-read injection draws its junk across).
May import: models, store, runtime, errors; never probes, forward or anything above.
Add here: a new corpus or window rule.
"""
