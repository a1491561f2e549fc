"""The tiny config of one model type: the generic shrink, then the per-type quirks it does not cover.

``OVERRIDES`` holds, for the few types where the generic rules (``shrink.py``) are not enough,
the corrections (each says why): nested dicts merge, ``"__fn__"`` post-processes, and
``"__defaults__"`` are the arguments needed to instantiate the defaults at all.
:func:`tiny_overrides` is the keyword arguments of the tiny config, :func:`tiny_config` the
config itself. Building and running the model is ``tiny.py``'s (the entry point, which re-exports
these names).
"""

from __future__ import annotations

from typing import Any

from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from sinkscope.conformance.shrink import HEAD_DIM, ROPE_HEAD_DIM, VOCAB, _shrink, _TokenIds

__all__ = ["OVERRIDES", "tiny_config", "tiny_overrides"]


def _dory(out: dict, d: dict) -> dict:
    # DoryConfig.to_dict() doubles every layer count and interleaves "mlp" blocks (the released layout), so the
    # generic plan sees 2x the layers; give the post-init layout directly: 3 sliding + 1 full (every 4th), split
    # into input / recurrent (looped) / output stacks that must add up to num_hidden_layers.
    out.update(num_hidden_layers=4, layer_types=["sliding_attention"] * 3 + ["full_attention"], n_input_layers=1,
               n_recurrent_layers=2, n_output_layers=1)
    out.pop("rope_parameters", None)  # derived per layer type in __post_init__
    return out


_QSA = dict(indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4)

#: per-type corrections to the generic overrides (nested dicts merge; "__fn__" post-processes; "__defaults__" are
#: the arguments needed to instantiate the defaults at all).
OVERRIDES: dict[str, dict[str, Any]] = {
    # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig's defaults no longer carry (v5 moved
    # rope_theta to the top-level rope_parameters): the default config cannot build.
    # Its clip_qkv defaults to None, and torch.clamp(min=None, max=None) raises: use DBRX's released value.
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    "dory": {"__fn__": _dory},
    # Dots1's defaults leave the expert counts None (the generic rule fills n_routed_experts / top-k) and the MoE
    # multiplies moe_intermediate_size by n_shared_experts.
    "dots1": {"n_shared_experts": 1},
    # The defaults put every layer on the same kind (all attention / all Mamba / all conv / None): give each hybrid
    # one layer of each kind.
    "lfm2": {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"], "full_attn_idxs": [1]},
    "lfm2_moe": {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"]},
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
    # block_types (recurrent, recurrent, attention) is cycled over the layers: 3 layers reach the attention block.
    "recurrent_gemma": {"num_hidden_layers": 3},
    # The shared transformer block is tied from the first hybrid layer into the others: it needs two hybrid layers.
    "zamba": {"num_hidden_layers": 4, "layers_block_type": ["linear_attention", "hybrid", "linear_attention", "hybrid"]},
    # Looped layers must start/end on multiples of n_layers_per_attn_res_block (6 by default).
    "inkling2_loop_text": {"n_layers_per_attn_res_block": 2, "loop_layer_index_start": 2, "loop_layer_index_end": 4,
                           "loop_num_passes": 2, "loop_gate_rank": 8},
    # The QSA indexer fields default to None, yet every "indexed_attention" layer builds an indexer from them.
    "qwen4_exp_text": dict(_QSA),
    "qwen4_exp": {"text_config": dict(_QSA)},
    # The defaults carry rope_parameters={} although the rotary embedding looks parameters up per layer type
    # (with an mrope section summing to head_dim / 2).
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                                    "mrope_section": [4, 2, 2]}}},
    # ReformerModelWithLMHead asserts is_decoder; axial position shape must multiply to max_position_embeddings and
    # its embedding dims add up to hidden_size; chunk lengths/buckets shrunk to the 12-token test.
    "reformer": {"is_decoder": True, "axial_pos_shape": [16, 16], "axial_pos_embds_dim": [16, 48],
                 "lsh_attn_chunk_length": 8, "local_attn_chunk_length": 8, "num_buckets": 4},
    # The assistant (drafter) config rejects its own default text config (per-layer inputs must be off).
    "gemma4_assistant": {"__defaults__": {"text_config": {"hidden_size_per_layer_input": 0,
                                                          "vocab_size_per_layer_input": 0}}},
    # Dots3's sliding (SWA) layers use plain attention with head_dim == qk_nope_head_dim + qk_rope_head_dim of the
    # MLA layers (validated); head_dim is an explicit field (256 = 192 + 64 via per_layer_config), so set 16 + 8.
    "dots3_note_text": {"head_dim": HEAD_DIM + ROPE_HEAD_DIM},
    "dots3_note": {"text_config": {"head_dim": HEAD_DIM + ROPE_HEAD_DIM}},
    # X-MOD routes through per-language adapters and refuses to run without a language.
    "xmod": {"default_language": "en_XX"},
}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and not k.startswith("rope"):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _defaults(model_type: str):
    cls = CONFIG_MAPPING[model_type]
    try:
        return cls, cls().to_dict()
    except Exception:
        fix = OVERRIDES.get(model_type, {}).get("__defaults__")
        if fix is None:
            raise
        return cls, cls(**fix).to_dict()


def tiny_overrides(model_type: str) -> dict:
    """The keyword arguments :func:`tiny_config` passes to the config class."""
    cls, d = _defaults(model_type)
    ids = _TokenIds(VOCAB)
    out = _shrink(cls, d, ids)
    extra = {k: v for k, v in OVERRIDES.get(model_type, {}).items() if k != "__defaults__"}
    fn = extra.pop("__fn__", None)
    out = _merge(_merge(OVERRIDES.get(model_type, {}).get("__defaults__", {}), out), extra)
    if fn is not None:
        out = fn(out, d)
    return out


def tiny_config(model_type: str):
    """``CONFIG_MAPPING[model_type]`` built with every size shrunk.

    The generic rules (``shrink._shrink``, applied to sub-configs too): vocab 128, with special-token
    ids that fall outside it moved to distinct ids at its top (127, 126, ...) rather than growing
    the vocabulary; hidden 64; FFN 128 (MoE experts 32); 4 heads, 2 KV heads where the defaults
    use GQA (MQA stays 1, MHA stays 4); head_dim 16 (MLA: nope 16, rope 8, v 16, LoRA ranks 32);
    4 experts, top-2, 1 shared; 256 positions; windows 8; per-layer lists cut to the shortest
    prefix that still holds every layer kind (2 layers at least, see ``shrink._layer_plan``), index
    lists re-indexed; fields the config derives in ``__post_init__`` are left for it to derive;
    rope parameters resized (mrope sections, longrope factors). Then ``OVERRIDES[model_type]``.
    """
    cls = CONFIG_MAPPING[model_type]
    kwargs = tiny_overrides(model_type)
    config = cls(**kwargs)
    return config
