#!/usr/bin/env python3
"""Build the tiny random-weight model fixtures that the `nn` crate's parity tests read.

Pinned reference stack (the versions the committed fixtures were generated with):

    torch        == 2.15.0
    transformers == 5.24.0
    safetensors  == 0.8.0
    numpy        == 2.4.6
    optional, for the cross-check recorded in golden.json:
    mlx[cpu]     == 0.32.4
    mlx-lm       == 0.32.2

This script is run by hand, once, by whoever changes a fixture; CI never runs it and never
installs torch. Setup and usage are in scripts/README.md:

    python3 -m venv ~/.cache/mlxkit/fixtures-venv
    ~/.cache/mlxkit/fixtures-venv/bin/pip install torch==2.15.0 transformers==5.24.0 \
        safetensors numpy "mlx[cpu]==0.32.4" mlx-lm==0.32.2
    ~/.cache/mlxkit/fixtures-venv/bin/python scripts/make_fixtures.py [name ...]

For every fixture it writes, under nn/tests/fixtures/<name>/:

    config.json               exactly as transformers' save_pretrained writes it (never edited)
    config.transformers4.json the same configuration in the older transformers-4 spelling
                              (`rope_theta` / `rope_local_base_freq` at top level instead of
                              `rope_parameters`, `num_experts` for `num_local_experts`), for
                              testing config readers against both; same weights
    generation_config.json    as save_pretrained writes it
    model.safetensors         f32 weights in the checkpoint layout save_pretrained writes
    logits.safetensors        one f32 tensor `logits` of shape [seq, vocab]: the model's
                              output for every position of the prompt
    golden.json               prompt ids, versions, seed, dtype, summary numbers

The weights are drawn with a larger spread than transformers' default initialisation so the
logits are far from uniform and an implementation bug shows up as a large error rather than
hiding under 1e-5.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import tempfile
from pathlib import Path

import gguf
import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "nn" / "tests" / "fixtures"

SEED = 0
MAX_SEED_TRIES = 50
# Smallest accepted gap between the k-th and (k+1)-th router log-probabilities.
MIN_ROUTER_MARGIN = 1e-3
# Largest accepted distance between the f32 reference and the same model in f64. The parity
# tests compare two f32 implementations within 1e-4; a fixture where f32 rounding alone moves
# the reference by more than this (a norm renormalizing a near-zero vector, say) would make
# that comparison a coin toss, so such draws are rejected like near-tied routers. Recurrent
# fixtures are exempt: their tolerance is derived from the reference's own disagreement.
MAX_REFERENCE_ROUNDING = 3e-5
VOCAB = 512
HIDDEN = 64
INTERMEDIATE = 128
MAX_POSITIONS = 256

# A fixed prompt of 24 ids: the family's BOS id (replaced per fixture) followed by 23 ids
# drawn once from a seeded generator. Gemma's sliding window (8) is shorter than this, so
# sliding layers really drop old keys.
PROMPT_TAIL = [int(x) for x in np.random.RandomState(1234).randint(3, VOCAB, size=23)]


# ---------------------------------------------------------------------------------------------
# Fixture definitions
#
# Rope bases differ between fixtures and from the common library defaults (1e4, 1e6), so a
# config reader that misses the rope base and falls back to a default gives wrong logits.
# ---------------------------------------------------------------------------------------------


def llama_config(tied: bool) -> transformers.LlamaConfig:
    # SmolLM2 style: grouped-query attention, rope base 1e5, no biases.
    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
    )


def llama3_config() -> transformers.LlamaConfig:
    # Llama 3.1's rope scaling: low frequencies stretched 8×, high ones kept, a ramp between,
    # over a 64-position "original" context so that every regime has frequencies in it.
    config = llama_config(tied=False)
    config.rope_parameters = {
        "rope_type": "llama3",
        "rope_theta": 100000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return config


def qwen2_config() -> transformers.Qwen2Config:
    # Qwen2 always has q/k/v biases (and none on o_proj); the small Qwen2 models tie the head.
    return transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 300000.0},
        use_sliding_window=False,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )


def qwen3_config() -> transformers.Qwen3Config:
    # Qwen3: per-head RMS norm on q and k, head_dim decoupled from hidden/heads (4*32 != 64),
    # untied head.
    return transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        attention_bias=False,
        use_sliding_window=False,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def qwen3_moe_config() -> transformers.Qwen3MoeConfig:
    # A real mixture of experts: 4 experts, 2 chosen per token, renormalised top-k weights,
    # every layer sparse.
    return transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        attention_bias=False,
        use_sliding_window=False,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def gemma3_config() -> transformers.Gemma3TextConfig:
    # Gemma 3 text: layers alternate sliding (window 8 < 24-token prompt) and global attention
    # with different rope bases (not the usual 1e6 / 1e4, so a reader that falls back to
    # defaults fails); query_pre_attn_scalar differs from head_dim so a wrong
    # attention scale shows; the final softcap is small enough to bend the logits.
    return transformers.Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 400000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
        },
        query_pre_attn_scalar=32,
        sliding_window=8,
        sliding_window_pattern=2,
        final_logit_softcapping=10.0,
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )


def gemma3_llama_cpp_config() -> transformers.Gemma3TextConfig:
    # Gemma 3 as llama.cpp can read it from a GGUF file: it derives the attention scale from
    # the head width (so query_pre_attn_scalar = head_dim) and, for files that do not list the
    # layer kinds, makes every sixth layer global. Rope bases still differ from the defaults.
    config = gemma3_config()
    config.num_hidden_layers = 6
    config.layer_types = ["sliding_attention"] * 5 + ["full_attention"]
    config.sliding_window_pattern = 6
    config.query_pre_attn_scalar = config.head_dim
    return config


def qwen3_5_config() -> transformers.Qwen3_5TextConfig:
    # Qwen3.5 text: a hybrid of gated delta net layers (linear attention with a recurrent state)
    # and gated full attention, three to one. Value heads outnumber key heads (2 key heads serve
    # 4 value heads) and the value head width differs from the key head width, so a transposed
    # state or a wrong head grouping shows; rope turns only a quarter of each attention head.
    return transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 700000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def qwen3_5_moe_config() -> transformers.Qwen3_5MoeTextConfig:
    # Qwen3.5-MoE text: the hybrid above with every feed-forward a mixture of experts (top-2 of
    # 4, always renormalized) beside a shared expert scaled by a sigmoid gate.
    return transformers.Qwen3_5MoeTextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 800000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def qwen3_next_config() -> transformers.Qwen3NextConfig:
    # Qwen3-Next: the same hybrid with the delta net's projections stored interleaved per key
    # head (`in_proj_qkvz`, `in_proj_ba`); layer 2 keeps a dense MLP (`mlp_only_layers`) and
    # the top-k router weights are not renormalized, so both settings change the numbers.
    return transformers.Qwen3NextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 900000.0, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        decoder_sparse_step=1,
        mlp_only_layers=[2],
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def qwen3_next_llama_cpp_config() -> transformers.Qwen3NextConfig:
    # Qwen3-Next as llama.cpp can read it from a GGUF file: every layer sparse (it has no
    # tensors for a dense one), the top-k weights renormalized (fixed), value heads as wide as
    # key heads (it sizes them by the key width) — all three as in Qwen3-Next-80B; every fourth
    # layer attends, as it assumes when the file does not say.
    config = qwen3_next_config()
    config.mlp_only_layers = []
    config.norm_topk_prob = True
    config.linear_value_head_dim = config.linear_key_head_dim
    return config


def lfm2_config() -> transformers.Lfm2Config:
    # LFM2: gated short convolutions (kernel 3) beside attention layers with per-head q/k
    # norms; the MLP width is adjusted from intermediate_size (192 -> 2/3 -> x1.1 -> rounded up
    # to a multiple of 32 = 160), so a reader that skips the adjustment loads nothing; biases on
    # the convolution block so each one counts.
    return transformers.Lfm2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=192,
        block_auto_adjust_ff_dim=True,
        block_ffn_dim_multiplier=1.1,
        block_multiple_of=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 600000.0},
        conv_bias=True,
        conv_L_cache=3,
        layer_types=["conv", "conv", "full_attention", "conv"],
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def mistral_config() -> transformers.MistralConfig:
    # Mistral 7B v0.1 style: llama's layout with every layer attending to a sliding window
    # (8, under the 24-token prompt), head_dim set apart from hidden / heads.
    return transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 250000.0},
        sliding_window=8,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def mistral_llama_cpp_config() -> transformers.MistralConfig:
    # Mistral as llama.cpp can read it from a GGUF file: its converter files Mistral as plain
    # Llama and drops the sliding window, so this one attends to every earlier token (as Mistral
    # 7B from v0.2 on does); head_dim still differs from hidden / heads.
    config = mistral_config()
    config.sliding_window = None
    return config


def mixtral_config() -> transformers.MixtralConfig:
    # Mixtral: Mistral with a sparse feed-forward, top-2 of 4 experts, renormalized softmax
    # weights; no sliding window.
    return transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 350000.0},
        sliding_window=None,
        num_local_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def gemma2_config() -> transformers.Gemma2Config:
    # Gemma 2: sliding (window 8) and global layers alternating, soft caps on attention logits
    # (15) and output logits (10), sandwich norms stored as w - 1, query_pre_attn_scalar 32
    # against head_dim 16, embeddings scaled by sqrt(hidden), GeLU-tanh.
    return transformers.Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        query_pre_attn_scalar=32,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        final_logit_softcapping=10.0,
        attn_logit_softcapping=15.0,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )


def gemma2_llama_cpp_config() -> transformers.Gemma2Config:
    # Gemma 2 as llama.cpp can read it from a GGUF file: its converter writes no rope base (so
    # 10 000 is used) and its loader derives the attention scale from the head width (so
    # query_pre_attn_scalar = head_dim) and makes even layers sliding, as here already.
    config = gemma2_config()
    config.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    config.query_pre_attn_scalar = config.head_dim
    return config


def olmo2_config() -> transformers.Olmo2Config:
    # OLMo 2: norms after attention and after the MLP (none before), q/k norms over the whole
    # projection rather than per head.
    return transformers.Olmo2Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 450000.0},
        attention_bias=False,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def phi3_config() -> transformers.Phi3Config:
    # Phi-3: fused qkv_proj (queries, keys, values stacked) and gate_up_proj (gate, then up);
    # full rotary and no scaling, as Phi-3-mini-4k has; untied.
    return transformers.Phi3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        original_max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 550000.0},
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def deepseek_v3_config() -> transformers.DeepseekV3Config:
    # DeepSeek-V3: multi-head latent attention (queries through a rank-32 bottleneck, a
    # 24-wide latent, 8-wide interleaved rotary keys, nope 16 / value 12 so every width
    # differs) and sigmoid routing with a correction bias over the best 1 of 2 groups of 4
    # experts, top-2, scaled by 2.5, one shared expert; layer 0 dense.
    return transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=8,
        routed_scaling_factor=2.5,
        kv_lora_rank=24,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        v_head_dim=12,
        qk_nope_head_dim=16,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 650000.0},
        rope_interleave=True,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def glm4_moe_lite_config() -> transformers.Glm4MoeLiteConfig:
    # GLM-4-MoE-Lite: the same attention with queries projected directly (no q_lora_rank) and
    # rotary embeddings in halves, layer kinds from mlp_layer_types, a single expert group.
    return transformers.Glm4MoeLiteConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=4,
        routed_scaling_factor=1.8,
        kv_lora_rank=24,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        v_head_dim=20,
        qk_nope_head_dim=16,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 750000.0},
        rope_interleave=False,
        mlp_layer_types=["sparse", "dense"],
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def glm4_moe_lite_llama_cpp_config() -> transformers.Glm4MoeLiteConfig:
    # GLM-4-MoE-Lite as llama.cpp reads a GGUF file of it (its deepseek2): the rope turns
    # adjacent pairs and the converter permutes nothing, so rope_interleave (GLM-4.7-Flash's
    # setting); only leading layers can be dense, so the first (first_k_dense_replace, as
    # GLM-4.7-Flash states it); one epsilon serves every norm, the latent ones included, so
    # 1e-6 (which transformers fixes for those); and experts are scored by sigmoid only where
    # the file says so, which the converter writes from `scoring_func` (without it llama.cpp
    # takes softmax, unless the model has GLM-4.7-Flash's 47 or 48 layers and 154,880 tokens).
    # Queries stay projected directly (no q_lora_rank), as in DeepSeek-V2-Lite: llama.cpp
    # recognises such a model by its 26 or 27 layers (and would ask this one for the rank),
    # mlxkit by the rank's absence from the file.
    config = glm4_moe_lite_config()
    config.rope_interleave = True
    config.mlp_layer_types = ["dense", "sparse"]
    config.first_k_dense_replace = 1
    config.rms_norm_eps = 1e-6
    config.scoring_func = "sigmoid"
    return config


def gpt_oss_config() -> transformers.GptOssConfig:
    # gpt-oss: attention sinks per head, sliding (window 8) and full layers alternating, biases
    # on every projection, YaRN without truncation (factor 4 over 64 original positions, so
    # the ramp's fractional ends matter), and a mixture of experts with biases, interleaved
    # gate/up columns, a clamped SwiGLU (limit 1.5, low enough to clip) and a softmax over the
    # top-2 logits.
    return transformers.GptOssConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "original_max_position_embeddings": 64,
            "truncate": False,
        },
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
        swiglu_limit=1.5,
        attention_bias=True,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


def gpt_oss_llama_cpp_config() -> transformers.GptOssConfig:
    # gpt-oss as llama.cpp can read it from a GGUF file: its SwiGLU limit is fixed at 7.0 and
    # its YaRN rounds the ramp's ends, so this one clamps at 7.0 and has plain rope.
    config = gpt_oss_config()
    config.swiglu_limit = 7.0
    config.rope_parameters = {"rope_type": "default", "rope_theta": 150000.0}
    return config


def nemotron_h_config() -> transformers.NemotronHConfig:
    # Nemotron-H: Mamba-2 mixers (4 heads of 8 sharing 2 groups of a 16-wide state, a 4-tap
    # convolution with bias, a gated norm in 2 groups), attention without positions, and a
    # squared-ReLU MLP, each its own block behind one pre-norm.
    return transformers.NemotronHConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        layers_block_type=["linear_attention", "mlp", "full_attention", "linear_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_POSITIONS,
        intermediate_size=INTERMEDIATE,
        mlp_hidden_act="relu2",
        ssm_state_size=16,
        mamba_num_heads=4,
        mamba_head_dim=8,
        n_groups=2,
        conv_kernel=4,
        use_conv_bias=True,
        chunk_size=16,
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def granitemoehybrid_config() -> transformers.GraniteMoeHybridConfig:
    # Granite 4 hybrid: Mamba-2 mixers and rope-less attention, each layer followed by a
    # mixture of experts (top-2 of 4, softmax over the top-2) beside a shared MLP; muP
    # multipliers on the embeddings (12), the residual branches (0.22), the attention logits
    # (1/8 instead of head_dim^-1/2) and the output logits (divided by 4).
    return transformers.GraniteMoeHybridConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        shared_intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.125,
        logits_scaling=4.0,
        num_local_experts=4,
        num_experts_per_tok=2,
        position_embedding_type="nope",
        layer_types=["mamba", "attention", "mamba"],
        mamba_n_heads=4,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_head=32,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_conv_bias=True,
        mamba_proj_bias=False,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def mistral3_config() -> transformers.Mistral3Config:
    # Mistral 3 (Mistral Small 3.1 style): a Mistral text decoder inside a multimodal
    # checkpoint, with a tiny Pixtral vision tower and projector whose weights a text-only
    # load sets aside; weights under `model.language_model.` and `lm_head`.
    text = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000000.0},
        sliding_window=None,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = transformers.PixtralVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        head_dim=16,
    )
    config = transformers.Mistral3Config(
        vision_config=vision, text_config=text, tie_word_embeddings=False
    )
    config.bos_token_id = 1
    return config


def llama4_config() -> transformers.Llama4TextConfig:
    # Llama 4 text: layers 0-2 turn queries and keys in interleaved pairs, normalize them and
    # attend within chunks of 8 positions (under the 24-token prompt); layer 3 has no
    # positions and tunes its query temperature (floor_scale 4, attn_scale 0.5, so it changes
    # within the prompt); layers 1 and 3 route each token to 2 of 4 experts, scaling their
    # inputs by the router's sigmoid, beside a shared expert; the others are dense and wider.
    return transformers.Llama4TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=32,
        intermediate_size_mlp=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        num_local_experts=4,
        num_experts_per_tok=2,
        interleave_moe_layer_step=2,
        use_qk_norm=True,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        no_rope_layer_interval=4,
        attention_chunk_size=8,
        attn_temperature_tuning=True,
        floor_scale=4,
        attn_scale=0.5,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def llama4_llama_cpp_config() -> transformers.Llama4TextConfig:
    # Llama 4 as llama.cpp can read it from a GGUF file: it fixes the chunks at 8,192
    # positions and the temperature tuning at a floor of 8,192 and a scale of 0.1 (both
    # invisible under the 24-token prompt), so this one checks the rest: interleaved rope with
    # weightless q/k norms, the position-free fourth layer, experts with scaled inputs beside a
    # shared expert.
    config = llama4_config()
    config.attention_chunk_size = 8192
    config.floor_scale = 8192
    config.attn_scale = 0.1
    return config


def nemotron_h_moe_config() -> transformers.NemotronHConfig:
    # Nemotron 3 style: the hybrid with mixture-of-experts blocks (E): sigmoid routing with a
    # correction bias, top-2 of 4 ungated squared-ReLU experts behind a 32-wide latent
    # projection, scaled by 2.5, beside a shared expert of width 48.
    return transformers.NemotronHConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        layers_block_type=["linear_attention", "moe", "full_attention", "moe"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_POSITIONS,
        intermediate_size=INTERMEDIATE,
        mlp_hidden_act="relu2",
        ssm_state_size=16,
        mamba_num_heads=4,
        mamba_head_dim=8,
        n_groups=2,
        conv_kernel=4,
        use_conv_bias=True,
        chunk_size=16,
        layer_norm_epsilon=1e-5,
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
        n_shared_experts=1,
        moe_latent_size=32,
        routed_scaling_factor=2.5,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


GEMMA4_ROPE = {
    # Sliding layers rotate every feature; full layers use "proportional" rope: a quarter of
    # each (wider) head turns, at frequencies spaced as if the whole head did.
    "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 300000.0},
}


def gemma4_config() -> transformers.Gemma4TextConfig:
    # Gemma 4 text, the small ("E2B") layout: full layers have heads twice as wide (32) as the
    # sliding ones (16); the last two layers compute no keys or values of their own but attend
    # over those of the last sliding and the last full layer before them, and their MLPs are
    # twice as wide; every layer adds a per-layer input (a second, narrower embedding of the
    # token mixed with a projection of the first) through a gated bottleneck of 8; norms
    # multiply by w itself (not 1 + w); attention is unscaled (the q/k norms set the scale).
    return transformers.Gemma4TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "sliding_attention",
            "full_attention",
        ],
        sliding_window=8,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters=GEMMA4_ROPE,
        final_logit_softcapping=30.0,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )


def gemma4_moe_config() -> transformers.Gemma4TextConfig:
    # Gemma 4 text, the mixture-of-experts layout ("26B-A4B"): every layer runs its dense MLP
    # and, beside it, 2 of 4 experts chosen by a router that normalizes its input and scales
    # each chosen expert's weight by a learned per-expert factor; full layers take keys as
    # values (`attention_k_eq_v`, one 32-wide key head); no per-layer inputs, no shared keys.
    return transformers.Gemma4TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=8,
        hidden_size_per_layer_input=0,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=32,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters=GEMMA4_ROPE,
        final_logit_softcapping=30.0,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )


FIXTURES = {
    # name: (config factory, model class, gemma-style norms stored as offsets from 1)
    "llama": (lambda: llama_config(tied=True), transformers.LlamaForCausalLM, False),
    "llama_untied": (lambda: llama_config(tied=False), transformers.LlamaForCausalLM, False),
    "llama3": (llama3_config, transformers.LlamaForCausalLM, False),
    "qwen2": (qwen2_config, transformers.Qwen2ForCausalLM, False),
    "qwen3": (qwen3_config, transformers.Qwen3ForCausalLM, False),
    "qwen3_moe": (qwen3_moe_config, transformers.Qwen3MoeForCausalLM, False),
    "gemma3": (gemma3_config, transformers.Gemma3ForCausalLM, True),
    "gemma3_llama_cpp": (gemma3_llama_cpp_config, transformers.Gemma3ForCausalLM, True),
    "qwen3_5": (qwen3_5_config, transformers.Qwen3_5ForCausalLM, True),
    "qwen3_5_moe": (qwen3_5_moe_config, transformers.Qwen3_5MoeForCausalLM, True),
    "qwen3_next": (qwen3_next_config, transformers.Qwen3NextForCausalLM, True),
    "qwen3_next_llama_cpp": (qwen3_next_llama_cpp_config, transformers.Qwen3NextForCausalLM, True),
    "lfm2": (lfm2_config, transformers.Lfm2ForCausalLM, False),
    "mistral": (mistral_config, transformers.MistralForCausalLM, False),
    "mistral_llama_cpp": (mistral_llama_cpp_config, transformers.MistralForCausalLM, False),
    "mixtral": (mixtral_config, transformers.MixtralForCausalLM, False),
    "gemma2": (gemma2_config, transformers.Gemma2ForCausalLM, True),
    "gemma2_llama_cpp": (gemma2_llama_cpp_config, transformers.Gemma2ForCausalLM, True),
    "olmo2": (olmo2_config, transformers.Olmo2ForCausalLM, False),
    "phi3": (phi3_config, transformers.Phi3ForCausalLM, False),
    "deepseek_v3": (deepseek_v3_config, transformers.DeepseekV3ForCausalLM, False),
    "glm4_moe_lite": (glm4_moe_lite_config, transformers.Glm4MoeLiteForCausalLM, False),
    "glm4_moe_lite_llama_cpp": (glm4_moe_lite_llama_cpp_config, transformers.Glm4MoeLiteForCausalLM, False),
    "gpt_oss": (gpt_oss_config, transformers.GptOssForCausalLM, False),
    "gpt_oss_llama_cpp": (gpt_oss_llama_cpp_config, transformers.GptOssForCausalLM, False),
    "nemotron_h": (nemotron_h_config, transformers.NemotronHForCausalLM, False),
    "granitemoehybrid": (granitemoehybrid_config, transformers.GraniteMoeHybridForCausalLM, False),
    "mistral3": (mistral3_config, transformers.Mistral3ForConditionalGeneration, False),
    "llama4": (llama4_config, transformers.Llama4ForCausalLM, False),
    "llama4_llama_cpp": (llama4_llama_cpp_config, transformers.Llama4ForCausalLM, False),
    "nemotron_h_moe": (nemotron_h_moe_config, transformers.NemotronHForCausalLM, False),
    "gemma4": (gemma4_config, transformers.Gemma4ForCausalLM, False),
    "gemma4_moe": (gemma4_moe_config, transformers.Gemma4ForCausalLM, False),
}

# Prompt length per fixture, when not the default 24: a recurrent model's prompt spans more
# than one of transformers' 64-token chunks, so the reference itself carries state across a
# chunk boundary.
PROMPT_LENGTHS = {"qwen3_5": 100, "qwen3_5_moe": 100, "qwen3_next": 100, "qwen3_next_llama_cpp": 100, "lfm2": 40, "nemotron_h": 40, "granitemoehybrid": 40, "nemotron_h_moe": 40}

# Fixtures with recurrent layers, whose decode logits are stored beside the full pass's.
RECURRENT = {
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_next",
    "qwen3_next_llama_cpp",
    "nemotron_h",
    "nemotron_h_moe",
    "granitemoehybrid",
}

# Fixtures drawn under MAX_REFERENCE_ROUNDING. The check came with Gemma 4, whose first draw put
# a near-zero vector under a norm; the fixtures made before it were not redrawn, and their f32
# references sit 4e-6 to 2.3e-5 from f64 where transformers can run them in f64.
CONDITIONING_CHECKED = {
    "gemma4",
    "gemma4_moe",
    "gemma3_llama_cpp",
    "gpt_oss_llama_cpp",
    "llama4_llama_cpp",
    "llama3",
    "gemma2_llama_cpp",
    "mistral_llama_cpp",
    "glm4_moe_lite_llama_cpp",
}


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


def randomize_weights(model: torch.nn.Module, norm_offset: bool) -> None:
    """Overwrite every parameter with draws wide enough to make the logits discriminative.

    Norm weights: for Gemma (which multiplies by 1 + w) centred on 0, elsewhere around 1, so
    both a forgotten norm and a forgotten +1 give large errors. Biases and the router get
    clearly non-zero values.
    """
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.1)
            elif name.endswith("layer_scalar"):
                # Gemma 4 scales each layer's output; 1 would let a forgotten scalar pass.
                buffer.uniform_(0.5, 1.5)
        for name, param in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                # The gated norm multiplies by w itself, even in families whose other norms
                # store offsets from 1.
                param.uniform_(0.5, 1.5)
            elif name.endswith("mixer.D") or name.endswith("mamba.D"):
                param.normal_(0.0, 0.5)
            elif name.endswith("A_log"):
                # Per-head decay rates exp(A_log) in (0.05, 1): the state keeps a real memory
                # across the prompt instead of forgetting within a token or two.
                param.uniform_(0.05, 1.0).log_()
            elif name.endswith("dt_bias"):
                param.normal_(0.0, 0.5)
            elif name.endswith("conv1d.weight"):
                param.normal_(0.0, 0.5)
            elif "norm" in name:
                if norm_offset:
                    param.normal_(0.0, 0.3)
                else:
                    param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.2)
            elif "embed_tokens" in name or "lm_head" in name:
                param.normal_(0.0, 0.5)
            elif name.endswith("e_score_correction_bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith("sinks"):
                param.normal_(0.0, 1.0)
            elif name.endswith("router.scale") or name.endswith("router.per_expert_scale"):
                # Gemma 4's router input scale and per-expert weight scale: multipliers.
                param.uniform_(0.5, 1.5)
            elif (
                name.endswith("mlp.gate.weight")
                or name.endswith("mlp.router.weight")
                or name.endswith("block_sparse_moe.router.weight")
                or name.endswith("feed_forward.router.weight")
                or name.endswith("mixer.gate.weight")
                or name.endswith("router.proj.weight")
            ):
                # MoE router: wide logits so top-k choices are separated by clear margins.
                param.normal_(0.0, 0.5)
            else:
                param.normal_(0.0, 0.15)


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


def incremental_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Logits from token-by-token decode with transformers' own cache: must equal the full pass."""
    past = None
    rows = []
    with torch.no_grad():
        for position, token in enumerate(ids):
            out = model(
                input_ids=torch.tensor([[token]]),
                cache=past,
                use_cache=True,
                position_ids=torch.tensor([[position]]),
            )
            past = out.cache
            rows.append(out.logits[0, -1])
    return torch.stack(rows)


def min_router_margin(model: torch.nn.Module, ids: list[int]) -> float | None:
    """Smallest gap between the k-th and (k+1)-th router log-probability over all tokens and layers.

    A near-tie could make another implementation pick different experts within f32 rounding,
    which would be a flaky test rather than a bug; the fixture is only accepted with a clear gap.
    """
    routers = [
        m
        for n, m in model.named_modules()
        if n.endswith("mlp.gate")
        or n.endswith("mlp.router")
        or n.endswith("block_sparse_moe.router")
        or n.endswith("feed_forward.router")
        or n.endswith("mixer.gate")
        or n.endswith("router.proj")
    ]
    if not routers:
        return None
    k = getattr(model.config, "num_experts_per_tok", None) or model.config.top_k_experts
    margins: list[float] = []

    def hook(_module, inputs, _output):
        hidden = inputs[0].reshape(-1, inputs[0].shape[-1])
        logits = torch.nn.functional.linear(hidden, _module.weight)
        if hasattr(_module, "e_score_correction_bias"):
            # Sigmoid routing chooses by biased scores.
            probs = logits.float().sigmoid() + _module.e_score_correction_bias.float()
        else:
            # In log space: a near-tie is two experts whose logits are close; two tiny
            # probabilities are close in absolute terms without the choice being ambiguous.
            probs = torch.log_softmax(logits.float(), dim=-1)
        top = torch.topk(probs, k + 1, dim=-1).values
        margins.append(float((top[:, k - 1] - top[:, k]).min()))

    handles = [r.register_forward_hook(hook) for r in routers]
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for h in handles:
        h.remove()
    return min(margins)


def reference_rounding(model: torch.nn.Module, ids: list[int], logits: torch.Tensor) -> float:
    """Max |logit| distance between the f32 reference and an f64 copy of the same weights."""
    wide = copy.deepcopy(model).to(torch.float64)
    wide.config._experts_implementation = "eager"
    with torch.no_grad():
        exact = wide(input_ids=torch.tensor([ids])).logits[0]
    return float((logits.double() - exact).abs().max())


def compact_json(value: dict) -> str:
    """Indented JSON with each list of numbers kept on one line, so golden.json stays readable."""
    text = json.dumps(value, indent=2)

    def one_line(match: re.Match) -> str:
        return "[" + ", ".join(item.strip() for item in match.group(1).split(",")) + "]"

    return re.sub(r"\[\s*([-0-9.e+,\s]+?)\s*\]", one_line, text) + "\n"


def transformers4_config(config: dict) -> dict:
    """The same configuration spelled the way transformers 4 wrote it."""
    if config.get("model_type") == "gemma4_text":
        return gemma4_hub_config(config)
    old = {k: v for k, v in config.items() if k != "rope_parameters"}
    rope = config.get("rope_parameters")
    if rope is None:
        pass
    elif "full_attention" in rope:
        # Gemma 3: one rope per attention kind.
        full, local = rope["full_attention"], rope["sliding_attention"]
        old["rope_theta"] = full["rope_theta"]
        old["rope_local_base_freq"] = local["rope_theta"]
        scaling = {k: v for k, v in full.items() if k != "rope_theta"}
        old["rope_scaling"] = None if scaling.get("rope_type") == "default" else scaling
        if "_sliding_window_pattern" in config:
            old["sliding_window_pattern"] = config["_sliding_window_pattern"]
    else:
        old["rope_theta"] = rope["rope_theta"]
        if "partial_rotary_factor" in rope:
            old["partial_rotary_factor"] = rope["partial_rotary_factor"]
        scaling = {k: v for k, v in rope.items() if k not in ("rope_theta", "partial_rotary_factor")}
        old["rope_scaling"] = None if scaling.get("rope_type") == "default" else scaling
    if "num_local_experts" in config and config.get("model_type") == "qwen3_moe":
        # Qwen3-MoE's older name; Mixtral's has always been `num_local_experts`.
        old["num_experts"] = old.pop("num_local_experts")
    if config.get("model_type") == "nemotron_h":
        # NVIDIA's original spelling: the layer kinds as a pattern string.
        letters = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
        old["hybrid_override_pattern"] = "".join(letters[t] for t in old.pop("layers_block_type"))
    if config.get("model_type") == "lfm2":
        # LFM2's original names (transformers 4.54).
        old["block_ff_dim"] = old.pop("intermediate_size")
        old["tie_embedding"] = old.pop("tie_word_embeddings")
        types = old.pop("layer_types")
        old["full_attn_idxs"] = [i for i, t in enumerate(types) if t == "full_attention"]
    old["transformers_version"] = "4.57.1"
    return old


def gemma4_hub_config(config: dict) -> dict:
    """Gemma 4 came out after transformers 4; its published configs spell the full layers'
    head width and key heads as `global_head_dim` and `num_global_key_value_heads`, which
    transformers 5.24 saves as a `per_layer_config` of per-layer overrides instead."""
    old = {k: v for k, v in config.items() if k != "per_layer_config"}
    overrides = list(config["per_layer_config"].values())
    old["global_head_dim"] = overrides[0]["head_dim"]
    if "num_key_value_heads" in overrides[0]:
        old["num_global_key_value_heads"] = overrides[0]["num_key_value_heads"]
    old["transformers_version"] = "5.5.0"
    return old


def mlx_lm_logits(fixture_dir: Path, config_name: str, ids: list[int]) -> tuple[np.ndarray, str] | None:
    """Logits from mlx-lm on the fixture's weights read with the given config file.

    Returns None when mlx-lm is not installed. mlx-lm 0.32.2 ignores `rope_parameters` and
    silently falls back to rope base 10000, so the meaningful cross-check reads the
    transformers-4 spelling; the result with config.json is recorded as well, as a live
    example of the config trap. Its transformers-4 names are the ones older checkpoints
    carry (`num_experts`, `rope_local_base_freq`).
    """
    try:
        import mlx.core as mx
        import mlx_lm
        from mlx_lm.utils import load_model
    except ImportError:
        return None
    version = getattr(mlx_lm, "__version__", "unknown")
    mx.set_default_device(mx.cpu)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        shutil.copy(fixture_dir / "model.safetensors", folder / "model.safetensors")
        shutil.copy(fixture_dir / config_name, folder / "config.json")
        model, _ = load_model(folder)
        logits = model(mx.array([ids]))
        # mlx-lm 0.32.2's gemma3_text has no final softcap; apply it here so the rest of the
        # model is still compared.
        softcap = json.loads((fixture_dir / "config.json").read_text()).get("final_logit_softcapping")
        if softcap and not hasattr(model.args, "final_logit_softcapping"):
            logits = mx.tanh(logits / softcap) * softcap
        mx.eval(logits)
        return np.array(logits[0].astype(mx.float32)), version



# ---------------------------------------------------------------------------------------------
# Vision fixtures (issue 21)
#
# A multimodal checkpoint run on a prompt that holds images: its golden file carries the vision
# tower's output and the projected image features beside the logits, so each stage is checked
# on its own.
# ---------------------------------------------------------------------------------------------

# Special ids of the gemma3_vision fixture, inside its 512-entry vocabulary (the real ones,
# 255999 / 256000 / 262144, are not): Gemma 3's processor lays an image out as
# "\n\n" <start_of_image> <image_soft_token> × mm_tokens_per_image <end_of_image> "\n\n".
GEMMA3_BOI = 509
GEMMA3_EOI = 510
GEMMA3_IMAGE = 511
GEMMA3_DOUBLE_NEWLINE = 108


def gemma3_vision_config() -> transformers.Gemma3Config:
    # Gemma 3 4B's layout, shrunk: the gemma3 fixture's text decoder behind a SigLIP tower of
    # 2 layers over 32×32 images in 8×8 patches (a 4×4 grid), pooled 2×2 down to 4 tokens per
    # image. A head width of 16 (2 heads of a 32-wide tower) and a LayerNorm epsilon of 1e-5
    # (not the default 1e-6) make a reader that guesses either give wrong features.
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_channels=3,
        image_size=32,
        patch_size=8,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-5,
        vision_use_head=False,
    )
    config = transformers.Gemma3Config(
        text_config=gemma3_config(),
        vision_config=vision,
        mm_tokens_per_image=4,
        boi_token_index=GEMMA3_BOI,
        eoi_token_index=GEMMA3_EOI,
        image_token_index=GEMMA3_IMAGE,
        tie_word_embeddings=True,
    )
    config.bos_token_id = 2
    config.pad_token_id = 0
    config.eos_token_id = 1
    return config


# The image token of the llava fixture: the last id of its 512-entry vocabulary (LLaVA 1.5's is
# 32000, the first id past Llama 2's vocabulary).
LLAVA_IMAGE = 511


def llava_config() -> transformers.LlavaConfig:
    # LLaVA 1.5's layout, shrunk: a CLIP tower of 3 layers over 56×56 images in 14×14 patches
    # (a 4×4 grid and the class token), features taken after its second layer (-2) without the
    # class token, a 2-layer GELU projector to the llama fixture's decoder (untied head). The
    # tower's quick_gelu and LayerNorm epsilon are left to their defaults, as llava-hf's configs
    # leave them; a head width of 16 (2 heads of a 32-wide tower) catches a reader that takes
    # the text model's.
    vision = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        image_size=56,
        patch_size=14,
        projection_dim=16,
    )
    config = transformers.LlavaConfig(
        text_config=llama_config(tied=False),
        vision_config=vision,
        image_token_index=LLAVA_IMAGE,
        image_seq_length=16,
        projector_hidden_act="gelu",
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
    )
    config.bos_token_id = 1
    config.eos_token_id = 2
    return config


VISION_FIXTURES = {"gemma3_vision": gemma3_vision_config, "llava": llava_config}


# Special ids of the qwen2_5_vl fixture, inside its 512-entry vocabulary (the real ones are
# 151652..151656): Qwen2.5-VL's processor lays an image out as <|vision_start|>, one
# <|image_pad|> per merged token (grid_h · grid_w / merge²), <|vision_end|>.
QWEN2_5_VL_VISION_START = 508
QWEN2_5_VL_VISION_END = 509
QWEN2_5_VL_VIDEO = 510
QWEN2_5_VL_IMAGE = 511
# Two images of different sizes, as image_grid_thw: 8x12 patches (4x6 merged tokens, six 2x2
# windows) and 6x10 (3x5 tokens: the windows at the bottom and right edges are partial).
QWEN2_5_VL_GRIDS = [[1, 8, 12], [1, 6, 10]]


def qwen2_5_vl_config() -> transformers.Qwen2_5_VLConfig:
    # Qwen2.5-VL's layout, shrunk: a qwen2-like decoder (2 layers, hidden 64, 4 heads of 16, 2
    # KV heads) with M-RoPE in sections [2, 3, 3] of its 8 rotary frequencies, behind a 3-block
    # vision tower (hidden 32, 2 heads of 16) over 4-pixel patches of 2 frames, merged 2x2; block
    # 1 attends over the whole image, blocks 0 and 2 within windows of 16 pixels (2x2 merged
    # tokens). Rope bases off the defaults (text 50000, vision 2000) catch a reader that guesses.
    vision = transformers.Qwen2_5_VLVisionConfig(
        depth=3,
        hidden_size=32,
        hidden_act="silu",
        intermediate_size=48,
        num_heads=2,
        in_channels=3,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
        tokens_per_second=2,
        window_size=16,
        out_hidden_size=HIDDEN,
        fullatt_block_indexes=[1],
        rope_parameters={"rope_type": "axial", "rope_theta": 2000.0},
    )
    text = transformers.Qwen2_5_VLTextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0, "mrope_section": [2, 3, 3]},
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=None,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=QWEN2_5_VL_IMAGE,
        video_token_id=QWEN2_5_VL_VIDEO,
        vision_start_token_id=QWEN2_5_VL_VISION_START,
        vision_end_token_id=QWEN2_5_VL_VISION_END,
        # Tied as in Qwen2.5-VL-3B (the 7B unties), which also keeps the fixture small.
        tie_word_embeddings=True,
    )


VISION_FIXTURES["qwen2_5_vl"] = qwen2_5_vl_config


def qwen2_5_vl_prompt(grids: list[list[int]], merge: int) -> tuple[list[int], list[int]]:
    """Text and images in turn as Qwen2.5-VL's processor lays them out, ending in text; and
    the processor's mm_token_type_ids (1 on image pads only)."""
    specials = (QWEN2_5_VL_VISION_START, QWEN2_5_VL_VISION_END, QWEN2_5_VL_VIDEO, QWEN2_5_VL_IMAGE)
    text = [t for t in PROMPT_TAIL if t not in specials]
    runs = [text[i * 6 : (i + 1) * 6] for i in range(len(grids) + 1)]
    ids = list(runs[0])
    for (t, h, w), run in zip(grids, runs[1:]):
        ids += [QWEN2_5_VL_VISION_START] + [QWEN2_5_VL_IMAGE] * (t * h * w // merge**2)
        ids += [QWEN2_5_VL_VISION_END] + run
    return ids, [int(t == QWEN2_5_VL_IMAGE) for t in ids]


def qwen2_5_vl_outputs(model, pixels, grids, ids, types, text, extra) -> dict:
    """Every stage of a Qwen2.5-VL on the fixture's inputs, in the model's dtype: the tower
    (its blocks' output in window order, and the merged image features in image order), the
    3-D positions, and the logits of the image prompt followed by `extra` text tokens."""
    inner = model.model
    grid = torch.tensor(grids)
    full = ids + extra
    with torch.no_grad():
        vision = inner.visual(pixels, grid_thw=grid)
        positions, deltas = inner.get_rope_index(
            torch.tensor([full]), mm_token_type_ids=torch.tensor([types + [0] * len(extra)]),
            image_grid_thw=grid,
        )
        logits = model(
            input_ids=torch.tensor([full]),
            pixel_values=pixels,
            image_grid_thw=grid,
            mm_token_type_ids=torch.tensor([types + [0] * len(extra)]),
        ).logits[0]
        text_logits = model(input_ids=torch.tensor([text])).logits[0]
    return {
        "vision_hidden": vision.last_hidden_state,
        "image_features": vision.pooler_output,
        "logits": logits,
        "text_logits": text_logits,
        "position_ids": positions[:, 0].to(torch.float64),
        "rope_deltas": deltas[0].to(torch.float64),
    }


def qwen2_5_vl_prefill_then_decode(model, pixels, grids, ids, types, extra) -> torch.Tensor:
    """transformers' own generation path: the image prompt in one pass, then `extra` token by
    token over the cache, at the positions its stored rope delta gives."""
    inner = model.model
    inner.rope_deltas = None
    grid = torch.tensor(grids)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([ids]),
            pixel_values=pixels,
            image_grid_thw=grid,
            mm_token_type_ids=torch.tensor([types]),
            use_cache=True,
        )
        rows = list(out.logits[0])
        past = out.cache
        for token in extra:
            out = model(input_ids=torch.tensor([[token]]), cache=past, use_cache=True)
            past = out.cache
            rows.append(out.logits[0, -1])
    inner.rope_deltas = None
    return torch.stack(rows)


def build_qwen2_5_vl(name: str) -> dict:
    """The qwen2_5_vl fixture: weights, config, and `logits.safetensors` with `pixel_values`
    [patches, 3 · 2 · 4 · 4] (two images), `vision_hidden` [patches, 32] (the tower's blocks'
    output, in window order), `image_features` [tokens, 64], `position_ids` [3, seq] and
    `rope_deltas` [1] (transformers' get_rope_index), `logits` [seq, vocab] for the image prompt
    and three more text tokens, `text_logits` for the text-only prompt."""
    grids = QWEN2_5_VL_GRIDS
    for seed in range(SEED, SEED + MAX_SEED_TRIES):
        torch.manual_seed(seed)
        config = qwen2_5_vl_config()
        config._attn_implementation = "eager"
        config.vision_config._attn_implementation = "eager"
        config.text_config._attn_implementation = "eager"
        model = transformers.Qwen2_5_VLForConditionalGeneration(config).to(torch.float32).eval()
        randomize_weights(model, norm_offset=False)
        vision = config.vision_config
        patch_len = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
        rows = sum(t * h * w for t, h, w in grids)
        pixels = torch.from_numpy(
            np.random.RandomState(4321).uniform(-1.8, 2.1, size=(rows, patch_len)).astype(np.float32)
        )
        merge = vision.spatial_merge_size
        ids, types = qwen2_5_vl_prompt(grids, merge)
        extra = PROMPT_TAIL[-3:]
        text = PROMPT_TAIL[:20]
        outputs = qwen2_5_vl_outputs(model, pixels, grids, ids, types, text, extra)
        wide = copy.deepcopy(model).to(torch.float64)
        exact = qwen2_5_vl_outputs(wide, pixels.double(), grids, ids, types, text, extra)
        rounding = {k: float((outputs[k].double() - exact[k]).abs().max()) for k in outputs}
        if max(rounding.values()) <= MAX_REFERENCE_ROUNDING:
            break
        print(f"{name}: seed {seed} rejected, f32 rounding moves the reference by {rounding}")
    else:
        raise SystemExit(f"{name}: no seed in {MAX_SEED_TRIES} tries gives a well-conditioned reference")
    decode = qwen2_5_vl_prefill_then_decode(model, pixels, grids, ids, types, extra)
    decode_diff = float((decode - outputs["logits"]).abs().max())
    if decode_diff > 1e-4:
        raise SystemExit(f"{name}: prefill and decode differ from the full pass by {decode_diff}")
    # What the windows change: the same tower attending over whole images in every block.
    with torch.no_grad():
        windowless = copy.deepcopy(model)
        windowless.model.visual.fullatt_block_indexes = list(range(vision.depth))
        whole = windowless.model.visual(pixels, grid_thw=torch.tensor(grids)).pooler_output
    window_effect = float((whole - outputs["image_features"]).abs().max())

    out = FIXTURES_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    saved_config = json.loads((out / "config.json").read_text())
    saved = {k: v.to(torch.float32).contiguous() for k, v in outputs.items()}
    saved["pixel_values"] = pixels.contiguous()
    safetensors.torch.save_file(saved, out / "logits.safetensors")

    logits = outputs["logits"]
    probs = torch.softmax(logits, dim=-1)
    golden = {
        "fixture": name,
        "architecture": saved_config.get("architectures", [None])[0],
        "model_type": saved_config.get("model_type"),
        "prompt_ids": ids,
        "extra_ids": extra,
        "mm_token_type_ids": types,
        "image_grid_thw": grids,
        "text_prompt_ids": text,
        "logits_file": "logits.safetensors",
        "tensors": {k: list(v.shape) for k, v in saved.items()},
        "dtype": "float32",
        "seed": seed,
        "attn_implementation": "eager",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "max_abs_logit": float(logits.abs().max()),
        "mean_max_softmax_prob": float(probs.max(dim=-1).values.mean()),
        "argmax_ids": [int(i) for i in logits.argmax(dim=-1)],
        "max_abs_vision_hidden": float(outputs["vision_hidden"].abs().max()),
        "max_abs_image_feature": float(outputs["image_features"].abs().max()),
        "decode_vs_full_max_abs_diff": decode_diff,
        "windowed_vs_whole_image_features_max_abs_diff": window_effect,
        "f32_vs_f64_max_abs_diff": rounding,
    }
    (out / "golden.json").write_text(compact_json(golden))
    return golden


def gemma3_image_prompt(images: int, tokens_per_image: int) -> tuple[list[int], list[int]]:
    """BOS, then text and images in turn as Gemma 3's processor lays them out, ending in text;
    and the processor's token_type_ids (1 on image soft tokens only)."""
    text = [t for t in PROMPT_TAIL if t not in (GEMMA3_BOI, GEMMA3_EOI, GEMMA3_IMAGE)]
    runs = [text[i * 6 : (i + 1) * 6] for i in range(images + 1)]
    ids = [2] + runs[0]
    for run in runs[1:]:
        ids += [GEMMA3_DOUBLE_NEWLINE, GEMMA3_BOI] + [GEMMA3_IMAGE] * tokens_per_image
        ids += [GEMMA3_EOI, GEMMA3_DOUBLE_NEWLINE] + run
    return ids, [int(t == GEMMA3_IMAGE) for t in ids]


def vision_outputs(model, pixels: torch.Tensor, ids: list[int], types: list[int], text: list[int]) -> dict:
    """Every stage of the model on the fixture's inputs, in the model's dtype."""
    inner = model.model
    with torch.no_grad():
        tower = inner.vision_tower(pixel_values=pixels).last_hidden_state
        features = inner.multi_modal_projector(tower)
        logits = model(
            input_ids=torch.tensor([ids]),
            pixel_values=pixels,
            token_type_ids=torch.tensor([types]),
        ).logits[0]
        # Without token_type_ids transformers masks causally everywhere: recorded only to show
        # what the bidirectional image blocks change.
        causal = model(input_ids=torch.tensor([ids]), pixel_values=pixels).logits[0]
        text_logits = model(input_ids=torch.tensor([text])).logits[0]
    return {
        "vision_hidden": tower[...],
        "image_features": features,
        "logits": logits,
        "causal_logits": causal,
        "text_logits": text_logits,
    }


def vision_prefill_then_decode(model, pixels, ids: list[int], types: list[int]) -> torch.Tensor:
    """transformers' own generation path: the prompt through its last image with the
    bidirectional mask, then the text after it token by token over the cache."""
    split = max(i for i, t in enumerate(types) if t) + 1
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([ids[:split]]),
            pixel_values=pixels,
            token_type_ids=torch.tensor([types[:split]]),
            use_cache=True,
        )
        rows = list(out.logits[0])
        past = out.cache
        for position in range(split, len(ids)):
            out = model(
                input_ids=torch.tensor([[ids[position]]]),
                cache=past,
                use_cache=True,
                position_ids=torch.tensor([[position]]),
            )
            past = out.cache
            rows.append(out.logits[0, -1])
    return torch.stack(rows)


def llava_image_prompt(images: int, tokens_per_image: int) -> list[int]:
    """BOS, then text and images in turn, ending in text: LLaVA's processor turns each `<image>`
    into `tokens_per_image` image tokens and nothing else."""
    text = [t for t in PROMPT_TAIL if t != LLAVA_IMAGE]
    runs = [text[i * 6 : (i + 1) * 6] for i in range(images + 1)]
    ids = [1] + runs[0]
    for run in runs[1:]:
        ids += [LLAVA_IMAGE] * tokens_per_image + run
    return ids


def llava_outputs(model, pixels: torch.Tensor, ids: list[int], text: list[int]) -> dict:
    """Every stage of a LLaVA on the fixture's inputs: the tower's hidden states after each
    layer (0 = the embeddings after the pre-LayerNorm, class token first), the projected image
    features, the logits with the images and the text-only prompt's logits."""
    inner = model.model
    with torch.no_grad():
        tower = inner.vision_tower(pixel_values=pixels, output_hidden_states=True)
        hidden_states = torch.stack(tower.hidden_states)
        features = inner.get_image_features(pixel_values=pixels).pooler_output
        logits = model(input_ids=torch.tensor([ids]), pixel_values=pixels).logits[0]
        text_logits = model(input_ids=torch.tensor([text])).logits[0]
    return {
        "vision_hidden_states": hidden_states,
        "image_features": torch.stack(list(features)),
        "logits": logits,
        "text_logits": text_logits,
    }


def build_llava(name: str) -> dict:
    """The llava fixture: weights, both config spellings, and `logits.safetensors` with
    `vision_hidden_states` [layers + 1, images, 1 + patches, vision hidden], `image_features`
    [images, tokens, text hidden], `logits` [seq, vocab] for the image prompt, `text_logits`
    for the text-only prompt and the `pixel_values` they came from."""
    for seed in range(SEED, SEED + MAX_SEED_TRIES):
        torch.manual_seed(seed)
        config = llava_config()
        config._attn_implementation = "eager"
        model = transformers.LlavaForConditionalGeneration(config).to(torch.float32).eval()
        randomize_weights(model, norm_offset=False)
        with torch.no_grad():
            for key, param in model.named_parameters():
                # LayerNorm biases: centred on 0 like other biases, not around 1 like weights.
                if "norm" in key and key.endswith(".bias"):
                    param.normal_(0.0, 0.2)
        vision = config.vision_config
        pixels = torch.from_numpy(
            np.random.RandomState(4321)
            .uniform(-1.8, 2.1, size=(2, vision.num_channels, vision.image_size, vision.image_size))
            .astype(np.float32)
        )
        ids = llava_image_prompt(2, config.image_seq_length)
        text = [config.text_config.bos_token_id] + PROMPT_TAIL
        outputs = llava_outputs(model, pixels, ids, text)
        wide = copy.deepcopy(model).to(torch.float64)
        exact = llava_outputs(wide, pixels.double(), ids, text)
        rounding = {k: float((outputs[k].double() - exact[k]).abs().max()) for k in outputs}
        if max(rounding.values()) <= MAX_REFERENCE_ROUNDING:
            break
        print(f"{name}: seed {seed} rejected, f32 rounding moves the reference by {rounding}")
    else:
        raise SystemExit(f"{name}: no seed in {MAX_SEED_TRIES} tries gives a well-conditioned reference")
    # The hidden states are what the tower's layers compute: the last one is its output.
    states = outputs["vision_hidden_states"]
    last = model.model.vision_tower(pixel_values=pixels).last_hidden_state
    if not torch.equal(states[-1], last):
        raise SystemExit(f"{name}: the last hidden state is not the tower's output")
    # transformers' own generation path: the prompt through its last image, then each token
    # over the cache.
    split = max(i for i, t in enumerate(ids) if t == LLAVA_IMAGE) + 1
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids[:split]]), pixel_values=pixels, use_cache=True)
        rows, past = list(out.logits[0]), out.cache
        for position in range(split, len(ids)):
            out = model(input_ids=torch.tensor([[ids[position]]]), cache=past, use_cache=True)
            past = out.cache
            rows.append(out.logits[0, -1])
    decode_diff = float((torch.stack(rows) - outputs["logits"]).abs().max())
    if decode_diff > 1e-4:
        raise SystemExit(f"{name}: prefill and decode differ from the full pass by {decode_diff}")

    out = FIXTURES_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    saved_config = json.loads((out / "config.json").read_text())
    old = dict(saved_config)
    old["text_config"] = transformers4_config(saved_config["text_config"])
    old["transformers_version"] = "4.57.1"
    (out / "config.transformers4.json").write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
    saved = {k: v.to(torch.float32).contiguous() for k, v in outputs.items()}
    saved["pixel_values"] = pixels.contiguous()
    safetensors.torch.save_file(saved, out / "logits.safetensors")
    logits = outputs["logits"]
    golden = {
        "fixture": name,
        "architecture": saved_config.get("architectures", [None])[0],
        "model_type": saved_config.get("model_type"),
        "prompt_ids": ids,
        "text_prompt_ids": text,
        "logits_file": "logits.safetensors",
        "tensors": {k: list(v.shape) for k, v in saved.items()},
        "dtype": "float32",
        "seed": seed,
        "attn_implementation": "eager",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "max_abs_logit": float(logits.abs().max()),
        "mean_max_softmax_prob": float(torch.softmax(logits, dim=-1).max(dim=-1).values.mean()),
        "argmax_ids": [int(i) for i in logits.argmax(dim=-1)],
        "max_abs_vision_hidden": float(states.abs().max()),
        "max_abs_image_feature": float(outputs["image_features"].abs().max()),
        "decode_vs_full_max_abs_diff": decode_diff,
        "f32_vs_f64_max_abs_diff": rounding,
    }
    (out / "golden.json").write_text(compact_json(golden))
    return golden


def build_vision(name: str) -> dict:
    """A multimodal fixture: weights, both config spellings, and `logits.safetensors` with
    `vision_hidden` [images, patches, vision hidden], `image_features` [images, tokens, text
    hidden], `logits` [seq, vocab] for the image prompt (bidirectional image blocks, as the
    processor's token_type_ids ask) and `text_logits` for the text-only prompt."""
    if name == "qwen2_5_vl":
        return build_qwen2_5_vl(name)
    if name == "llava":
        return build_llava(name)
    for seed in range(SEED, SEED + MAX_SEED_TRIES):
        torch.manual_seed(seed)
        config = gemma3_vision_config()
        config._attn_implementation = "eager"
        model = transformers.Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
        randomize_weights(model, norm_offset=True)
        with torch.no_grad():
            for key, param in model.named_parameters():
                # SigLIP's LayerNorms scale by w itself, not 1 + w.
                if ".vision_tower." in key and "norm" in key:
                    if key.endswith(".weight"):
                        param.uniform_(0.5, 1.5)
                    else:
                        param.normal_(0.0, 0.2)
        model.tie_weights()
        vision = config.vision_config
        pixels = torch.from_numpy(
            np.random.RandomState(4321)
            .uniform(-1.0, 1.0, size=(2, vision.num_channels, vision.image_size, vision.image_size))
            .astype(np.float32)
        )
        ids, types = gemma3_image_prompt(2, config.mm_tokens_per_image)
        text = [config.bos_token_id] + PROMPT_TAIL
        outputs = vision_outputs(model, pixels, ids, types, text)
        wide = copy.deepcopy(model).to(torch.float64)
        exact = vision_outputs(wide, pixels.double(), ids, types, text)
        rounding = {k: float((outputs[k].double() - exact[k]).abs().max()) for k in outputs}
        if max(rounding.values()) <= MAX_REFERENCE_ROUNDING:
            break
        print(f"{name}: seed {seed} rejected, f32 rounding moves the reference by {rounding}")
    else:
        raise SystemExit(f"{name}: no seed in {MAX_SEED_TRIES} tries gives a well-conditioned reference")
    decode = vision_prefill_then_decode(model, pixels, ids, types)
    decode_diff = float((decode - outputs["logits"]).abs().max())
    if decode_diff > 1e-4:
        raise SystemExit(f"{name}: prefill and decode differ from the full pass by {decode_diff}")

    out = FIXTURES_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    saved_config = json.loads((out / "config.json").read_text())
    old = dict(saved_config)
    old["text_config"] = transformers4_config(saved_config["text_config"])
    old["transformers_version"] = "4.57.1"
    (out / "config.transformers4.json").write_text(json.dumps(old, indent=2, sort_keys=True) + "\n")
    saved = {k: v.to(torch.float32).contiguous() for k, v in outputs.items() if k != "causal_logits"}
    saved["pixel_values"] = pixels.contiguous()
    safetensors.torch.save_file(saved, out / "logits.safetensors")

    logits = outputs["logits"]
    probs = torch.softmax(logits, dim=-1)
    golden = {
        "fixture": name,
        "architecture": saved_config.get("architectures", [None])[0],
        "model_type": saved_config.get("model_type"),
        "prompt_ids": ids,
        "token_type_ids": types,
        "text_prompt_ids": text,
        "logits_file": "logits.safetensors",
        "tensors": {k: list(v.shape) for k, v in saved.items()},
        "dtype": "float32",
        "seed": seed,
        "attn_implementation": "eager",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "max_abs_logit": float(logits.abs().max()),
        "mean_max_softmax_prob": float(probs.max(dim=-1).values.mean()),
        "argmax_ids": [int(i) for i in logits.argmax(dim=-1)],
        "max_abs_vision_hidden": float(outputs["vision_hidden"].abs().max()),
        "max_abs_image_feature": float(outputs["image_features"].abs().max()),
        "decode_vs_full_max_abs_diff": decode_diff,
        "bidirectional_vs_causal_max_abs_diff": float((logits - outputs["causal_logits"]).abs().max()),
        "f32_vs_f64_max_abs_diff": rounding,
    }
    (out / "golden.json").write_text(compact_json(golden))
    return golden


# ---------------------------------------------------------------------------------------------
# GGUF copies
#
# `--gguf` translates a committed fixture folder into `model.gguf` the way llama.cpp's
# converter (`convert_hf_to_gguf.py`) would: its architecture name, its metadata keys, its
# tensor names (the `gguf` package's own name map) and its changes to the weights (Llama's
# interleaved q/k rows, experts stacked per projection). Tensors stay f32, so the copy must
# give the safetensors fixture's logits; the parity tests load both.
# ---------------------------------------------------------------------------------------------


def llama_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter reorders each Llama head's q/k rows from halves into pairs."""
    shape = weight.shape
    return weight.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def stack_experts(tensors: dict) -> dict:
    """Per-expert matrices `…experts.E.<proj>.weight` stacked into one `[E, out, in]` tensor
    per layer and projection, as the converter writes `ffn_{gate,up,down}_exps`."""
    grouped: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    rest = {}
    for name, array in tensors.items():
        match = re.match(r"(.*\.experts)\.(\d+)\.(\w+)\.weight$", name)
        if match:
            grouped.setdefault((match.group(1), match.group(3)), {})[int(match.group(2))] = array
        else:
            rest[name] = array
    for (prefix, proj), experts in grouped.items():
        stacked = np.stack([experts[e] for e in sorted(experts)])
        rest[f"{prefix}.{proj}.weight"] = stacked
    return rest


def gguf_metadata_common(
    writer, config: dict, head_dim: int, kv_heads=None, feed_forward=None, value_dim=None
) -> None:
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    feed_forward = feed_forward if feed_forward is not None else config.get("intermediate_size")
    if feed_forward is not None:
        writer.add_feed_forward_length(feed_forward)
    writer.add_head_count(config["num_attention_heads"])
    if kv_heads is None:
        kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(value_dim if value_dim is not None else head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_vocab_size(config["vocab_size"])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        if isinstance(config.get(key), int):
            add(config[key])


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """Llama 3's rope scaling as llama.cpp's converter writes it: no scaling keys, but one
    divisor per frequency in a `rope_freqs` tensor (1 for short wavelengths, `factor` for long
    ones, a smooth ramp between)."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    original = rope["original_max_position_embeddings"]
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < original / high:
            factors.append(1.0)
        elif wavelen > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def gguf_llama(config: dict, tensors: dict, writer) -> dict:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    gguf_metadata_common(writer, config, config.get("head_dim") or config["hidden_size"] // heads)
    writer.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // heads)
    if "num_local_experts" in config:
        writer.add_expert_count(config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
    rope = config.get("rope_parameters") or {}
    out = {}
    if rope.get("rope_type") == "llama3":
        out["gguf:rope_freqs.weight"] = llama3_rope_factors(rope, config.get("head_dim") or config["hidden_size"] // heads)
    for name, array in tensors.items():
        if name.endswith("q_proj.weight"):
            array = llama_permute(array, heads)
        elif name.endswith("k_proj.weight"):
            array = llama_permute(array, kv_heads)
        out[name] = array
    return stack_experts(out)


def gguf_qwen(config: dict, tensors: dict, writer) -> dict:
    heads = config["num_attention_heads"]
    gguf_metadata_common(writer, config, config.get("head_dim") or config["hidden_size"] // heads)
    if "num_experts" in config or "num_local_experts" in config:
        writer.add_expert_count(config.get("num_experts") or config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    return stack_experts(tensors)


def gguf_plain(config: dict, tensors: dict, writer) -> dict:
    """Families whose converter keeps HF's weights as they are (OLMo 2; Phi-3, whose fused
    `qkv_proj` and `gate_up_proj` stay fused as `attn_qkv` and `ffn_up`)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    gguf_metadata_common(writer, config, head_dim)
    rotated = int(head_dim * (config.get("rope_parameters") or {}).get("partial_rotary_factor", 1.0))
    writer.add_rope_dimension_count(rotated)
    if "original_max_position_embeddings" in config:
        # Phi-3's converter always writes these two (0: no window).
        writer.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
        writer.add_sliding_window(config.get("sliding_window") or 0)
    return tensors


def gguf_gemma4(config: dict, tensors: dict, writer) -> dict:
    """Gemma 4: head shapes of full layers, double-wide MLPs and key-value heads as per-layer
    keys or arrays, the layer kinds as a bool array, proportional rope as a `rope_freqs`
    factor tensor (1e30 stops a frequency), norms as they are (no +1), and the names the
    converter gives tensors that its name map does not know (returned with a `gguf:` prefix)."""
    layer_types = config["layer_types"]
    layers = len(layer_types)
    head_dim = config["head_dim"]
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    overrides = {int(k): v for k, v in (config.get("per_layer_config") or {}).items()}
    global_head_dim = overrides.get(full[0], {}).get("head_dim", head_dim)
    shared = config.get("num_kv_shared_layers") or 0
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    ff = config["intermediate_size"]
    if config.get("use_double_wide_mlp"):
        writer.add_feed_forward_length([ff if i < layers - shared else 2 * ff for i in range(layers)])
    else:
        writer.add_feed_forward_length(ff)
    writer.add_head_count(config["num_attention_heads"])
    kv = [overrides.get(i, {}).get("num_key_value_heads", config["num_key_value_heads"]) for i in range(layers)]
    writer.add_head_count_kv(kv if len(set(kv)) > 1 else kv[0])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_sliding_window(config["sliding_window"])
    writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in layer_types])
    writer.add_shared_kv_layers(shared)
    writer.add_embedding_length_per_layer_input(config.get("hidden_size_per_layer_input") or 0)
    writer.add_key_length(global_head_dim)
    writer.add_value_length(global_head_dim)
    writer.add_key_length_swa(head_dim)
    writer.add_value_length_swa(head_dim)
    rope = config["rope_parameters"]
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_rope_dimension_count(global_head_dim)
    writer.add_rope_dimension_count_swa(int(head_dim * config.get("partial_rotary_factor", 1.0)))
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if config.get("enable_moe_block"):
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["top_k_experts"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        if isinstance(config.get(key), int):
            add(config[key])

    turning = int(global_head_dim * rope["full_attention"]["partial_rotary_factor"] / 2)
    out = {"gguf:rope_freqs.weight": np.array([1.0] * turning + [1e30] * (global_head_dim // 2 - turning))}
    for name, array in tensors.items():
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        if name.endswith("router.scale"):
            out[f"gguf:blk.{layer.group(1)}.ffn_gate_inp.scale"] = array
        elif name.endswith("router.per_expert_scale"):
            out[f"gguf:blk.{layer.group(1)}.ffn_down_exps.scale"] = array
        elif name.endswith(("layer_scalar", "experts.gate_up_proj", "experts.down_proj")):
            out[name + ".weight"] = array
        else:
            out[name] = array
    return out


def gguf_mistral3(config: dict, tensors: dict, writer) -> dict:
    """Mistral 3's text model, the Llama way (permuted q/k rows) under its own architecture
    name; the converter strips `language_model.` and leaves the vision tower to the projector
    file."""
    text = {}
    for name, array in tensors.items():
        if name.startswith("language_model."):
            text[name.removeprefix("language_model.")] = array
    return gguf_llama(config, text, writer)


def gguf_lfm2(config: dict, tensors: dict, writer) -> dict:
    """LFM2: convolution layers are those with no key/value heads; the MLP width is written
    after LFM2's own adjustment; the short convolutions' `[C, 1, L]` kernels are squeezed."""
    ff = config["intermediate_size"]
    if config.get("block_auto_adjust_ff_dim"):
        ff = int(2 * ff / 3)
        if config.get("block_ffn_dim_multiplier") is not None:
            ff = int(config["block_ffn_dim_multiplier"] * ff)
        multiple = config["block_multiple_of"]
        ff = multiple * ((ff + multiple - 1) // multiple)
    kv_heads = [config["num_key_value_heads"] if kind == "full_attention" else 0 for kind in config["layer_types"]]
    gguf_metadata_common(
        writer,
        config | {"rms_norm_eps": config["norm_eps"]},
        config["hidden_size"] // config["num_attention_heads"],
        kv_heads=kv_heads,
        feed_forward=ff,
    )
    writer.add_shortconv_l_cache(config["conv_L_cache"])
    return {
        name: array.squeeze(1) if name.endswith("conv.conv.weight") else array
        for name, array in tensors.items()
    }


def mamba2_tensor(name: str, array: np.ndarray, groups: int, inner: int):
    """The converter's Mamba-2 changes to one mixer tensor: `A = -exp(A_log)` and `D` as
    columns, squeezed convolution kernels, the gated norm split per group, `dt_bias` under
    `dt_proj`. `None` for a tensor it leaves alone."""
    if name.endswith(".A_log"):
        return name, -np.exp(array).reshape(-1, 1)
    if name.endswith(".D"):
        return name, array.reshape(-1, 1)
    if name.endswith("conv1d.weight"):
        return name, array.squeeze(1)
    if name.endswith(".norm.weight") and array.shape == (inner,):
        return name, array.reshape(groups, inner // groups)
    if name.endswith(".dt_bias"):
        return name.replace("dt_bias", "dt_proj.bias"), array
    return None


def gguf_nemotron_h(config: dict, tensors: dict, writer) -> dict:
    """Nemotron-H: the block kinds as per-layer key/value head counts and MLP widths (0 where
    a block has none), the Mamba-2 sizes as `ssm.*` keys, and the converter's Mamba-2 changes:
    `A = -exp(A_log)` and `D` as columns, squeezed convolution kernels, the gated norm split
    per group, `dt_bias` under `ssm_dt`; attention q/k rows permuted as Llama's (llama.cpp's
    NemotronH converter is a Llama one; without rope the order does not change a score)."""
    blocks = config["layers_block_type"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    mamba_heads, mamba_head_dim = config["mamba_num_heads"], config["mamba_head_dim"]
    inner = mamba_heads * mamba_head_dim
    widths = {"mlp": config["intermediate_size"], "moe": config["moe_intermediate_size"]}
    gguf_metadata_common(
        writer,
        config | {"rms_norm_eps": config["layer_norm_epsilon"]},
        config["head_dim"],
        kv_heads=[kv if b == "full_attention" else 0 for b in blocks],
        feed_forward=[widths.get(b, 0) for b in blocks],
    )
    if "moe" in blocks:
        writer.add_expert_count(config["n_routed_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(config["moe_shared_expert_intermediate_size"])
        writer.add_expert_shared_count(config["n_shared_experts"])
        writer.add_expert_weights_norm(bool(config["norm_topk_prob"]))
        writer.add_expert_weights_scale(config["routed_scaling_factor"])
        writer.add_expert_group_count(config["n_group"])
        writer.add_expert_group_used_count(config["topk_group"])
        if config.get("moe_latent_size") is not None:
            writer.add_moe_latent_size(config["moe_latent_size"])
    writer.add_ssm_conv_kernel(config["conv_kernel"])
    writer.add_ssm_state_size(config["ssm_state_size"])
    writer.add_ssm_group_count(config["n_groups"])
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_time_step_rank(mamba_heads)
    out = {}
    for name, array in tensors.items():
        changed = mamba2_tensor(name, array, config["n_groups"], inner) if ".mixer." in name else None
        if changed:
            out[changed[0]] = changed[1]
        elif name.endswith("e_score_correction_bias"):
            layer = re.match(r"backbone\.layers\.(\d+)\.", name).group(1)
            out[f"gguf:blk.{layer}.exp_probs_b.bias"] = array
        elif name.endswith("q_proj.weight"):
            out[name] = llama_permute(array, heads)
        elif name.endswith("k_proj.weight"):
            out[name] = llama_permute(array, kv)
        else:
            out[name] = array
    stacked = {}
    for name, array in stack_experts(out).items():
        match = re.match(r"backbone\.layers\.(\d+)\.mixer\.experts\.(up|down)_proj\.weight$", name)
        if match:
            name = f"gguf:blk.{match.group(1)}.ffn_{match.group(2)}_exps.weight"
        stacked[name] = array
    return stacked


def gguf_granitehybrid(config: dict, tensors: dict, writer) -> dict:
    """Granite 4 hybrid: Mamba-2 layers are those with no key/value heads; the μP multipliers
    as Granite's scale keys; rope off (`rope.scaling.finetuned` false) for `nope` models; the
    fused `input_linear` of the experts and of the shared MLP split into gate (first half) and
    up; the Mamba-2 changes as Nemotron-H's; attention q/k rows permuted as Llama's."""
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    mamba_heads, mamba_head_dim = config["mamba_n_heads"], config["mamba_d_head"]
    inner = mamba_heads * mamba_head_dim
    gguf_metadata_common(
        writer,
        config,
        config["hidden_size"] // heads,
        kv_heads=[kv if kind == "full_attention" else 0 for kind in config["layer_types"]],
    )
    writer.add_attention_scale(config["attention_multiplier"])
    writer.add_embedding_scale(config["embedding_multiplier"])
    writer.add_residual_scale(config["residual_multiplier"])
    writer.add_logit_scale(config["logits_scaling"])
    use_rope = config.get("position_embedding_type") == "rope"
    writer.add_rope_scaling_finetuned(use_rope)
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_shared_feed_forward_length(config["shared_intermediate_size"])
    writer.add_ssm_conv_kernel(config["mamba_d_conv"])
    writer.add_ssm_state_size(config["mamba_d_state"])
    writer.add_ssm_group_count(config["mamba_n_groups"])
    writer.add_ssm_inner_size(inner)
    writer.add_ssm_time_step_rank(mamba_heads)
    out = {}
    for name, array in tensors.items():
        if name.endswith("input_linear.weight"):
            layer = re.match(r"model\.layers\.(\d+)\.", name).group(1)
            gate, up = np.split(array, 2, axis=-2)
            kind = "exps" if "block_sparse_moe" in name else "shexp"
            out[f"gguf:blk.{layer}.ffn_gate_{kind}.weight"] = gate
            out[f"gguf:blk.{layer}.ffn_up_{kind}.weight"] = up
        elif ".mamba." in name and (changed := mamba2_tensor(name, array, config["mamba_n_groups"], inner)):
            out[changed[0]] = changed[1]
        elif name.endswith("q_proj.weight"):
            out[name] = llama_permute(array, heads)
        elif name.endswith("k_proj.weight"):
            out[name] = llama_permute(array, kv)
        else:
            out[name] = array
    return out


def gguf_deepseek2(config: dict, tensors: dict, writer) -> dict:
    """DeepSeek-V3 as llama.cpp's deepseek2: latent attention written as one key/value head of
    `kv_lora_rank + rope` keys and `kv_lora_rank` values, the per-head shapes in `*_mla` keys,
    `kv_b_proj` split per head into `k_b` (transposed) and `v_b`; routing keys for sigmoid
    scores, groups, the scale and renormalization; multi-token-prediction layers dropped."""
    heads = config["num_attention_heads"]
    nope, rope_dim, value = config["qk_nope_head_dim"], config["qk_rope_head_dim"], config["v_head_dim"]
    rank = config["kv_lora_rank"]
    gguf_metadata_common(writer, config, rank + rope_dim, kv_heads=1, value_dim=rank)
    writer.add_key_length_mla(nope + rope_dim)
    writer.add_value_length_mla(value)
    if config.get("q_lora_rank") is not None:
        writer.add_q_lora_rank(config["q_lora_rank"])
    writer.add_kv_lora_rank(rank)
    writer.add_rope_dimension_count(rope_dim)
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    # The converter writes the gating function from a config's `scoring_func`; DeepSeek-V3's
    # published config says "sigmoid", which transformers' config class (so the deepseek_v3
    # fixture) leaves out.
    if config.get("scoring_func", "sigmoid") != "sigmoid":
        raise SystemExit(f"no translation for scoring_func {config['scoring_func']!r}")
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_expert_group_count(config["n_group"])
    writer.add_expert_group_used_count(config["topk_group"])
    out = {}
    layers = config["num_hidden_layers"]
    for name, array in tensors.items():
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        if layer and int(layer.group(1)) >= layers:
            continue
        if name.endswith("kv_b_proj.weight"):
            per_head = array.reshape(heads, nope + value, rank)
            k_b, v_b = per_head[:, :nope, :], per_head[:, nope:, :]
            out[f"gguf:blk.{layer.group(1)}.attn_k_b.weight"] = k_b.transpose(0, 2, 1)
            out[f"gguf:blk.{layer.group(1)}.attn_v_b.weight"] = v_b
        elif name.endswith("e_score_correction_bias"):
            out[f"gguf:blk.{layer.group(1)}.exp_probs_b.bias"] = array
        else:
            out[name] = array
    return stack_experts(out)


def reorder_v_heads(array: np.ndarray, axis: int, key_heads: int, per_key: int, width: int) -> np.ndarray:
    """The converter's V-head order for linear attention: from grouped by key head
    (`k0v0 k0v1 k1v0 k1v1`) to tiled (`k0v0 k1v0 k0v1 k1v1`), along `axis`."""
    shape = list(array.shape)
    grouped = array.reshape(*shape[:axis], key_heads, per_key, width, *shape[axis + 1:])
    return np.swapaxes(grouped, axis, axis + 1).reshape(shape)


def gguf_qwen35(config: dict, tensors: dict, writer) -> dict:
    """Qwen3.5 (and its MoE) as llama.cpp's qwen35 / qwen35moe: the full-attention interval
    and rope sections as keys, the delta nets' sizes as `ssm.*` keys, and the converter's
    changes: `1 + w` norms written as stored-plus-one (all but the delta net's gated norm),
    `A = -exp(A_log)`, squeezed kernels, and every value-head axis of the delta nets reordered
    from grouped-by-key-head to tiled. (The interval is derived from `layer_types`, as a
    published config states it beside them; the converter would default it to 4.)"""
    heads = config["num_attention_heads"]
    head_dim = config["head_dim"]
    layer_types = config["layer_types"]
    rope = config["rope_parameters"]
    key_heads, value_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key_dim, value_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
    per_key = value_heads // key_heads
    gguf_metadata_common(writer, config, head_dim)
    writer.add_full_attention_interval(layer_types.index("full_attention") + 1)
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if rope.get("mrope_section"):
        writer.add_rope_dimension_sections(list(rope["mrope_section"]) + [0] * (4 - len(rope["mrope_section"])))
    writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(key_dim)
    writer.add_ssm_group_count(key_heads)
    writer.add_ssm_time_step_rank(value_heads)
    writer.add_ssm_inner_size(value_dim * value_heads)
    if "num_experts" in config:
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    reorder = lambda a, axis, width: reorder_v_heads(a, axis, key_heads, per_key, width)
    qk = key_dim * key_heads
    out = {}
    for name, array in tensors.items():
        if name.startswith("mtp."):
            continue
        if ".linear_attn." in name and per_key > 1:
            if ".in_proj_qkv." in name:
                array = np.concatenate([array[: 2 * qk], reorder(array[2 * qk:], 0, value_dim)])
            elif ".in_proj_z." in name:
                array = reorder(array, 0, value_dim)
            elif ".in_proj_a." in name or ".in_proj_b." in name:
                array = reorder(array, 0, 1)
            elif name.endswith((".A_log", ".dt_bias")):
                array = reorder(array[:, None], 0, 1)[:, 0]
            elif ".conv1d." in name:
                array = array.squeeze(1)
                array = np.concatenate([array[: 2 * qk], reorder(array[2 * qk:], 0, value_dim)])[:, None, :]
            elif ".out_proj." in name:
                array = reorder(array, 1, value_dim)
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            array = array + 1.0
        elif name.endswith("linear_attn.A_log"):
            array = -np.exp(array)
        elif name.endswith("conv1d.weight"):
            array = array.squeeze(1)
        elif name.endswith("linear_attn.dt_bias"):
            name = name.replace("dt_bias", "dt_proj.bias")
        out[name] = array
    return stack_experts(out)


def gguf_qwen3next(config: dict, tensors: dict, writer) -> dict:
    """Qwen3-Next as llama.cpp's qwen3next: Qwen3.5's keys (the full-attention interval as the
    converter takes it: the config's, else 4) and its changes to the weights (`1 + w` norms but
    the gated one, `A = -exp(A_log)`, squeezed kernels), with the value heads left grouped by
    key head; `in_proj_qkvz` regrouped from per key head into all queries, keys and values
    (`attn_qkv`) and the output gates (`attn_gate`); `in_proj_ba` kept as it is."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    interval = config.get("full_attention_interval", 4)
    layer_types = config["layer_types"]
    if any((t == "full_attention") != ((i + 1) % interval == 0) for i, t in enumerate(layer_types)):
        raise SystemExit(f"layer_types do not attend every {interval}th layer, as llama.cpp would read them")
    if config.get("mlp_only_layers"):
        raise SystemExit("llama.cpp's qwen3next has no tensors for the dense layers of mlp_only_layers")
    key_heads, value_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key_dim, value_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
    gguf_metadata_common(writer, config, head_dim)
    writer.add_expert_count(config["num_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(key_dim)
    writer.add_ssm_group_count(key_heads)
    writer.add_ssm_time_step_rank(value_heads)
    writer.add_ssm_inner_size(value_dim * value_heads)
    writer.add_full_attention_interval(interval)
    writer.add_rope_dimension_count(int(head_dim * config.get("partial_rotary_factor", 0.25)))
    per_key = [key_dim, key_dim, value_heads // key_heads * value_dim, value_heads // key_heads * value_dim]
    out = {}
    for name, array in tensors.items():
        if name.startswith("mtp."):
            continue
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            array = array + 1.0
        elif name.endswith("linear_attn.A_log"):
            array = -np.exp(array)
        elif name.endswith("conv1d.weight"):
            array = array.squeeze(1)
        elif name.endswith("linear_attn.dt_bias"):
            name = name.replace("dt_bias", "dt_proj.bias")
        if name.endswith("in_proj_qkvz.weight"):
            grouped = array.reshape(key_heads, sum(per_key), -1)
            q, k, v, z = np.split(grouped, np.cumsum(per_key)[:3], axis=1)
            flat = lambda part: part.reshape(-1, part.shape[-1])
            out[f"gguf:blk.{layer.group(1)}.attn_qkv.weight"] = np.concatenate([flat(q), flat(k), flat(v)])
            out[f"gguf:blk.{layer.group(1)}.attn_gate.weight"] = flat(z)
        else:
            out[name] = array
    return stack_experts(out)


def gguf_gemma3(config: dict, tensors: dict, writer) -> dict:
    """Gemma 3: both rope bases and the window as keys (not the layer pattern, nor
    `query_pre_attn_scalar`: llama.cpp fixes both), every norm written as `1 + w`."""
    rope = config["rope_parameters"]
    gguf_metadata_common(writer, config | {"rope_parameters": rope["full_attention"]}, config["head_dim"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_sliding_window(config["sliding_window"])
    if config.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    return {
        name: array + 1.0 if name.endswith("norm.weight") else array
        for name, array in tensors.items()
    }


def gguf_gemma2(config: dict, tensors: dict, writer) -> dict:
    """Gemma 2: the converter's own short list of keys (no rope base, no vocabulary size, no
    `query_pre_attn_scalar`, no layer pattern: llama.cpp fixes those), both soft caps and the
    window; every norm written as `1 + w`."""
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
    writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    writer.add_sliding_window(config["sliding_window"])
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        if isinstance(config.get(key), int):
            add(config[key])
    return {
        name: array + 1.0 if name.endswith("norm.weight") else array
        for name, array in tensors.items()
    }


def gguf_gpt_oss(config: dict, tensors: dict, writer) -> dict:
    """gpt-oss: the window as a key (llama.cpp alternates sliding and full layers itself), sinks
    under their own name, and the experts' interleaved gate/up columns split into gate and up
    stacks (even, odd), each expert's matrices transposed to `[out, in]`."""
    gguf_metadata_common(writer, config, config["head_dim"])
    writer.add_sliding_window(config["sliding_window"])
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(config["intermediate_size"])
    out = {}
    for name, array in tensors.items():
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        blk = f"gguf:blk.{layer.group(1)}" if layer else None
        if name.endswith("self_attn.sinks"):
            out[f"{blk}.attn_sinks.weight"] = array
        elif name.endswith("experts.gate_up_proj"):
            rows = array.swapaxes(1, 2)
            out[f"{blk}.ffn_gate_exps.weight"], out[f"{blk}.ffn_up_exps.weight"] = rows[:, ::2], rows[:, 1::2]
        elif name.endswith("experts.gate_up_proj_bias"):
            out[f"{blk}.ffn_gate_exps.bias"], out[f"{blk}.ffn_up_exps.bias"] = array[:, ::2], array[:, 1::2]
        elif name.endswith("experts.down_proj"):
            out[f"{blk}.ffn_down_exps.weight"] = array.swapaxes(1, 2)
        elif name.endswith("experts.down_proj_bias"):
            out[f"{blk}.ffn_down_exps.bias"] = array
        else:
            out[name] = array
    return out


def gguf_llama4(config: dict, tensors: dict, writer) -> dict:
    """Llama 4: no q/k permutation (its rope already turns adjacent pairs); the dense and the
    expert widths and the MoE step as keys; each expert's fused `[in, 2 · out]` gate/up
    transposed and split into gate and up halves, its down projection transposed."""
    gguf_metadata_common(writer, config, config["head_dim"], feed_forward=config["intermediate_size_mlp"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_interleave_moe_layer_step(config["interleave_moe_layer_step"])
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(config["intermediate_size"])
    out = {}
    for name, array in tensors.items():
        layer = re.match(r"model\.layers\.(\d+)\.", name)
        if name.endswith("experts.gate_up_proj"):
            gate, up = np.split(array.swapaxes(1, 2), 2, axis=1)
            out[f"gguf:blk.{layer.group(1)}.ffn_gate_exps.weight"] = gate
            out[f"gguf:blk.{layer.group(1)}.ffn_up_exps.weight"] = up
        elif name.endswith("experts.down_proj"):
            out[f"gguf:blk.{layer.group(1)}.ffn_down_exps.weight"] = array.swapaxes(1, 2)
        else:
            out[name] = array
    return out


# fixture: (llama.cpp architecture, translation of metadata and weights)
GGUF_COPIES = {
    "llama3": (gguf.MODEL_ARCH.LLAMA, gguf_llama),
    "llama4_llama_cpp": (gguf.MODEL_ARCH.LLAMA4, gguf_llama4),
    "gpt_oss_llama_cpp": (gguf.MODEL_ARCH.GPT_OSS, gguf_gpt_oss),
    "gemma3_llama_cpp": (gguf.MODEL_ARCH.GEMMA3, gguf_gemma3),
    "gemma2_llama_cpp": (gguf.MODEL_ARCH.GEMMA2, gguf_gemma2),
    "mistral_llama_cpp": (gguf.MODEL_ARCH.LLAMA, gguf_llama),
    "glm4_moe_lite_llama_cpp": (gguf.MODEL_ARCH.DEEPSEEK2, gguf_deepseek2),
    "qwen3_5": (gguf.MODEL_ARCH.QWEN35, gguf_qwen35),
    "qwen3_5_moe": (gguf.MODEL_ARCH.QWEN35MOE, gguf_qwen35),
    "qwen3_next_llama_cpp": (gguf.MODEL_ARCH.QWEN3NEXT, gguf_qwen3next),
    "deepseek_v3": (gguf.MODEL_ARCH.DEEPSEEK2, gguf_deepseek2),
    "granitemoehybrid": (gguf.MODEL_ARCH.GRANITE_HYBRID, gguf_granitehybrid),
    "nemotron_h": (gguf.MODEL_ARCH.NEMOTRON_H_MOE, gguf_nemotron_h),
    "nemotron_h_moe": (gguf.MODEL_ARCH.NEMOTRON_H_MOE, gguf_nemotron_h),
    "mistral3": (gguf.MODEL_ARCH.MISTRAL3, gguf_mistral3),
    "lfm2": (gguf.MODEL_ARCH.LFM2, gguf_lfm2),
    "gemma4": (gguf.MODEL_ARCH.GEMMA4, gguf_gemma4),
    "gemma4_moe": (gguf.MODEL_ARCH.GEMMA4, gguf_gemma4),
    "mixtral": (gguf.MODEL_ARCH.LLAMA, gguf_llama),
    "olmo2": (gguf.MODEL_ARCH.OLMO2, gguf_plain),
    "phi3": (gguf.MODEL_ARCH.PHI3, gguf_plain),
    "llama": (gguf.MODEL_ARCH.LLAMA, gguf_llama),
    "llama_untied": (gguf.MODEL_ARCH.LLAMA, gguf_llama),
    "qwen2": (gguf.MODEL_ARCH.QWEN2, gguf_qwen),
    "qwen3": (gguf.MODEL_ARCH.QWEN3, gguf_qwen),
    "qwen3_moe": (gguf.MODEL_ARCH.QWEN3MOE, gguf_qwen),
}


def write_gguf(name: str) -> Path:
    """`model.gguf` beside the fixture's safetensors, as llama.cpp's converter would write it."""
    folder = FIXTURES_DIR / name
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    if "num_hidden_layers" not in config:  # Nemotron-H counts its blocks
        config["num_hidden_layers"] = len(config["layers_block_type"])
    tensors = {}
    with safetensors.safe_open(folder / "model.safetensors", "np") as f:
        for key in f.keys():
            tensors[key] = f.get_tensor(key)
    if config.get("tie_word_embeddings", True):
        tensors.pop("lm_head.weight", None)
    arch, translate = GGUF_COPIES[name]
    path = folder / "model.gguf"
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(f"mlxkit fixture {name}")
    translated = translate(config, tensors, writer)
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    for hf_name, array in translated.items():
        if hf_name.startswith("gguf:"):
            writer.add_tensor(hf_name.removeprefix("gguf:"), np.ascontiguousarray(array, dtype=np.float32))
            continue
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise SystemExit(f"{name}: no GGUF name for {hf_name}")
        writer.add_tensor(gguf_name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def draw(name: str, seed: int):
    """Build the model with weights from `seed`; None when its routing has a near-tie."""
    make_config, model_class, norm_offset = FIXTURES[name]
    torch.manual_seed(seed)
    config = make_config()
    config._attn_implementation = "eager"
    model = model_class(config).to(torch.float32).eval()
    randomize_weights(model, norm_offset)
    model.tie_weights()
    length = PROMPT_LENGTHS.get(name, 1 + len(PROMPT_TAIL))
    tail = PROMPT_TAIL if length == 1 + len(PROMPT_TAIL) else [
        int(x) for x in np.random.RandomState(1234).randint(3, VOCAB, size=length - 1)
    ]
    ids = [config.bos_token_id] + tail
    margin = min_router_margin(model, ids)
    if margin is not None and margin < MIN_ROUTER_MARGIN:
        return None
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].to(torch.float32).contiguous()
    rounding = None
    if name in CONDITIONING_CHECKED:
        rounding = reference_rounding(model, ids, logits)
        if rounding > MAX_REFERENCE_ROUNDING:
            print(f"{name}: seed {seed} rejected, f32 rounding moves the reference by {rounding:.1e}")
            return None
    return model, config, seed, ids, logits, margin, rounding


def build(name: str) -> dict:
    # Seeds are tried in order until the MoE routing has no near-tie (see min_router_margin)
    # and, for recurrent models, the reference's two algorithms agree within 1e-4 (their
    # disagreement is f32 rounding that these random hybrids amplify, and it sets the parity
    # tests' tolerance); the dense models always take the first.
    for seed in range(SEED, SEED + MAX_SEED_TRIES):
        candidate = draw(name, seed)
        if candidate is None:
            continue
        decode = incremental_logits(candidate[0], candidate[3])
        decode_diff = float((decode - candidate[4]).abs().max())
        if decode_diff <= 1e-4:
            break
        if name not in RECURRENT:
            raise SystemExit(f"{name}: token-by-token decode differs from the full pass by {decode_diff}")
        print(f"{name}: seed {seed} rejected, decode and the full pass differ by {decode_diff:.1e}")
    else:
        raise SystemExit(
            f"{name}: no seed in {MAX_SEED_TRIES} tries gives clear router margins and a reference "
            "that agrees with itself"
        )
    model, config, seed, ids, logits, margin, rounding = candidate

    out = FIXTURES_DIR / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out)
    saved_config = json.loads((out / "config.json").read_text())
    (out / "config.transformers4.json").write_text(
        json.dumps(transformers4_config(saved_config), indent=2, sort_keys=True) + "\n"
    )
    tensors = {"logits": logits}
    if name in RECURRENT:
        # transformers runs a recurrent layer's prompt with its chunked algorithm and each
        # decode step with the token-by-token one; they agree only to `decode_diff` in f32.
        # Token-by-token decode is checked against the latter, algorithm for algorithm.
        tensors["decode_logits"] = decode.to(torch.float32).contiguous()
    safetensors.torch.save_file(tensors, out / "logits.safetensors")

    probs = torch.softmax(logits, dim=-1)
    golden = {
        "fixture": name,
        "architecture": saved_config.get("architectures", [None])[0],
        "model_type": saved_config.get("model_type"),
        "prompt_ids": ids,
        "logits_file": "logits.safetensors",
        "logits_tensor": "logits",
        "logits_shape": list(logits.shape),
        "dtype": "float32",
        "seed": seed,
        "attn_implementation": "eager",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "max_abs_logit": float(logits.abs().max()),
        "mean_max_softmax_prob": float(probs.max(dim=-1).values.mean()),
        "argmax_ids": [int(i) for i in logits.argmax(dim=-1)],
        "decode_vs_full_max_abs_diff": decode_diff,
    }
    if margin is not None:
        golden["min_router_topk_margin"] = margin
    if rounding is not None:
        golden["f32_vs_f64_max_abs_diff"] = rounding
    for config_name, key in (
        ("config.transformers4.json", "mlx_lm_max_abs_diff"),
        ("config.json", "mlx_lm_max_abs_diff_reading_config_json"),
    ):
        try:
            mlx = mlx_lm_logits(out, config_name, ids)
        except Exception as error:  # mlx-lm is an optional cross-check; record why it failed
            golden[key] = f"error: {type(error).__name__}: {error}"
            continue
        if mlx is not None:
            mlx_logits, golden["mlx_lm_version"] = mlx
            golden[key] = float(np.abs(mlx_logits - logits.numpy()).max())
    (out / "golden.json").write_text(compact_json(golden))
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"fixtures to build (default: all of {list(FIXTURES)})")
    parser.add_argument(
        "--gguf",
        action="store_true",
        help=f"write model.gguf for committed fixtures instead (default: all of {list(GGUF_COPIES)})",
    )
    args = parser.parse_args()
    if args.gguf:
        for name in args.names or list(GGUF_COPIES):
            if name not in GGUF_COPIES:
                parser.error(f"no GGUF translation for {name}; known: {list(GGUF_COPIES)}")
            path = write_gguf(name)
            print(f"{name}: {path.stat().st_size / 1024:.0f} KiB GGUF")
        return
    names = args.names or list(FIXTURES) + list(VISION_FIXTURES)
    unknown = [n for n in names if n not in FIXTURES and n not in VISION_FIXTURES]
    if unknown:
        parser.error(f"unknown fixture(s) {unknown}; known: {list(FIXTURES) + list(VISION_FIXTURES)}")
    torch.set_num_threads(1)
    for name in names:
        golden = build_vision(name) if name in VISION_FIXTURES else build(name)
        size = sum(f.stat().st_size for f in (FIXTURES_DIR / name).iterdir())
        summary = {k: golden[k] for k in golden if k in (
            "max_abs_logit", "mean_max_softmax_prob", "decode_vs_full_max_abs_diff",
            "min_router_topk_margin", "f32_vs_f64_max_abs_diff", "mlx_lm_max_abs_diff",
            "mlx_lm_max_abs_diff_reading_config_json", "bidirectional_vs_causal_max_abs_diff")}
        print(f"{name}: {size / 1024:.0f} KiB {summary}")


if __name__ == "__main__":
    main()
