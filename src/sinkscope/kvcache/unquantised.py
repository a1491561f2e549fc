"""Quantised reading conditions that quantise nothing (SPEC.md "Quantised KV caches"; issue 62).

A condition labelled 2-bit can hold every key and value in full precision for the whole reading,
and its rows then equal the 16-bit reading's. :func:`why_nothing_quantised` finds the cases that the
condition's settings decide before any token is read (``stream/windows.py`` prints one line for each):

- **protection covers the cache**: ``--protect-sinks P`` with ``P >= L`` (every token of an L-token
  document is among the first P), or ``--protect top-p0:N`` / ``random:N`` with ``N >= capacity``
  (the rule holds every slot the cache can hold);
- **kivi never quantises**: ``kivi`` and ``kivi-grouped`` quantise keys in whole blocks of the
  residual length R (``KVQuant.residual_length``, ``quant.complete_groups``), so keys stay exact
  while fewer than R candidates (slots neither protected nor quantised) can be cached:
  ``capacity - protected < R``. Values: ``kivi-grouped`` quantises a value with its key; ``kivi``
  quantises the values older than the R most recent tokens, and those it may quantise (not among the
  first P) are always recent when the document has at most R tokens, when ``window`` holds at most R,
  when ``full`` leaves at most R tokens unprotected (``L - P <= R``), or when ``sinks``' first tokens
  are protected (``P >= sink_tokens``) and it keeps at most R recent ones. ``h2o``'s heavy hitters
  may be old: it is named only for documents of at most R tokens.

``capacity`` is the most slots a layer's cache holds after its eviction: ``min(cache, L)``, or L
for ``full``. ``protected`` counts the slots the settings hold in full precision whatever is read:
N of ``--protect``, plus P where the policy never evicts the first tokens (``full``; ``sinks`` up to
its ``sink_tokens``). These are sufficient conditions: a condition that passes them may still
quantise little, which the per-row counts would show.
"""

from __future__ import annotations

from sinkscope.kvcache.policies import Policy
from sinkscope.kvcache.quant import KVQuant


def capacity(policy: Policy, doc_len: int) -> int:
    """The most slots one layer's cache holds after eviction: ``min(cache, doc_len)``, or ``doc_len`` for ``full``."""
    return doc_len if policy.name == "full" else min(int(policy.cache), doc_len)


def _always_protected(policy: Policy) -> int:
    """Slots held in full precision whatever is read: ``--protect``'s N plus the first tokens the policy keeps."""
    rule = policy.protect_rule
    first = {"full": policy.protect_sinks, "sinks": min(policy.protect_sinks, policy.sink_tokens)}.get(policy.name, 0)
    return (rule[1] if rule else 0) + first


def _values_stay_recent(policy: Policy, doc_len: int, R: int) -> bool:
    """Whether every value ``kivi`` may quantise (cached, not among the first ``protect_sinks`` tokens) is always
    among the R most recent tokens, which ``kivi`` holds exact (``slots.quantise_slots``)."""
    if doc_len <= R:
        return True
    if policy.name == "window":
        return capacity(policy, doc_len) <= R
    if policy.name == "full":
        return doc_len - policy.protect_sinks <= R
    if policy.name == "sinks":
        return policy.protect_sinks >= policy.sink_tokens and policy.cache - policy.sink_tokens <= R
    return False  # h2o: old heavy hitters


def why_nothing_quantised(policy: Policy, doc_len: int) -> str | None:
    """Why a quantised ``policy`` holds every key and value exact over ``doc_len``-token documents (one phrase),
    or None when it may quantise something (and for 16 bits and transformers' quantiser)."""
    if not policy.quantised or policy.kv_backend != "sinkscope":
        return None
    held = capacity(policy, doc_len)
    rule = policy.protect_rule
    if policy.protect_sinks >= doc_len:
        return (f"--protect-sinks {policy.protect_sinks} keeps every token of the {doc_len}-token documents in full "
                "precision")
    if rule and rule[1] >= held:
        return f"--protect {policy.protect} holds all of the at most {held} keys and values the cache holds"
    setting = KVQuant(policy.kv_bits, policy.kv_group, policy.kv_scheme, policy.kv_residual)
    if not setting.keys_along_tokens:
        return None
    R = setting.residual_length
    if held - _always_protected(policy) >= R:
        return None
    if not (setting.values_follow_keys or _values_stay_recent(policy, doc_len, R)):
        return None
    return (f"kivi quantises keys in blocks of {R} and the cache never holds {R} that may be quantised (at most "
            f"{held - _always_protected(policy)}), and every value it holds stays among the {R} most recent "
            "tokens or is protected")


def nothing_quantised_note(policy: Policy, doc_len: int) -> str | None:
    """The printed line for a condition that quantises nothing (:func:`why_nothing_quantised`), or None."""
    why = why_nothing_quantised(policy, doc_len)
    if why is None:
        return None
    return (f"note: {policy.label} quantises nothing: {why}, so its rows equal the 16-bit reading's "
            "(the label's bits are never applied).")
