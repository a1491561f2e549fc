"""What kind of model each causal-LM type transformers knows is, and why (the classification table).

* :func:`model_types`: every key of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``, sorted;
* :func:`classify` says what kind of model a type is (``CLASSES``: decoder, hybrid, multimodal decoder,
  encoder-decoder, encoder, attention-free), with the reason in ``CLASS_REASONS``.

Nothing here builds a config or a model; ``tiny.py`` (the entry point) re-exports these names.
"""

from __future__ import annotations

from typing import Any

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

__all__ = ["CLASSES", "CLASS_REASONS", "classify", "model_types"]


def model_types() -> list[str]:
    """Every causal-LM model type of the installed transformers, sorted."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


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
