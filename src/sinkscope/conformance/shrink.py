"""The generic rules that shrink a config class's defaults to a tiny model, the same for every type.

:func:`_shrink` takes a config class and its defaults (``cls().to_dict()``) and returns the
keyword arguments that make every size tiny (the target sizes below), recursing into sub-configs:
vocabulary and special-token ids, widths, heads, experts, positions and windows, per-layer lists
cut to the layers kept (:func:`_layer_plan`), fields the config derives left for it to derive,
rope parameters resized. It knows no model type by name: the per-type corrections are
``overrides.py``'s, and ``tiny.py`` is the entry point.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from transformers.models.auto.configuration_auto import CONFIG_MAPPING

# --------------------------------------------------------------------------------------------
# Target sizes
# --------------------------------------------------------------------------------------------

VOCAB = 128
HIDDEN = 64
FFN = 128
MOE_FFN = 32
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
LAYERS = 2
MAX_LAYERS = 8  # a pattern that needs more layers than this is compacted (see _layer_plan)
EXPERTS = 4
TOP_K = 2
POSITIONS = 256
WINDOW = 8
LORA_RANK = 32
ROPE_HEAD_DIM = 8
STATE = 16

# Every key below was read off the configuration_*.py files of the installed transformers.
_HIDDEN_KEYS = {"hidden_size", "d_model", "n_embd", "embed_dim", "emb_dim", "embedding_size", "word_embed_proj_dim",
                "hidden_dim", "dim", "d_embed", "text_hidden_size", "projection_dim", "out_hidden_size",
                "backbone_hidden_size", "lru_width", "output_embedding_size", "input_embedding_size",
                "attention_hidden_size", "vision_output_dim", "mm_hidden_size", "projector_hidden_size",
                "hidden_size_per_layer_input", "hidden_size_global", "adapter_out_dim", "output_channels"}
_HEAD_DIM_KEYS = {"head_dim", "attention_head_dim", "d_head", "kv_channels", "attention_head_size", "dim_head",
                  "swa_head_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_head_dim", "mamba_d_head",
                  "mamba_head_dim", "mamba_headdim", "index_head_dim", "v_head_dim", "qk_nope_head_dim", "d_kv",
                  "global_head_dim", "mamba_d_ssm_head"}
_HEAD_KEYS = {"num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
              "decoder_attention_heads", "attention_heads", "swa_num_attention_heads", "linear_num_heads",
              "linear_num_value_heads", "index_n_heads", "mamba_n_heads", "num_decoder_attention_heads",
              "num_encoder_attention_heads", "n_mamba_heads", "mamba_num_heads"}
_KV_HEAD_KEYS = {"num_key_value_heads", "num_kv_heads", "swa_num_key_value_heads", "linear_num_key_heads",
                 "num_query_groups", "multi_query_group_num", "n_kv_heads", "num_global_key_value_heads"}
_FFN_KEYS = {"intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff", "dff",
             "dim_ff", "ffn_hidden_size", "feed_forward_size", "d_inner", "intermediate_size_mlp",
             "dense_intermediate_size", "prompt_mid_dim", "mlp_dim"}
_MOE_FFN_KEYS = {"moe_intermediate_size", "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
                 "shared_intermediate_size", "shared_experts_intermediate_size", "expert_ffn_hidden_size",
                 "router_hidden_size"}
_LAYER_KEYS = {"num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "encoder_layers",
               "num_decoder_layers", "num_encoder_layers", "depth", "num_blocks"}
_EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
_TOPK_KEYS = {"num_experts_per_tok", "num_experts_per_token", "moe_k", "moe_topk", "router_topk"}
_SHARED_EXPERT_KEYS = {"n_shared_experts", "num_shared_experts", "moe_num_shared_experts"}
_POSITION_KEYS = {"max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_target_positions",
                  "max_source_positions", "context_length", "max_sequence_length"}
_WINDOW_KEYS = {"sliding_window", "sliding_window_size", "attention_window_size", "window_size",
                "local_attention_window_len", "attention_chunk_size"}
_LORA_KEYS = {"kv_lora_rank", "q_lora_rank", "o_lora_rank"}
_STATE_KEYS = {"mamba_d_state", "state_size", "ssm_state_size", "d_state"}
_GROUP_KEYS = {"mamba_n_groups", "n_groups", "mamba_ngroups"}
_CHUNK_KEYS = {"mamba_chunk_size", "chunk_size"}
_DT_RANK_KEYS = {"time_step_rank", "mamba_dt_rank"}
# layer-period keys: a layer of the second kind exists only when the model has >= period layers
_PERIOD_KEYS = {"decoder_sparse_step", "moe_layer_interval", "interleave_moe_layer_step", "expert_layer_period",
                "attn_layer_period", "no_rope_layer_interval", "global_attn_every_n_layers", "sliding_window_pattern",
                "_sliding_window_pattern", "moe_layer_freq"}
# per-layer index lists (values are layer numbers)
_INDEX_LIST_KEYS = {"full_attn_idxs", "hybrid_layer_ids", "moe_layers", "mlp_only_layers", "ple_layer_ids",
                    "fullatt_block_indexes", "cross_attention_layers", "attn_layer_indices", "global_layers",
                    "global_attn_indexes"}
# keys that hold special token ids that appear in text (bos/eos/pad ...): kept inside the tiny vocabulary
_TEXT_TOKEN_KEYS = {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id",
                    "cls_token_id", "mask_token_id", "unk_token_id", "eod_token_id", "forced_eos_token_id",
                    "forced_bos_token_id", "bos_token_index", "eos_token_index", "pad_index", "unk_index",
                    "mask_index", "eos_index", "bos_index"}



def _sub_config_class(cls: type, key: str, value: dict) -> type | None:
    """The config class of sub-config ``key`` (None when ``key`` is not a sub-config)."""
    subs = getattr(cls, "sub_configs", {}) or {}
    sub = subs.get(key)
    if sub is None:
        return None
    if isinstance(value, dict) and value.get("model_type") in CONFIG_MAPPING:
        return CONFIG_MAPPING[value["model_type"]]
    if sub.__name__ == "AutoConfig":
        return None
    return sub


def _num_layers(d: dict) -> int | None:
    for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"):
        if isinstance(d.get(key), int) and not isinstance(d.get(key), bool):
            return d[key]
    return None


def _layer_plan(d: dict, n_layers: int) -> tuple[int, list[int]]:
    """How many layers to keep, and which original layers they are (a prefix when possible).

    The prefix is the shortest one in which every per-layer list (``layer_types``,
    ``mlp_layer_types``, ...) shows every value it has; periods (``decoder_sparse_step``,
    ``sliding_window_pattern``, ...) must fit too. A prefix longer than MAX_LAYERS is replaced by
    the first layer of each distinct combination of kinds.
    """
    per_layer = {k: v for k, v in d.items()
                 if isinstance(v, list) and len(v) == n_layers and n_layers > 1 and k not in _INDEX_LIST_KEYS}
    need = LAYERS
    for key, values in per_layer.items():
        wanted = {json.dumps(x, sort_keys=True, default=str) for x in values}
        seen: set[str] = set()
        for i, x in enumerate(values):
            seen.add(json.dumps(x, sort_keys=True, default=str))
            if seen == wanted:
                need = max(need, i + 1)
                break
    for key in _PERIOD_KEYS:
        value = d.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 1 < value <= n_layers:
            need = max(need, value)
    for key in ("attn_layer_offset", "expert_layer_offset"):
        value = d.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < n_layers:
            need = max(need, value + 1)
    for key in _INDEX_LIST_KEYS:  # a layer outside the index list must remain, and one inside it
        value = d.get(key)
        if isinstance(value, list) and value and all(isinstance(i, int) for i in value):
            inside = sorted(i for i in value if 0 <= i < n_layers)
            if inside and len(inside) < n_layers:
                outside = [i for i in range(n_layers) if i not in value]
                need = max(need, min(max(inside[0], outside[0]) + 1, n_layers))
    need = min(need, n_layers)
    if need <= MAX_LAYERS:
        return need, list(range(need))
    kinds: dict[str, int] = {}
    for i in range(n_layers):
        combo = json.dumps([per_layer[k][i] for k in sorted(per_layer)], sort_keys=True, default=str)
        kinds.setdefault(combo, i)
    keep = sorted(kinds.values())
    if len(keep) < LAYERS:
        keep = sorted(set(keep) | set(range(LAYERS)))
    return len(keep), keep


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shrink_value(key: str, value: Any, d: dict) -> Any:
    """The tiny value of one scalar field (``value`` unchanged when no rule applies)."""
    if isinstance(value, list) and value and all(_is_int(v) for v in value) and key in (
            _FFN_KEYS | _MOE_FFN_KEYS | _HEAD_KEYS | _KV_HEAD_KEYS | _HIDDEN_KEYS | _HEAD_DIM_KEYS):
        return [_shrink_value(key, v, d) for v in value]
    if not _is_int(value):
        return value
    if key in _HIDDEN_KEYS:
        return HIDDEN if value > HIDDEN or key == "hidden_size" else value
    if key == "qk_rope_head_dim":
        return ROPE_HEAD_DIM
    if key == "head_dim" and value == d.get("qk_rope_head_dim"):
        return ROPE_HEAD_DIM  # MLA configs whose rotary embedding reads head_dim (= qk_rope_head_dim)
    if key in _HEAD_DIM_KEYS:
        return HEAD_DIM if value > 0 else value
    if key in _HEAD_KEYS:
        return HEADS if value > 0 else value
    if key in _KV_HEAD_KEYS:
        if value <= 1:
            return value
        heads = next((d[k] for k in ("num_attention_heads", "n_head", "num_heads", "n_heads") if _is_int(d.get(k))),
                     None)
        return HEADS if heads is not None and value >= heads else KV_HEADS
    if key in _FFN_KEYS or (key.endswith("intermediate_size") and key not in _MOE_FFN_KEYS):
        return FFN if value > 0 else value  # also the widths no list names yet (Ergo's first_dense_intermediate_size)
    if key in _MOE_FFN_KEYS:
        return MOE_FFN if value > 0 else value
    if key in _EXPERT_KEYS:
        return EXPERTS if value > EXPERTS else value
    if key in _TOPK_KEYS:
        return min(value, TOP_K)
    if key in _SHARED_EXPERT_KEYS:
        return min(value, 1)
    if key in {"n_group", "num_expert_group"}:
        return min(value, 2)
    if key in {"topk_group"}:
        return 1
    if key in _POSITION_KEYS:
        return POSITIONS if value > POSITIONS else value
    if key in _WINDOW_KEYS:
        return WINDOW if value > WINDOW else value
    if key in _LORA_KEYS:
        return LORA_RANK if value > LORA_RANK else value
    if key in _STATE_KEYS:
        return min(value, STATE)
    if key in _GROUP_KEYS:
        return 1
    if key in _CHUNK_KEYS:
        return min(value, 16)
    if key in _DT_RANK_KEYS:
        return min(value, 8)
    if key in {"first_k_dense_replace", "num_dense_layers", "moe_layer_start_index"}:
        return min(value, 1)
    if key in {"index_topk"}:
        return min(value, 4)
    if key == "zero_expert_num":  # LongCat's zero-computation experts
        return min(value, 2)
    if key in {"image_size", "crop_size"} and _is_int(d.get("patch_size")) and d["patch_size"] > 0:
        return min(value, 4 * d["patch_size"])  # a 4 x 4 patch grid
    if key in {"num_nextn_predict_layers"}:
        return min(value, 1)
    return value


def _shrink_rope(rope: Any, head_dim: int) -> Any:
    """Keep a rope_parameters dict valid for the tiny head size (mrope sections, longrope factors)."""
    if not isinstance(rope, dict):
        return rope
    if all(isinstance(v, dict) for v in rope.values()) and rope:  # per layer type
        return {k: _shrink_rope(v, head_dim) for k, v in rope.items()}
    rope = dict(rope)
    rotary = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    for key in ("mrope_section", "mrope_sections"):
        sections = rope.get(key)
        if isinstance(sections, list) and sections:
            target = max(rotary // 2, len(sections))
            total = sum(sections)
            scaled = [max(1, round(s * target / total)) for s in sections]
            scaled[0] += target - sum(scaled)
            rope[key] = scaled
    for key in ("short_factor", "long_factor"):
        factors = rope.get(key)
        if isinstance(factors, list) and factors:
            rope[key] = [factors[round(i * (len(factors) - 1) / max(rotary // 2 - 1, 1))] for i in range(rotary // 2)]
    if _is_int(rope.get("original_max_position_embeddings")):
        rope["original_max_position_embeddings"] = min(rope["original_max_position_embeddings"], POSITIONS // 2)
    return rope


class _TokenIds:
    """Hands out distinct ids at the top of the tiny vocabulary for special tokens that fall outside it."""

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.mapping: dict[int, int] = {}
        self.next = vocab - 1

    def __call__(self, token: int) -> int:
        if token < 0 or token < self.vocab and token not in self.mapping.values():
            return token
        if token not in self.mapping:
            self.mapping[token] = self.next
            self.next -= 1
        return self.mapping[token]


def _fields(cls: type) -> dict[str, dataclasses.Field] | None:
    """The dataclass fields of a config class, also under the names ``attribute_map`` stores them as."""
    if not dataclasses.is_dataclass(cls):
        return None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for alias, real in (getattr(cls, "attribute_map", None) or {}).items():
        if alias in fields and real not in fields:
            fields[real] = fields[alias]
    return fields


def _derived(fields: dict | None, key: str, value: Any) -> bool:
    """Whether ``key`` is computed by the config's ``__post_init__`` (not a field, or a None field given a value).

    Derived values are left out of the overrides so the config recomputes them from the shrunk
    sizes (``head_dim = hidden_size // num_attention_heads``, MLA's ``head_dim = qk_rope_head_dim``,
    Zamba2's ``attention_head_dim = 2 * hidden_size // num_attention_heads``, ...).
    """
    if fields is None or value is None:
        return False
    if key not in fields:
        return True
    f = fields[key]
    return f.default is None and f.default_factory is dataclasses.MISSING


def _shrink(cls: type, d: dict, ids: _TokenIds) -> dict:
    """Overrides that shrink the config ``d`` (a ``to_dict()`` of class ``cls``'s defaults)."""
    out: dict[str, Any] = {}
    fields = _fields(cls) if cls is not dict else None
    n_layers = _num_layers(d)
    plan = _layer_plan(d, n_layers) if n_layers else None
    for key, value in d.items():
        if key in {"transformers_version", "architectures", "id2label", "label2id", "model_type", "dtype",
                   "_name_or_path"}:
            continue
        if key == "per_layer_config":
            if isinstance(value, dict) and plan:
                out[key] = _shrink_per_layer(value, d, plan[1])
            continue
        per_layer = (plan is not None and isinstance(value, list) and len(value) == n_layers and n_layers > 1
                     and key not in _INDEX_LIST_KEYS)
        if isinstance(value, dict):
            sub_cls = _sub_config_class(cls, key, value)
            if sub_cls is not None:
                out[key] = _shrink(sub_cls, value, ids)
            elif key in {"rope_parameters", "rope_scaling"}:
                continue  # handled after head_dim is known
            elif key.endswith("_config") or key in {"encoder", "decoder"}:
                out[key] = _shrink(dict, value, ids)
            continue
        if plan and key in _INDEX_LIST_KEYS and isinstance(value, list) and all(_is_int(v) for v in value):
            remap = {old: new for new, old in enumerate(plan[1])}
            out[key] = [remap[i] for i in value if i in remap]
            continue
        if _derived(fields, key, value) and not per_layer:
            continue
        if key in _LAYER_KEYS and _is_int(value):
            out[key] = plan[0] if plan and value == n_layers else min(value, LAYERS)
            continue
        if per_layer:
            out[key] = [_shrink_value(key, value[i], d) for i in plan[1]]
            continue
        if value is None and key == "head_dim" and _is_int(d.get("num_attention_heads")):
            out[key] = HEAD_DIM  # some classes leave it None and then compute head_dim**-0.5
            continue
        if value is None and key == "num_key_value_heads" and _is_int(d.get("num_attention_heads")):
            out[key] = HEADS  # None means "as many as the query heads", but some models divide by it
            continue
        if key == "num_kv_shared_layers" and _is_int(value) and value > 0 and plan:
            # the last layers reuse the KV of earlier ones of the same kind (all of them in the assistant drafters)
            out[key] = plan[0] if value == n_layers else plan[0] // 2
            continue
        if (_is_int(value) and value > HIDDEN and value == d.get("hidden_size") and key != "hidden_size"
                and re.search(r"dim|size|hidden|channel", key) and not re.search(r"vocab|window|chunk|patch|image|kernel|batch|position", key)):
            out[key] = HIDDEN  # a width tied to hidden_size (e.g. dots3's adapter_in_dim)
            continue
        if key in _TEXT_TOKEN_KEYS or key.endswith("_token_id") or key.endswith("_token_index"):
            if _is_int(value):
                out[key] = ids(value)
            elif isinstance(value, list) and all(_is_int(v) for v in value):
                out[key] = [ids(v) for v in value]
            continue
        if "vocab" in key and _is_int(value) and key != "type_vocab_size" and (value > VOCAB or key == "vocab_size"):
            out[key] = VOCAB
            continue
        if key in {"max_window_layers"} and _is_int(value) and plan:
            out[key] = min(value, plan[0])
            continue
        if key in {"moe_layer_end_index", "loop_layer_index_end"} and _is_int(value) and plan:
            out[key] = min(value, plan[0] - 1)
            continue
        if key == "rotary_dim" and _is_int(value):
            out[key] = min(value, HEAD_DIM // 2)
            continue
        new = _shrink_value(key, value, d)
        if new != value:
            out[key] = new
    _fill_missing_moe(d, out)
    _mamba_consistency(d, out)
    if "qk_head_dim" in d and "qk_nope_head_dim" in out and not _derived(fields, "qk_head_dim", d["qk_head_dim"]):
        out["qk_head_dim"] = out["qk_nope_head_dim"] + out.get("qk_rope_head_dim", d.get("qk_rope_head_dim") or 0)
    head_dim = out.get("head_dim", HEAD_DIM)
    if "qk_rope_head_dim" in out:  # MLA: rotary applies to the rope part only
        head_dim = out["qk_rope_head_dim"]
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(d.get(key), dict):
            out[key] = _shrink_rope(d[key], head_dim)
    return out


def _shrink_per_layer(per_layer: dict, d: dict, keep: list[int]) -> dict:
    """A heterogeneous config's ``per_layer_config`` ({layer index: overrides}), re-indexed and shrunk."""
    out = {}
    for old_key, entry in per_layer.items():
        old = int(old_key)
        if old not in keep or not isinstance(entry, dict):
            continue
        new = keep.index(old)
        key = f"{new:0{len(old_key)}d}" if old_key.startswith("0") or len(old_key) > 1 else str(new)
        out[key] = {k: _shrink_value(k, v, {**d, **entry}) for k, v in entry.items()}
    return out


def _fill_missing_moe(d: dict, out: dict) -> None:
    """Some MoE config classes default the expert count / top-k to None although the model needs them."""
    if not any(d.get(k) for k in _MOE_FFN_KEYS):
        return
    for keys, value in ((_EXPERT_KEYS, EXPERTS), (_TOPK_KEYS, TOP_K)):
        for k in keys:
            if k in d and d[k] is None:
                out[k] = value


def _mamba_consistency(d: dict, out: dict) -> None:
    """Mamba2-style mixers need heads x head_dim == expand x hidden_size (validated by the configs)."""
    hidden = out.get("hidden_size", d.get("hidden_size"))
    for heads, dim, expand in (("mamba_n_heads", "mamba_d_head", "mamba_expand"), ("num_heads", "head_dim", "expand"),
                               ("mamba_num_heads", "mamba_head_dim", "mamba_expand")):
        if heads in d and dim in d and _is_int(d.get(expand)) and _is_int(hidden):
            head_dim = out.get(dim, d[dim])
            if _is_int(head_dim) and head_dim > 0:
                out[heads] = d[expand] * hidden // head_dim
    if _is_int(d.get("mamba_d_ssm")) and _is_int(d.get("mamba_expand")):
        out["mamba_d_ssm"] = d["mamba_expand"] * hidden
        if "mamba_n_heads" in out and "mamba_d_head" in out:
            out["mamba_n_heads"] = out["mamba_d_ssm"] // out["mamba_d_head"]
