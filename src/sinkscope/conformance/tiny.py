"""Tiny random models of every causal-LM type transformers knows, built from the config class alone.

For each key of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``:

* :func:`classify` says what kind of model it is (``CLASSES``), with the reason in ``CLASS_REASONS``;
* :func:`tiny_config` takes the config class's defaults (``CONFIG_MAPPING[model_type]()``) and
  shrinks every size with one generic rule set (:func:`_shrink`), then applies the few per-type
  ``OVERRIDES`` where the generic rule is not enough (each says why);
* :func:`build_tiny` builds ``AutoModelForCausalLM.from_config`` of it: float32, eval, eager, seeded.

What sinkscope finds in each model (attention path, learned sink, hook points) is the conformance
matrix's (``matrix.py``, through ``capture.discover``), not repeated here.

``python -m sinkscope.conformance.tiny OUT.json [TYPE ...]`` runs the whole table, one line per
type (built, forward run), and writes a JSON summary. Nothing is downloaded: everything comes from the
installed transformers' config classes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import re
import sys
import time
import warnings
from typing import Any

import torch

import transformers
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

__all__ = [
    "CLASSES",
    "CLASS_REASONS",
    "KNOWN_FAILURES",
    "OVERRIDES",
    "build_tiny",
    "check",
    "classify",
    "main",
    "model_types",
    "tiny_config",
    "tiny_overrides",
]

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


def model_types() -> list[str]:
    """Every causal-LM model type of the installed transformers, sorted."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


# --------------------------------------------------------------------------------------------
# Classification
# --------------------------------------------------------------------------------------------

_ENCODER_DECODER = {
    "bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus", "plbart",
    "prophetnet", "trocr", "whisper", "musicgen", "musicgen_melody",
}
_ENCODER = {
    "bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie", "megatron-bert",
    "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "xlm-roberta", "xlm-roberta-xl", "xmod",
    "xlm", "xlnet",
}
_ATTENTION_FREE = {"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm"}
CLASSES: dict[str, str] = {}
CLASS_REASONS: dict[str, str] = {}


def _set_class(types: Any, cls: str, reason: str) -> None:
    for t in ([types] if isinstance(types, str) else types):
        CLASSES[t] = cls
        CLASS_REASONS[t] = reason


_set_class(_ENCODER_DECODER - {"trocr", "whisper", "musicgen", "musicgen_melody", "prophetnet"}, "encoder-decoder",
           "the causal-LM class is the decoder half of a seq2seq model (config.is_encoder_decoder=True): "
           "causal self-attention plus cross-attention layers that are skipped without encoder states")
_set_class("prophetnet", "encoder-decoder", "ProphetNetForCausalLM is the n-stream (main + predict) decoder of "
           "the ProphetNet seq2seq model")
_set_class("trocr", "encoder-decoder", "the text decoder of TrOCR's VisionEncoderDecoder (cross-attention to a ViT)")
_set_class("whisper", "encoder-decoder", "WhisperForCausalLM is the text decoder of the Whisper speech seq2seq model "
           "(used for assisted decoding)")
_set_class(["musicgen", "musicgen_melody"], "encoder-decoder", "the causal LM is the audio-codebook decoder of a "
           "text/melody-conditioned seq2seq model; input_ids are (batch*num_codebooks, seq) codebook ids")
_set_class(_ENCODER - {"xlnet", "xlm", "bert-generation"}, "encoder",
           "a BERT-style bidirectional encoder; the causal-LM head masks causally only when config.is_decoder=True")
_set_class("bert-generation", "encoder", "BERT encoder reused as a decoder for EncoderDecoderModel (is_decoder=True)")
_set_class("xlm", "encoder", "XLM's LM head is an MLM head by default; causal only with config.causal=True")
_set_class("xlnet", "encoder", "permutation LM with two-stream (content/query) attention over the whole context; "
           "causality only via perm_mask")
_set_class(["mamba", "mamba2", "falcon_mamba"], "attention-free", "every layer is a Mamba selective-state-space mixer")
_set_class("rwkv", "attention-free", "every layer is an RWKV time-mix (linear recurrence) + channel-mix block")
_set_class("xlstm", "attention-free", "every layer is an mLSTM block (matrix-memory recurrent cell)")

_HYBRID_REASONS = {
    "bailing_hybrid": "layer_types mixes full_attention and linear_attention (gated delta/forget-gate linear attention)",
    "bamba": "Mamba2 layers with softmax attention at attn_layer_indices",
    "falcon_h1": "every layer runs a Mamba2 mixer and softmax attention in parallel",
    "granitemoehybrid": "layer_types mixes mamba (Mamba2) and attention layers",
    "jamba": "one softmax-attention layer every attn_layer_period, Mamba elsewhere",
    "kimi_linear": "layer_types mixes full_attention (MLA) and linear_attention (Kimi delta attention)",
    "lara_mini": "layer_types mixes full/sliding attention with linear_attention (gated delta net)",
    "lfm2": "short-convolution layers with softmax attention at full_attn_idxs",
    "lfm2_moe": "short-convolution layers with softmax attention at full_attn_idxs (MoE MLPs)",
    "lfm3": "layer_types mixes conv (short convolution), sliding and full attention",
    "minimax": "layer_types mixes lightning linear_attention with full softmax attention",
    "nemotron_h": "layers_block_type mixes Mamba2, attention, MLP and MoE blocks",
    "olmo_hybrid": "layer_types mixes full_attention with gated-delta-net linear_attention",
    "qwen3_5": "Qwen3.5 text model: gated-delta-net linear_attention layers with full gated attention every 4th",
    "qwen3_5_text": "gated-delta-net linear_attention layers with full gated attention every 4th",
    "qwen3_5_moe": "Qwen3.5-MoE text model: gated-delta-net linear attention with full attention every 4th",
    "qwen3_5_moe_text": "gated-delta-net linear attention with full attention every 4th",
    "qwen3_next": "gated-delta-net linear_attention layers with full gated attention every 4th",
    "qwen4_exp": "Qwen4-exp text model: indexed (sparse) attention layers between linear_attention layers",
    "qwen4_exp_text": "indexed (sparse) attention layers between linear_attention layers",
    "recurrent_gemma": "block_types alternates RG-LRU recurrent blocks with local softmax attention",
    "zamba": "Mamba layers with one shared softmax-attention block applied every few layers (hybrid layers)",
    "zamba2": "Mamba2 layers with shared softmax-attention blocks at hybrid_layer_ids",
}
for _t, _r in _HYBRID_REASONS.items():
    _set_class(_t, "hybrid", _r)

_MULTIMODAL_REASONS = {
    "fuyu": "Persimmon text decoder with a linear image-patch embedding (vision_embed_tokens) in the causal-LM class",
    "gemma3": "Gemma3ForConditionalGeneration: Gemma 3 text decoder + SigLIP vision tower + projector",
    "gemma3n": "Gemma3nForConditionalGeneration: Gemma 3n text decoder + MobileNetV5 (timm) vision + Conformer audio",
    "gemma4": "Gemma4ForConditionalGeneration wrapper around the Gemma 4 text decoder (the default config has no "
              "vision/audio sub-config, so the wrapper builds the text model only)",
    "gemma4_unified": "Gemma4UnifiedForConditionalGeneration wrapper around the Gemma 4 text decoder (no vision/audio "
                      "sub-config by default)",
    "git": "GIT: a text decoder whose input is prefixed by CLIP image features (vision encoder built in)",
    "got_ocr2": "GOT-OCR2: Qwen2 text decoder + SAM-style vision encoder + conv projector",
    "moss_transcribe_diarize": "Qwen3 text decoder with an audio encoder and projector (speech transcription)",
    "phi4_multimodal": "Phi-4 text decoder with image (SigLIP) and audio (Conformer) embedding modules in the causal-LM "
                       "class",
}
_COMPOSITE_TEXT_ONLY = {
    "dots3_note": "composite text+vision+audio config, but Dots3NoteForCausalLM builds only the text decoder "
                  "(MLA/DSA indexed attention + sliding attention, MoE)",
    "emu3": "composite text + VQ-VAE config; Emu3ForCausalLM is the text decoder over a joint text/image-token "
            "vocabulary (no vision module built)",
    "llama4": "composite text + vision config; Llama4ForCausalLM builds only the text decoder (chunked attention with "
              "NoPE every 4th layer, MoE)",
    "mllama": "Llama 3.2 Vision text decoder built alone: self-attention layers plus cross-attention layers that are "
              "skipped without image features",
    "moshi": "Moshi's temporal text-token decoder; the Mimi codec and depth decoder in its config are not built",
}
for _t, _r in _COMPOSITE_TEXT_ONLY.items():
    _set_class(_t, "decoder", _r)
for _t, _r in _MULTIMODAL_REASONS.items():
    _set_class(_t, "multimodal-decoder", _r)
_set_class(["gemma4_assistant", "gemma4_unified_assistant"], "decoder",
           "Gemma 4 multi-token-prediction drafter: a Gemma 4 text stack in which every layer reuses the target "
           "model's KV (num_kv_shared_layers == num_hidden_layers); forward ignores input_ids and needs the target's "
           "inputs_embeds and shared_kv_states")


_DECODER_NOTES = {
    "reformer": "causal LM (is_decoder=True) whose layers alternate chunked local attention and LSH (hashed-bucket) "
                "attention; both are softmax attention, computed by Reformer's own code",
    "blt": "Byte Latent Transformer: byte-level local encoder/decoder (causal, with cross-attention to patches) around "
           "a causal global transformer over entropy-defined patches (a small entropy-model 'patcher' is built in)",
    "cpmant": "CPM-Ant: causal attention with a learned relative-position bias and prompt tokens",
    "hrm_text": "hierarchical reasoning model: causal attention layers applied in nested H/L recurrent cycles",
    "dory": "causal sliding/full attention; the middle layers are looped n_recurrent_loops times",
    "zaya": "causal softmax attention on convolution-compressed q/k (CCA); the 'hybrid' layer type names its conv state",
    "inkling_text": "causal sliding/full softmax attention with relative-position logits and short convolutions",
    "inkling2_text": "causal sliding/full softmax attention with a relative position bias, per-token sink logits and "
                     "short convolutions; block attention residuals mix earlier layers' outputs",
    "inkling2_loop_text": "Inkling2 with a block of layers looped loop_num_passes times",
    "gpt_neo": "causal attention alternating global and local (windowed) layers",
}
for _t, _r in _DECODER_NOTES.items():
    CLASS_REASONS.setdefault(_t, _r)


def classify(model_type: str) -> str:
    """The kind of model ``model_type`` is; ``CLASS_REASONS[model_type]`` says why.

    ``"decoder"`` (every type not listed elsewhere): a stack of causal softmax self-attention
    layers, whatever the MLP (dense or MoE) and attention variant (GQA, MLA, sliding, sparse).
    """
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise KeyError(f"{model_type!r} is not a causal-LM model type")
    return CLASSES.get(model_type, "decoder")


for _t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
    if _t not in CLASSES:
        CLASS_REASONS.setdefault(_t, "causal softmax self-attention in every layer")

# --------------------------------------------------------------------------------------------
# Generic shrinking
# --------------------------------------------------------------------------------------------


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
    if key in _FFN_KEYS:
        return FFN if value > 0 else value
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


# --------------------------------------------------------------------------------------------
# Per-type overrides (applied to the generic overrides; nested dicts merge)
# --------------------------------------------------------------------------------------------

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

    The generic rules (:func:`_shrink`, applied to sub-configs too): vocab 128, with special-token
    ids that fall outside it moved to distinct ids at its top (127, 126, ...) rather than growing
    the vocabulary; hidden 64; FFN 128 (MoE experts 32); 4 heads, 2 KV heads where the defaults
    use GQA (MQA stays 1, MHA stays 4); head_dim 16 (MLA: nope 16, rope 8, v 16, LoRA ranks 32);
    4 experts, top-2, 1 shared; 256 positions; windows 8; per-layer lists cut to the shortest
    prefix that still holds every layer kind (2 layers at least, see :func:`_layer_plan`), index
    lists re-indexed; fields the config derives in ``__post_init__`` are left for it to derive;
    rope parameters resized (mrope sections, longrope factors). Then ``OVERRIDES[model_type]``.
    """
    cls = CONFIG_MAPPING[model_type]
    kwargs = tiny_overrides(model_type)
    config = cls(**kwargs)
    return config


def _quiet():
    """Silence transformers' warnings for the duration (they are about the random configs)."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    stack.callback(logger.setLevel, level)
    return stack


def count_parameters_meta(config) -> int:
    """Parameter count of the model ``config`` builds, on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    return sum(p.numel() for p in model.parameters())


def build_tiny(model_type: str, seed: int = 0):
    """A tiny random float32 eval-mode model of ``model_type`` with eager attention."""
    config = tiny_config(model_type)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model = model.float().eval()
    return model


def vocab_of(model) -> int:
    """The text vocabulary size (the range random ids are drawn from, and the logits' last size)."""
    config = model.config.get_text_config(decoder=True)
    vocab = getattr(config, "vocab_size", None)
    if _is_int(vocab):
        return vocab
    return int(model.get_input_embeddings().num_embeddings)


#: why the types that still fail cannot be fixed from the config alone (checked against the modeling files).
KNOWN_FAILURES: dict[str, str] = {
    "gemma3n": "Gemma3nForConditionalGeneration always builds its vision tower as a TimmWrapperModel (MobileNetV5, "
               "vision_config is a TimmWrapperConfig), which imports timm; timm is not installed here and nothing can "
               "be downloaded. The text part alone (gemma3n_text) builds and runs.",
    "gemma4_assistant": "a multi-token-prediction drafter: Gemma4AssistantForCausalLM.forward ignores input_ids and "
                        "raises unless given the target model's inputs_embeds (2 x backbone_hidden_size) and "
                        "shared_kv_states; it does not run from input_ids alone",
    "gemma4_unified_assistant": "same drafter design as gemma4_assistant (needs the target's inputs_embeds and "
                                "shared_kv_states)",
    "musicgen": "MODEL_FOR_CAUSAL_LM maps musicgen to MusicgenForCausalLM, which takes a MusicgenDecoderConfig "
                "(model_type musicgen_decoder), but CONFIG_MAPPING['musicgen'] is the composite MusicgenConfig "
                "(text encoder + audio codec + decoder): from_config fails reading decoder attributes (dropout) off "
                "the composite config",
    "musicgen_melody": "same mapping mismatch as musicgen (MusicgenMelodyForCausalLM needs MusicgenMelodyDecoderConfig)",
}


def _logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0]


def check(model_type: str, *, max_params_meta: int = 20_000_000) -> dict[str, Any]:
    """Build one type and run a forward pass of random ids; every failure is caught into the result.

    What sinkscope then finds in the model (its attention path, learned sink, hook points) is the
    conformance matrix's (``matrix.py``), which reads it through ``capture.discover``.
    """
    row: dict[str, Any] = {"type": model_type, "class": classify(model_type), "reason": CLASS_REASONS[model_type]}
    if model_type in KNOWN_FAILURES:
        row["known_failure"] = KNOWN_FAILURES[model_type]
    t0 = time.perf_counter()
    try:
        with _quiet():
            config = tiny_config(model_type)
    except Exception as exc:  # noqa: BLE001
        row.update(build="failed", error=f"config: {type(exc).__name__}: {_short(exc)}")
        return row
    try:
        with _quiet():
            meta = count_parameters_meta(config)
        row["params_meta"] = meta
        if meta > max_params_meta:
            row.update(build="failed", error=f"too big: {meta} parameters on the meta device")
            return row
    except Exception:  # noqa: BLE001
        pass
    try:
        with _quiet():
            model = build_tiny(model_type)
    except Exception as exc:  # noqa: BLE001
        row.update(build="failed", error=f"build: {type(exc).__name__}: {_short(exc)}")
        return row
    row.update(build="ok", build_seconds=round(time.perf_counter() - t0, 3), model_class=type(model).__name__,
               params=sum(p.numel() for p in model.parameters()))
    vocab = row["vocab"] = vocab_of(model)
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    try:
        with _quiet(), torch.no_grad():
            t1 = time.perf_counter()
            logits = _logits(model(input_ids=ids, use_cache=False))
            row["forward_seconds"] = round(time.perf_counter() - t1, 3)
        ok_shape = tuple(logits.shape) == (2, 12, vocab)
        row["forward"] = "ok" if ok_shape and bool(torch.isfinite(logits).all()) else (
            "non-finite logits" if ok_shape else f"shape {tuple(logits.shape)} != {(2, 12, vocab)}")
    except Exception as exc:  # noqa: BLE001
        row.update(forward="failed", error=f"forward: {type(exc).__name__}: {_short(exc)}")
    row["config_overrides"] = json.loads(json.dumps(tiny_overrides(model_type), default=str))
    return row


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300]


def main(argv: list[str] | None = None) -> int:
    """``python -m sinkscope.conformance.tiny OUT.json [TYPE ...]``: build and run every type, one line each."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m sinkscope.conformance.tiny OUT.json [TYPE ...]", file=sys.stderr)
        return 2
    out_path, only = argv[0], argv[1:]
    torch.set_num_threads(1)
    rows = []
    for t in only or model_types():
        row = check(t)
        rows.append(row)
        status = f"fwd {row.get('forward')} {row.get('params', '')}p" if row.get("build") == "ok" else "build FAILED"
        print(f"{t:<26} {row['class']:<18} {status} {row.get('error', '')}", flush=True)
    must = {"decoder", "hybrid", "multimodal-decoder"}
    failed = {r["type"]: {"error": r.get("error") or r.get("forward"), "why": r.get("known_failure")}
              for r in rows if r["class"] in must and (r.get("build") != "ok" or r.get("forward") != "ok")}
    summary = {"transformers": transformers.__version__, "torch": torch.__version__, "n_types": len(model_types()),
               "ok": len(rows) - len(failed), "failed": failed, "types": {r["type"]: r for r in rows}}
    with open(out_path, "w") as fh:
        json.dump(summary, fh, indent=1, default=str)
    print(json.dumps({k: summary[k] for k in ("ok", "failed")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
