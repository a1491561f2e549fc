"""An nnsight ``LanguageModel`` (and nnterp's ``StandardizedTransformer``) measured through the transformers model it wraps.

nnsight wraps a transformers model in an ``Envoy`` tree without changing the model's modules
(nnterp's standard names are aliases on the envoys), so the model inside (``_module``; ``_model``
in nnsight before 0.5) runs its own code and sinkscope's capture sees it as the bare model: the same
numbers (tested). The wrapper's ``tokenizer`` serves texts.
"""

from __future__ import annotations

import torch

from sinkscope.errors import SinkscopeError


def is_nnsight_model(model) -> bool:
    """An nnsight model (``LanguageModel``, ``TransformersModel``, nnterp's ``StandardizedTransformer``)."""
    return any(cls.__module__.split(".")[0] in ("nnsight", "nnterp") for cls in type(model).__mro__) and \
        _inner(model) is not None


def _inner(model) -> torch.nn.Module | None:
    for name in ("_module", "_model"):
        inner = vars(model).get(name) if hasattr(model, "__dict__") else None
        if isinstance(inner, torch.nn.Module):
            return inner
    return None


def unwrapped(model) -> tuple[torch.nn.Module, object]:
    """The transformers model inside an nnsight model, and its tokenizer (None if it has none).

    Raises:
        SinkscopeError: when the weights are not loaded yet (an nnsight model made from a hub id
            without ``dispatch=True`` holds them on the meta device until its first trace).
    """
    inner = _inner(model)
    if any(p.is_meta for p in inner.parameters()):
        raise SinkscopeError(f"the {type(model).__name__}'s weights are not loaded yet (nnsight loads them at its "
                             "first trace); make it with dispatch=True, or run one trace first.")
    return inner, vars(model).get("tokenizer")
