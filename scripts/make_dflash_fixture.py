#!/usr/bin/env python3
"""Build the tiny DFlash block-drafter fixture (issue 49) and its reference, from mlx-vlm.

A DFlash drafter proposes a whole block of tokens in one forward. Its context is the target's
own hidden states at a few layers (`target_layer_ids`: layer i's output), concatenated per
position, projected by `fc` and normed by `hidden_norm`; each of its decoder layers (Qwen3's:
q/k norms per head, rotary embedding, a gated MLP) attends from the block's queries over the
keys and values of that context (cached, at the target's positions) and of the block itself
(not cached), with no causal mask. The block is the round's first token (the last committed,
at position P) followed by `block_size - 1` copies of `mask_token_id`, embedded by the target;
the normed outputs at the mask positions go through the target's output head, one draft each.
The draft has no embedding or head of its own.

This script draws a one-layer drafter over the committed `llama` fixture's two layers (taps at
0 and 1, block of 4, mask token 500) in the checkpoint layout DFlash drafters ship (`fc`,
`hidden_norm`, `layers.*`, `norm`, with `dflash_config` in config.json), and records what
mlx-vlm's own `qwen3_dflash` drafter gives for two rounds, in float32 (MLX's CPU dtype):

    nn/tests/fixtures/dflash/
        config.json, model.safetensors
        reference.safetensors
            context1 [1, 10, 2H] f32: the first round's context rows (positions 0..10), drawn
            block1   [1, 4]      i32: its block ([first, mask, mask, mask], first at 10)
            logits1  [1, 3, V]   f32: its drafts' logits
            context2 [1, 3, 2H]  f32: the second round's new context rows (positions 10..13)
            block2   [1, 4]      i32: its block (first at 13)
            logits2  [1, 3, V]   f32: its drafts' logits, over all 13 context rows

Run by hand, once (CI never runs it), in a venv with mlx-vlm on MLX's CPU wheel:

    python3 -m venv /tmp/mlx-vlm-venv
    /tmp/mlx-vlm-venv/bin/pip install "mlx[cpu]==0.32.4" mlx-vlm==0.7.10
    /tmp/mlx-vlm-venv/bin/python scripts/make_dflash_fixture.py
"""

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_vlm.speculative.drafters.qwen3_dflash import DFlashDraftModel, ModelConfig

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "nn" / "tests" / "fixtures"
SEED = 49
TAPS = [0, 1]
BLOCK = 4
MASK = 500


def main() -> None:
    rng = np.random.default_rng(SEED)
    target_config = json.loads((FIXTURES / "llama" / "config.json").read_text())
    target = mx.load(str(FIXTURES / "llama" / "model.safetensors"))
    hidden = target_config["hidden_size"]
    vocab = target_config["vocab_size"]
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": 96,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": BLOCK,
        "num_target_layers": target_config["num_hidden_layers"],
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TAPS},
    }
    model = DFlashDraftModel(ModelConfig.from_dict(config))
    weights = {}
    for name, value in nn.utils.tree_flatten(model.parameters()):
        if name.endswith("norm.weight"):
            drawn = 1.0 + rng.standard_normal(value.shape) * 0.3
        else:
            drawn = rng.standard_normal(value.shape) * 0.5
        weights[name] = mx.array(drawn.astype(np.float32))
    model.load_weights(list(weights.items()))

    class Target(nn.Module):
        """What the drafter borrows: the target's embedding and output head."""

        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, hidden)
            self.embed_tokens.weight = target["model.embed_tokens.weight"]

    model.bind(Target())
    cache = model.make_cache()
    context1 = mx.array(rng.standard_normal((1, 10, len(TAPS) * hidden)).astype(np.float32))
    block1 = mx.array([[int(rng.integers(3, 400))] + [MASK] * (BLOCK - 1)], dtype=mx.int32)
    logits1 = model(block1, context1, cache)[:, 1:]
    context2 = mx.array(rng.standard_normal((1, 3, len(TAPS) * hidden)).astype(np.float32))
    block2 = mx.array([[int(rng.integers(3, 400))] + [MASK] * (BLOCK - 1)], dtype=mx.int32)
    logits2 = model(block2, context2, cache)[:, 1:]

    out = FIXTURES / "dflash"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    mx.save_safetensors(
        str(out / "reference.safetensors"),
        {
            "context1": context1,
            "block1": block1,
            "logits1": logits1,
            "context2": context2,
            "block2": block2,
            "logits2": logits2,
        },
    )
    drafts = [mx.argmax(l, axis=-1).tolist() for l in (logits1, logits2)]
    print(f"wrote {out}: drafts {drafts}")


if __name__ == "__main__":
    main()
