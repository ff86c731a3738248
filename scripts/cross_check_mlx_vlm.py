#!/usr/bin/env python3
"""Cross-check the drafter fixtures' references against mlx-vlm's own drafters (issue 49).

`nn/tests/mtp.rs` and `nn/tests/assistant.rs` hold mlxkit's drafters to references written
from each published layout (`make_mtp_fixture.py`) or run by transformers
(`make_assistant_fixture.py`). mlx-vlm implements several of these drafters for MLX; this
script loads the same fixture weights into mlx-vlm's classes, runs them on the same inputs,
and prints the worst difference from each reference, so a reading of the layout that both
the reference and mlxkit share but mlx-vlm does not would show here.

Covered, where mlx-vlm has the drafter (mlx-vlm 0.7.10 on MLX 0.32.4's CPU wheel):

    qwen3_5_mtp       mlx-vlm's Qwen3_5MTPDraftModel over the reference's positions, in one
                      forward from an empty cache (its norms are stored as w - 1, as the
                      checkpoint's are; mlx-vlm's splitter adds the 1, so does this script).
                      Measured: 6.7e-6 from the reference.
    gemma4_assistant  mlx-vlm's Gemma4AssistantDraftModel for the first drafting step, given
                      the target's keys and values as transformers computed them. Measured:
                      7.0e-2 from transformers, and 8.3e-7 from transformers with its sliding
                      layers given only the last `sliding_window - 1` positions: past the
                      window, mlx-vlm's sliding layers read two positions fewer than
                      transformers' (whose bidirectional window counts distances up to the
                      window inclusive). mlxkit follows transformers, the reference the
                      assistants were released with; which one the assistants were trained
                      with, neither says.

Not covered: DeepSeek-V3's head (mlx-vlm 0.7.10 has no DeepSeek-V3 or GLM-4-MoE-Lite backbone
to run its layer; its `glm4_moe_lite_mtp` only splits checkpoints).

Run by hand (CI never runs it):

    python3 -m venv /tmp/mlx-vlm-venv
    /tmp/mlx-vlm-venv/bin/pip install "mlx[cpu]==0.32.4" mlx-vlm==0.7.10
    /tmp/mlx-vlm-venv/bin/python scripts/cross_check_mlx_vlm.py
"""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "nn" / "tests" / "fixtures"

# The `+ 1` norms of Qwen3.5's head, as mlx-vlm's splitter lists them.
QWEN_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)


def qwen3_5_mtp() -> float:
    from mlx_vlm.models.cache import KVCache
    from mlx_vlm.speculative.drafters.qwen3_5_mtp import ModelConfig, Qwen3_5MTPDraftModel

    fixture = FIXTURES / "qwen3_5_mtp"
    text = json.loads((fixture / "config.json").read_text())
    config = ModelConfig.from_dict({"text_config": text})
    model = Qwen3_5MTPDraftModel(config)
    weights = mx.load(str(fixture / "model.safetensors"))
    head = {}
    for name, value in weights.items():
        if not name.startswith("mtp."):
            continue
        name = name[len("mtp."):]
        if name.endswith(QWEN_NORMS):
            value = value + 1.0
        head[name] = value
    model.load_weights(list(head.items()))
    reference = mx.load(str(fixture / "reference.safetensors"))
    tokens = reference["tokens"][None]
    embed = weights["model.embed_tokens.weight"][tokens]
    positions = mx.arange(tokens.shape[1], dtype=mx.int32)[None]
    out = model._forward_hidden(embed, reference["conditioning"], [KVCache()], positions)
    logits = out @ weights["lm_head.weight"].T
    return float(mx.max(mx.abs(logits - reference["logits"])))


def gemma4_assistant() -> float:
    from mlx_vlm.speculative.drafters.gemma4_assistant.config import Gemma4AssistantConfig
    from mlx_vlm.speculative.drafters.gemma4_assistant.gemma4_assistant import (
        Gemma4AssistantDraftModel,
    )

    fixture = FIXTURES / "gemma4_assistant"
    raw = json.loads((fixture / "config.json").read_text())
    # mlx-vlm reads the full layers' head width as the published configs spell it.
    text = dict(raw["text_config"])
    text["global_head_dim"] = text.pop("per_layer_config")["1"]["head_dim"]
    config = Gemma4AssistantConfig.from_dict({**raw, "text_config": text})
    model = Gemma4AssistantDraftModel(config)
    weights = mx.load(str(fixture / "model.safetensors"))
    weights["masked_embedding.token_ordering"] = weights[
        "masked_embedding.token_ordering"
    ].astype(mx.int32)
    model.load_weights(list(weights.items()))
    model.bind(object())
    reference = mx.load(str(fixture / "reference.safetensors"))
    shared = {
        "full_attention": (reference["full_keys"], reference["full_values"]),
        "sliding_attention": (reference["sliding_keys"], reference["sliding_values"]),
    }
    position = reference["prompt"].shape[0]
    model.set_shared_kv(shared, kv_offset=position)
    _, logits = model(reference["first_inputs"], shared, mx.array([[position]]))
    vocab = logits.shape[-1]
    as_transformers = float(mx.max(mx.abs(logits[0, 0] - reference["chain_logits"][0, 0, :vocab])))
    narrow = float(mx.max(mx.abs(logits[0, 0] - reference["narrow_logits"][0, 0])))
    print(
        f"gemma4_assistant: first step against transformers {as_transformers:.3e}; "
        f"against transformers with the sliding layers reading the last window - 1 "
        f"positions {narrow:.3e}"
    )
    return narrow


def main() -> None:
    print(f"qwen3_5_mtp: worst difference from the reference {qwen3_5_mtp():.3e}")
    gemma4_assistant()


if __name__ == "__main__":
    main()
