"""Tiny random models of every supported family, built from transformers config classes.

Sizes follow transformers' own testers (hidden 64, 4 heads), with 3 layers so that every
``sink_rate_from_layer`` row (``layer_start`` 2) and a layer between two others are exercised. Every builder is seeded
so a test gets the same weights each time. ``build(family)`` returns an eval-mode float32
model whose attention implementation is eager (the reference for every comparison).
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma3TextConfig,
    Gemma3ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

VOCAB = 512


def _configs():
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  max_position_embeddings=512)
    return {
        "llama": (LlamaForCausalLM, LlamaConfig(**common, num_key_value_heads=2, intermediate_size=128)),
        "mistral": (MistralForCausalLM, MistralConfig(**common, num_key_value_heads=2, intermediate_size=128,
                                                       sliding_window=None)),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(**common, num_key_value_heads=2, intermediate_size=128)),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(**common, num_key_value_heads=2, intermediate_size=128,
                                                 head_dim=16)),
        "gemma3_text": (Gemma3ForCausalLM, Gemma3TextConfig(
            **common, num_key_value_heads=2, intermediate_size=128, head_dim=16, sliding_window=8,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=16)),
        "gpt_neox": (GPTNeoXForCausalLM, GPTNeoXConfig(**common, intermediate_size=256, rotary_pct=0.25,
                                                        use_parallel_residual=True)),
        "gpt2": (GPT2LMHeadModel, GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=512,
                                             bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)),
        "gpt_oss": (GptOssForCausalLM, GptOssConfig(
            **common, num_key_value_heads=2, head_dim=16, intermediate_size=64, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 150000.0})),
        "qwen3_next": (Qwen3NextForCausalLM, Qwen3NextConfig(
            **common, num_key_value_heads=2, head_dim=16, intermediate_size=128, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            layer_types=["linear_attention", "full_attention", "full_attention"])),
    }


FAMILY_NAMES = sorted(_configs())


class Paths:
    """Where a family keeps its parts, written out by hand from its modeling file (the reference
    the capture's discovery is tested against: ``discover.Parts`` must find exactly these)."""

    def __init__(self, layers, ln1="input_layernorm", attention="self_attn", out_proj="self_attn.o_proj",
                 attn_out="self_attn", ln2="post_attention_layernorm", parallel=False, mlp_pre="mlp.gate_proj",
                 mlp_pre_linear="mlp.up_proj", out_proj_conv1d=False):
        self.layers, self.ln1, self.attention, self.out_proj, self.attn_out = layers, ln1, attention, out_proj, attn_out
        self.ln2, self.parallel, self.mlp_pre, self.mlp_pre_linear = ln2, parallel, mlp_pre, mlp_pre_linear
        self.out_proj_conv1d = out_proj_conv1d


#: the parts of each tiny family (the table sinkscope kept before it found them itself).
PATHS = {
    "llama": Paths("model.layers"),
    "mistral": Paths("model.layers"),
    "qwen2": Paths("model.layers"),
    "qwen3": Paths("model.layers"),
    "gemma3_text": Paths("model.layers", attn_out="post_attention_layernorm", ln2="pre_feedforward_layernorm"),
    "gpt_neox": Paths("gpt_neox.layers", attention="attention", out_proj="attention.dense",
                      attn_out="post_attention_dropout", parallel=True, mlp_pre="mlp.dense_h_to_4h",
                      mlp_pre_linear=None),  # use_parallel_residual=True in the tiny config
    "gpt2": Paths("transformer.h", ln1="ln_1", attention="attn", out_proj="attn.c_proj", attn_out="attn", ln2="ln_2",
                  mlp_pre="mlp.c_fc", mlp_pre_linear=None, out_proj_conv1d=True),
    "gpt_oss": Paths("model.layers", mlp_pre=None, mlp_pre_linear=None),
    "qwen3_next": Paths("model.layers", mlp_pre=None, mlp_pre_linear=None),
}


def build(family: str, seed: int = 0) -> torch.nn.Module:
    """A tiny eval-mode float32 model of ``family`` with eager attention."""
    cls, config = _configs()[family]
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.set_attn_implementation("eager")
    if family == "gpt_oss":  # give the phantom real weight so its mass is far from zero
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.copy_(torch.linspace(-1.0, 2.0, layer.self_attn.sinks.numel()))
    return model


def random_ids(batch: int = 2, length: int = 24, seed: int = 0) -> torch.Tensor:
    """(batch, length) random token ids."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=g)
