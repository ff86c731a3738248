#!/usr/bin/env python3
"""Constrained vs unconstrained decode speed, end to end through a running server.

Alternates the same greedy /api/generate request without and with a JSON Schema `format`
(A B A B ...) and reports decode tokens/s (eval_count / eval_duration) for each, their medians
with min-max, and the ratio constrained / unconstrained. Alternating keeps a noisy, shared
machine fair to both sides.

Usage:
    mlxkit serve &                      # release build: cargo run --release --bin mlxkit -- serve
    python3 scripts/bench-structured.py [--host http://127.0.0.1:11434] [--model smollm2:135m]
                                        [--runs 5] [--tokens 128]
"""

import argparse
import json
import statistics
import urllib.request

# Long enough that the answer runs to the token budget; every value bounded, so the grammar
# work per token is the realistic kind (keys, enums, numbers, short strings).
SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "maxItems": 40,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "city": {"type": "string", "maxLength": 20},
                    "role": {"enum": ["engineer", "artist", "doctor", "teacher"]},
                },
                "required": ["name", "age", "city", "role"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["people"],
    "additionalProperties": False,
}

PROMPT = "List forty people with their name, age, city and job, as JSON."


def generate(host, model, tokens, fmt):
    body = {
        "model": model,
        "prompt": PROMPT,
        "stream": False,
        "options": {"temperature": 0, "num_predict": tokens},
    }
    if fmt is not None:
        body["format"] = fmt
    request = urllib.request.Request(
        f"{host}/api/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        reply = json.load(response)
    if "error" in reply:
        raise SystemExit(f"server error: {reply['error']}")
    # The first token's time is prefill's; decode speed counts the rest.
    return (reply["eval_count"] - 1) / (reply["eval_duration"] / 1e9), reply["eval_count"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="http://127.0.0.1:11434")
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()

    generate(args.host, args.model, 8, None)  # load the model and warm the prompt cache
    results = {"unconstrained": [], "schema": [], "json": []}
    formats = {"unconstrained": None, "schema": SCHEMA, "json": "json"}
    for run in range(args.runs):
        for name, fmt in formats.items():
            speed, count = generate(args.host, args.model, args.tokens, fmt)
            results[name].append(speed)
            print(f"run {run} {name:>13}: {speed:6.2f} tok/s over {count} tokens", flush=True)

    base = statistics.median(results["unconstrained"])
    print(f"\n{'mode':>13} | median tok/s | min-max       | vs unconstrained")
    for name, speeds in results.items():
        median = statistics.median(speeds)
        print(
            f"{name:>13} | {median:12.2f} | {min(speeds):5.2f}-{max(speeds):5.2f} "
            f"| {median / base:6.3f}"
        )


if __name__ == "__main__":
    main()
