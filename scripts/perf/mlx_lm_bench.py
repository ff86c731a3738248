"""Greedy prefill/decode timing of mlx-lm on a local model folder, shaped like `mlxkit bench`.

Usage: perf-venv/bin/python mlx_lm_bench.py <model-dir> <prompt-tokens> <generate-tokens> <runs>

Prints one JSON line per run: prefill tok/s (prompt tokens over the time to the first token),
decode tok/s (tokens after the first over the time after it, as `mlxkit bench` counts) and peak
memory. It drives mlx-lm's own `generate_step` loop, ignoring end-of-sequence tokens so every run
decodes the same number of tokens.
"""

import json
import sys
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

path, prompt_tokens, generate_tokens, runs = sys.argv[1], *map(int, sys.argv[2:5])
model, tokenizer = load(path)
seed = "The quick brown fox jumps over the lazy dog while counting stars and telling stories. "
tokens = tokenizer.encode(seed * (prompt_tokens // 8 + 8))[:prompt_tokens]
for run in range(runs):
    prompt = list(tokens)
    # A different second token each run, as `mlxkit bench` does.
    prompt[1] = (prompt[1] + run + 1) % len(tokenizer.vocab)
    mx.reset_peak_memory()
    start = time.perf_counter()
    first = None
    n = 0
    for _token, _ in generate_step(mx.array(prompt), model, max_tokens=generate_tokens):
        n += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    print(
        json.dumps(
            {
                "run": run,
                "prompt_tokens": len(prompt),
                "prefill_tok_s": len(prompt) / (first - start),
                "generated_tokens": n,
                "decode_tok_s": (n - 1) / max(end - first, 1e-9),
                "peak_memory_bytes": mx.get_peak_memory(),
            }
        ),
        flush=True,
    )
