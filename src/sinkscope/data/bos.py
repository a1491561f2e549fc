"""The BOS policies a window can be cut under (``--bos``), torch- and numpy-free: the command line checks
the option before anything heavy is imported; ``data.corpus.resolve_bos`` applies the policy.

    auto   prepend the tokenizer's BOS token when its own encoding adds one (what the model saw in training)
    add    always prepend it (a tokenizer without one: refused)
    none   never
"""

BOS_POLICIES = ("auto", "add", "none")
