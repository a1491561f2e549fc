"""Reading a long text through a bounded key-value cache (``sinkscope stream``; SPEC.md "Streaming").

Lives here: ``reader.py`` (a document read chunk by chunk through transformers' own cache, each
layer's cache cut back to the policy's budget after every chunk; ``read_masked``: the exact
reference, one pass whose mask shows each query the keys the cache would hold), ``windows.py``
(the stream command's reader of windows), ``rotary.py`` (keys re-rotated when positions count within
the cache), ``hf_quant.py`` (transformers' ``QuantizedCache`` where it serves).
May import: as ``forward/`` (kvcache for the policies and quantisers).
Add here: a new way of reading through a cache; a new policy goes to ``kvcache/``.
"""
