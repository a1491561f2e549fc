"""Reading a long text through a bounded key-value cache (``sinkscope stream``; SPEC.md "Streaming").

A document is read chunk by chunk through transformers' own ``DynamicCache``; after every chunk
each layer's cache is cut back to the policy's budget (``sinkscope/cache.py``), keys are re-rotated when
positions are counted within the cache (``rotary.py``), and the per-token negative log-likelihood
is recorded (``reader.py``). ``reader.read_masked`` is the exact reference for short texts: one
forward pass whose mask shows each query the keys the cache would hold.
"""
