"""Writes an f32 Hugging Face folder from a GGUF file, for running mlx-lm on the same weights.

Usage: fixtures-venv/bin/python export_hf.py <dir-with-gguf> <gguf-file-name> <out-dir>

transformers dequantizes the GGUF (and undoes llama's Q/K row permutation), so mlx-lm then
computes with exactly the weights mlxkit dequantizes at load.
"""

import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

src, name, out = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
# transformers refuses to re-serialize a model it loaded from GGUF; the tensors are plain f32
# by now, so write them directly (a tied head is the embedding table, not a second copy).
state = {k: v.contiguous() for k, v in model.state_dict().items()}
if model.config.tie_word_embeddings:
    state.pop("lm_head.weight", None)
os.makedirs(out, exist_ok=True)
save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
model.config.save_pretrained(out)
# mlx-lm reads the older config spellings and would default a missing rope base silently; it
# must not see the GGUF quantization note either (the tensors are dense now).
config_path = os.path.join(out, "config.json")
with open(config_path) as f:
    config = json.load(f)
config.pop("quantization_config", None)
rope = config.get("rope_parameters") or {}
if "rope_theta" in rope:
    config.setdefault("rope_theta", rope["rope_theta"])
for kind, params in rope.items():
    # Gemma 3 keeps one entry per attention kind.
    if isinstance(params, dict) and kind == "sliding_attention":
        config.setdefault("rope_local_base_freq", params.get("rope_theta"))
    elif isinstance(params, dict) and kind == "full_attention":
        config.setdefault("rope_theta", params.get("rope_theta"))
with open(config_path, "w") as f:
    json.dump(config, f, indent=2)
AutoTokenizer.from_pretrained(src, gguf_file=name).save_pretrained(out)
print("wrote", out)
