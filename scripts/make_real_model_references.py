#!/usr/bin/env python3
"""Reference greedy continuations and logits for the real models `nn` runs in CI.

For each real model of the catalog (`smollm2:135m`, Q4_1; `gemma3:270m`, k-quants), this loads
the very GGUF file that `quant::package::fetch` puts in the cache with Hugging Face
transformers, which dequantizes every tensor to float32, and records what that float model
does. `nn/tests/real_models.rs` loads the same file through `nn::load` and must agree.

Pinned reference stack (the versions the committed references were generated with):

    torch        == 2.15.0
    transformers == 5.24.0
    gguf         == 0.19.0     (transformers reads and dequantizes GGUF through it)
    accelerate   == 1.15.0     (transformers refuses GGUF loading without it)
    numpy        == 2.4.6
    safetensors  == 0.8.0
    optional, for the cross-check recorded in the JSON:
    mlx[cpu]     == 0.32.4
    mlx-lm       == 0.32.2

This script is run by hand; CI never runs it and never installs torch. Setup and usage are in
scripts/README.md:

    ~/.cache/mlxkit/fixtures-venv/bin/pip install gguf==0.19.0 accelerate==1.15.0
    ~/.cache/mlxkit/fixtures-venv/bin/python scripts/make_real_model_references.py [smollm2|gemma3 ...]

The GGUF files must already be in the cache (`$XDG_CACHE_HOME/mlxkit/models`, else
`~/.cache/mlxkit/models`): running `cargo test -p mlxkit-nn --release --test real_models` once fetches
them.

For every model it writes, under nn/tests/fixtures/real/:

    <model>.json                      prompt text and ids, the 16 greedy continuation ids and
                                      text, the 32-token logits prompt's ids, versions, checks
    <model>.last_logits.safetensors   one f32 tensor `logits` of shape [vocab]: the logits at
                                      the last position of the 32-token prompt
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import safetensors.numpy
import safetensors.torch
import torch
import transformers

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "nn" / "tests" / "fixtures" / "real"

# Reuse the transformers-4 config spelling from the tiny-fixture script: mlx-lm 0.32.2 ignores
# transformers 5's `rope_parameters` and would silently use rope base 10000.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import compact_json, transformers4_config  # noqa: E402

GREEDY_PROMPT = "Once upon a time, there was a little"
GREEDY_TOKENS = 16
# Any fixed English text longer than 32 tokens in both vocabularies; its ids are cut to 32.
LOGITS_TEXT = (
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a "
    "small brass lantern and a notebook in which he wrote down the ships he saw, the colour "
    "of the sky, and the direction of the wind."
)
LOGITS_PROMPT_LEN = 32

# What the task says each model must produce (models.md), checked, not assumed.
MODELS = {
    "smollm2": {
        "catalog_name": "smollm2:135m",
        "file": "smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "expected_text": "girl named Emma",
    },
    "gemma3": {
        "catalog_name": "gemma3:270m",
        "file": "gemma3-270m/gemma-3-270m-q4_k_m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "expected_text": "girl named Lily",
    },
}


def cache_dir() -> Path:
    """The same directory `quant::package::default_cache_dir` uses."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxkit" / "models"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@torch.no_grad()
def greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy continuation, recomputing the whole sequence each step (no cache to trust), and
    the gap between the best and second-best logit at each step: a small gap is a near-tie
    that f32 rounding in another implementation could legitimately flip."""
    sequence = list(ids)
    out, margins = [], []
    for _ in range(steps):
        logits = model(torch.tensor([sequence])).logits[0, -1]
        top = torch.topk(logits, 2)
        token = int(top.indices[0])
        margins.append(float(top.values[0] - top.values[1]))
        out.append(token)
        sequence.append(token)
    return out, margins


@torch.no_grad()
def cached_greedy(model, ids: list[int], steps: int) -> list[int]:
    """The same continuation through transformers' own KV cache, one token per forward, as
    the Rust test decodes; must equal `greedy`."""
    cache = transformers.DynamicCache(config=model.config)
    out = model(torch.tensor([ids]), cache=cache, use_cache=True)
    token = int(out.logits[0, -1].argmax())
    tokens = [token]
    for _ in range(steps - 1):
        out = model(torch.tensor([[token]]), cache=cache, use_cache=True)
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
    return tokens


def mlx_lm_last_logits(model, ids: list[int]) -> np.ndarray | None:
    """mlx-lm on the same dequantized weights (saved as safetensors with a transformers-4
    config), as an independent second opinion. None when mlx-lm is not installed."""
    try:
        import mlx.core as mx
        from mlx_lm.utils import load_model
    except ImportError:
        return None
    mx.set_default_device(mx.cpu)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        # save_pretrained refuses GGUF-loaded models; the dequantized tensors are plain f32.
        weights = {
            k: v.detach().contiguous().clone()
            for k, v in model.state_dict().items()
            if not (k == "lm_head.weight" and model.config.tie_word_embeddings)
        }
        safetensors.torch.save_file(weights, str(folder / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (folder / "config.json").write_text(json.dumps(transformers4_config(config)))
        mlx_model, _ = load_model(folder)
        logits = mlx_model(mx.array([ids]))[0, -1].astype(mx.float32)
        mx.eval(logits)
        return np.array(logits)


def build(name: str) -> dict:
    spec = MODELS[name]
    gguf = cache_dir() / spec["file"]
    if not gguf.is_file():
        sys.exit(
            f"{gguf} is missing: run `cargo test -p mlxkit-nn --release --test real_models` once to "
            "fetch it into the cache"
        )
    digest = sha256(gguf)
    if digest != spec["sha256"]:
        sys.exit(f"{gguf} has SHA-256 {digest}, expected {spec['sha256']}")

    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    # The GGUF tokenizer adds BOS exactly when the file's `add_bos_token` says so.
    prompt_ids = tokenizer(GREEDY_PROMPT)["input_ids"]
    continuation, margins = greedy(model, prompt_ids, GREEDY_TOKENS)
    if cached_greedy(model, prompt_ids, GREEDY_TOKENS) != continuation:
        sys.exit(f"{name}: transformers' cached decode disagrees with its full recompute")
    text = tokenizer.decode(continuation)
    if spec["expected_text"] not in text:
        sys.exit(f"{name}: greedy text {text!r} lacks {spec['expected_text']!r} (models.md)")

    logits_ids = tokenizer(LOGITS_TEXT)["input_ids"]
    if len(logits_ids) < LOGITS_PROMPT_LEN:
        sys.exit(f"{name}: the logits text has only {len(logits_ids)} tokens")
    logits_ids = logits_ids[:LOGITS_PROMPT_LEN]
    with torch.no_grad():
        last = model(torch.tensor([logits_ids])).logits[0, -1].float().numpy()

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(
        {"logits": np.ascontiguousarray(last, dtype=np.float32)},
        str(OUT_DIR / f"{name}.last_logits.safetensors"),
    )
    top5 = np.argsort(-last)[:5]
    reference = {
        "catalog_name": spec["catalog_name"],
        "gguf_sha256": digest,
        "dtype": "float32",
        "greedy_prompt": GREEDY_PROMPT,
        "add_bos_token": bool(getattr(tokenizer, "add_bos_token", False)),
        "greedy_prompt_ids": prompt_ids,
        "greedy_ids": continuation,
        "greedy_text": text,
        "greedy_top2_margins": [round(m, 4) for m in margins],
        "logits_prompt_text": tokenizer.decode(logits_ids),
        "logits_prompt_ids": logits_ids,
        "last_logits_shape": list(last.shape),
        "last_logits_argmax": int(top5[0]),
        "last_logits_top5_ids": [int(i) for i in top5],
        "max_abs_last_logit": float(np.abs(last).max()),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "gguf_version": version("gguf"),
    }
    mlx_last = mlx_lm_last_logits(model, logits_ids)
    if mlx_last is not None:
        reference["mlx_lm_version"] = version("mlx-lm")
        reference["mlx_lm_max_abs_diff"] = float(np.abs(mlx_last - last).max())
    (OUT_DIR / f"{name}.json").write_text(compact_json(reference))
    return reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(MODELS)} (default: all)")
    args = parser.parse_args()
    for name in args.names:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    # One thread fixes PyTorch's summation order, so a rerun reproduces the committed files.
    torch.set_num_threads(1)
    for name in args.names or list(MODELS):
        reference = build(name)
        summary = {k: reference.get(k) for k in (
            "greedy_text", "max_abs_last_logit", "mlx_lm_max_abs_diff")}
        summary["min_greedy_margin"] = min(reference["greedy_top2_margins"])
        print(name, json.dumps(summary))


if __name__ == "__main__":
    main()
