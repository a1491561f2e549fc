"""A model's size from its config alone, checked before anything is allocated (issue 38, class 2).

A config.json is a file someone hands you: ``num_hidden_layers = 10**9`` would otherwise make
transformers build modules until the machine runs out of memory, and a zero, negative or NaN width
fails much later with an error that blames something else (the tokenizer, "integer modulo by
zero"). :func:`check_config_sizes` reads the size fields by their usual names, refuses a value that
is not a positive integer in one sentence naming the field and the file, and estimates the memory
the weights need::

    params ~= L * (attention + MLP) + 2 * V * C + P * C  (embedding and an untied head; V * C if tied;
                                                           a learned position table of P positions)
    attention = 2 * C * H * D + 2 * C * Hkv * D          (q, o; k, v)
    MLP = 3 * C * F * max(1, E)                           (gated: gate, up, down; E experts)
    bytes ~= 2 * params + L * 64 KiB                      (16-bit weights: the least any load takes;
                                                           the per-layer Python modules)

P is the context field (``max_position_embeddings``, ``n_positions``, ``block_size``) where the
config names no other position scheme (no key mentions rope, rotary, alibi or relative
positions): GPT-2's, OPT's and the bundled trainer's learned tables. Every size field (the head
width and the context included) must be a positive integer; a per-layer list (``layer_types``)
must have one entry per layer; no setting may be NaN, nor an epsilon infinite.

It refuses when that exceeds the memory this machine has (available RAM, plus the accelerators'
when torch is already loaded). The estimate is a lower bound of what a load needs, so a model it
refuses cannot load; a model it lets through can still be too big, which the loader's own
out-of-memory sentence then names. Torch-free: the CLI calls it before torch loads.
"""

from __future__ import annotations

import math

from sinkscope.errors import SinkscopeError
from sinkscope.runtime.memory import available_memory

#: field name -> its usual spellings in configs (transformers' and the bundled trainer's).
SIZE_FIELDS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "width": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head", "num_heads"),
    "kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "vocab": ("vocab_size",),
    "mlp": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "moe_intermediate_size"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "context": ("max_position_embeddings", "n_positions", "block_size"),
}
BYTES_PER_PARAM = 2  # 16-bit weights: the smallest dtype sinkscope loads a model in
BYTES_PER_LAYER = 64 * 1024  # a decoder layer's Python modules and parameter objects, at the least
#: a large real model's sizes: the refusal names the field furthest above its own.
TYPICAL = {"layers": 128, "width": 16384, "mlp": 65536, "vocab": 262144, "experts": 512, "head_dim": 512,
           "heads": 256, "kv_heads": 256, "context": 1 << 20}
#: words in a config key that name a position scheme without a learned table (rotary, ALiBi, relative).
NO_TABLE_WORDS = ("rope", "rotary", "alibi", "relative")
#: per-layer lists: one entry per layer.
PER_LAYER_LISTS = ("layer_types",)


def _kind_of(field: str) -> str:
    return next(kind for kind, names in SIZE_FIELDS.items() if field in names)


def _value(config: dict, names: tuple[str, ...], where: str) -> tuple[str, int] | None:
    for name in names:
        if name not in config or config[name] is None:
            continue
        value = config[name]
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        if isinstance(value, float) and value.is_integer() and value > 0:  # 2048.0: a JSON writer's int
            value, ok = int(value), True
        if not ok:
            raise SinkscopeError(f"{where} sets {name} = {value!r}; it must be a positive integer, so the file is "
                                 "damaged or not a model's config.")
        return name, value
    return None


def _model_section(config: dict) -> dict:
    """The part of a config that describes the language model (a multimodal config's text_config)."""
    for key in ("text_config", "language_config", "llm_config"):
        inner = config.get(key)
        if isinstance(inner, dict) and not any(name in config for name in SIZE_FIELDS["layers"]):
            return inner
    return config


def estimate(config: dict, where: str) -> tuple[int | None, int | None, dict[str, tuple[str, int]]]:
    """(parameters, bytes, {kind: (field, value)}) of ``config``; a bad size is one sentence.

    A config without its layer count or width (a config class fills in defaults; custom code may
    compute them) gives no estimate: (None, None, fields)."""
    config = _model_section(config)
    fields = {}
    for kind, names in SIZE_FIELDS.items():
        found = _value(config, names, where)
        if found is not None:
            fields[kind] = found
    if "layers" not in fields or "width" not in fields:
        return None, None, fields
    L, C = fields["layers"][1], fields["width"][1]
    _check_per_layer_lists(config, L, fields["layers"][0], where)
    H = fields.get("heads", (None, 1))[1]
    Hkv = fields.get("kv_heads", (None, H))[1]
    D = fields.get("head_dim", (None, max(1, C // H)))[1]
    F = fields.get("mlp", (None, 4 * C))[1]
    E = fields.get("experts", (None, 1))[1]
    V = fields.get("vocab", (None, 0))[1]
    P = fields["context"][1] if "context" in fields and learned_positions(config) else 0
    attention = 2 * C * H * D + 2 * C * Hkv * D
    mlp = 3 * C * F * max(1, E)
    params = L * (attention + mlp) + (1 if config.get("tie_word_embeddings") is True else 2) * V * C + P * C
    return params, BYTES_PER_PARAM * params + BYTES_PER_LAYER * L, fields


def learned_positions(config: dict) -> bool:
    """Whether the config's context field sizes a learned position table: no key names another scheme."""
    return not any(word in str(key).lower() for key in config for word in NO_TABLE_WORDS) and \
        config.get("position_embedding_type", "absolute") == "absolute"


def _check_per_layer_lists(config: dict, layers: int, layer_field: str, where: str) -> None:
    for name in PER_LAYER_LISTS:
        value = config.get(name)
        if isinstance(value, list) and len(value) != layers:
            raise SinkscopeError(f"{where} sets {name} with {len(value):,} entries but {layer_field} = {layers:,}; "
                                 "it needs one per layer, so the file is damaged or not a model's config.")


def check_finite_settings(config: dict, where: str, depth: int = 0) -> None:
    """Refuse a NaN setting anywhere in ``config`` (nested sections too), or an infinite epsilon:
    one sentence naming the field, before the model is built (else it fails later, blamed on the
    weights or the dtype)."""
    for name, value in config.items():
        if isinstance(value, dict) and depth < 4:
            check_finite_settings(value, where, depth + 1)
        elif isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and "eps" in str(name).lower())):
            raise SinkscopeError(f"{where} sets {name} = {value!r}; a model's settings must be finite numbers, so "
                                 "the file is damaged or not a model's config.")


def _human(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} PB"


def check_config_sizes(config: dict, where: str, memory: int | None = None) -> int | None:
    """Refuse a config whose sizes are not positive integers, or whose weights cannot fit in memory.

    ``where`` names the file in the sentence ("the model's config.json at X"); ``memory`` overrides
    :func:`available_memory` (tests). Returns the estimated parameter count (None: no estimate).
    """
    check_finite_settings(config, where)
    params, need, fields = estimate(config, where)
    if need is None:
        return None
    memory = available_memory() if memory is None else memory
    if memory is not None and need > memory:
        field, value = max((fields[kind] for kind in TYPICAL if kind in fields),
                           key=lambda found: found[1] / TYPICAL[_kind_of(found[0])])  # the most unusual size
        size = f"about {params:.3g} parameters" if math.isfinite(params) else "more parameters than can be counted"
        raise SinkscopeError(
            f"{where} describes a model too big for this machine ({field} = {value:,}: {size}, at least "
            f"{_human(need)} to load, against {_human(memory)} of memory available); sinkscope refuses it before "
            "allocating anything.")
    return params
