"""How far mlx-lm in bf16 lands from mlx-lm in f32 on a tiny parity fixture.

The same measure nn/tests/parity.rs applies to mlxkit in bf16 (issue 45): both runs read the
fixture's weights rounded to bf16, so only the arithmetic differs, and the result is the worst
log-probability difference at each position. It shows whether a fixture that mlxkit cannot hold
to the bf16 bound is just as far off in the reference implementation. Needs `mlx[cpu]` and
`mlx-lm` (0.32.2 was measured); run from the repository root:

    python scripts/mlx_lm_bf16_error.py qwen3_5 nemotron_h_moe ...

mlx-lm reads `config.transformers4.json` (it ignores transformers 5's `rope_parameters`), and
Qwen3.5's text-only `model_type` is given as the multimodal one, which mlx-lm knows.
"""

import json
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_model

FIXTURES = Path(__file__).resolve().parent.parent / "nn" / "tests" / "fixtures"

# MLX's CPU gather_mm takes only f32 (0.32.4): bf16 experts are multiplied in f32 and the
# product rounded back, as mlxkit does on a CPU.
_gather_mm = mx.gather_mm


def _gather_mm_any_dtype(a, b, lhs_indices=None, rhs_indices=None, *, sorted_indices=False):
    product = _gather_mm(
        a.astype(mx.float32),
        b.astype(mx.float32),
        lhs_indices,
        rhs_indices,
        sorted_indices=sorted_indices,
    )
    return product.astype(a.dtype)


mx.gather_mm = _gather_mm_any_dtype


def logits(name: str, dtype) -> np.ndarray:
    fixture = FIXTURES / name
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        weights = mx.load(str(fixture / "model.safetensors"))
        weights = {
            k: v.astype(mx.bfloat16).astype(dtype) if v.dtype == mx.float32 else v
            for k, v in weights.items()
        }
        mx.save_safetensors(str(folder / "model.safetensors"), weights)
        config = json.loads((fixture / "config.transformers4.json").read_text())
        config["model_type"] = config["model_type"].removesuffix("_text")
        (folder / "config.json").write_text(json.dumps(config))
        model, _ = load_model(folder)
        model.set_dtype(dtype)
        ids = json.loads((fixture / "golden.json").read_text())["prompt_ids"]
        out = model(mx.array([ids]))
        mx.eval(out)
        return np.array(out[0].astype(mx.float32)).astype(np.float64)


def log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def main() -> None:
    mx.set_default_device(mx.cpu)
    for name in sys.argv[1:]:
        error = np.abs(
            log_softmax(logits(name, mx.bfloat16)) - log_softmax(logits(name, mx.float32))
        ).max(-1)
        worst = np.argsort(-error)[:4]
        print(
            f"{name}: mlx-lm bf16 against f32, worst log-probability error {error.max():.2f}; "
            "largest at positions " + ", ".join(f"{p} ({error[p]:.2f})" for p in worst)
        )


if __name__ == "__main__":
    main()
