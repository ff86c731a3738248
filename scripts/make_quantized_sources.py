#!/usr/bin/env python3
"""Build tiny FP8 checkpoints in the layouts other quantizers publish, for `quant`'s import tests.

From the tiny Llama fixture (nn/tests/fixtures/llama, f32 weights), it writes under
quant/tests/fixtures/<name>/:

    fp8_block    HF "fine-grained" FP8, as DeepSeek-V3 and Qwen3-FP8 ship: every linear
                 weight as F8_E4M3 with an f32 `weight_scale_inv` per 48x48 block (the
                 released models use 128x128; 48 does not divide the fixture's 64 and 128, so
                 partial edge blocks are exercised); `quantization_config.quant_method = fp8`.
    fp8_channel  compressed-tensors FP8 ("float-quantized", channel strategy), as
                 llm-compressor writes it: F8_E4M3 weights with an f32 `weight_scale` per
                 output row.

Each folder also holds `reference.safetensors`: every quantized weight dequantized to f32 by
the reference formula (E4M3 value times its scale), which the tests compare the import with.

The quantizer is the public reference one: scale = amax / 448 over the block (or row), values
divided by the scale, clamped to the E4M3 range and rounded to the nearest E4M3 value (ties to
even), as torch's `to(torch.float8_e4m3fn)` does. Pure Python with no dependencies; run by
hand by whoever changes a fixture:

    python3 scripts/make_quantized_sources.py
"""

from __future__ import annotations

import bisect
import json
import math
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "nn/tests/fixtures/llama"
OUT = ROOT / "quant/tests/fixtures"
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
E4M3_MAX = 448.0
BLOCK = 48


def e4m3_value(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exponent = (code >> 3) & 0xF
    mantissa = code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8.0 * 2.0**-6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


# Non-negative finite codes in increasing value: 0x00 .. 0x7E.
POSITIVE = [(e4m3_value(c), c) for c in range(0x7F)]
VALUES = [v for v, _ in POSITIVE]


def e4m3_encode(x: float) -> int:
    """Nearest E4M3 code to x (clamped to +-448), ties to the even code."""
    sign = 0x80 if x < 0 or (x == 0 and math.copysign(1.0, x) < 0) else 0
    a = min(abs(x), E4M3_MAX)
    i = bisect.bisect_left(VALUES, a)
    if i == 0:
        code = POSITIVE[0][1]
    elif i == len(VALUES):
        code = POSITIVE[-1][1]
    else:
        lo, hi = POSITIVE[i - 1], POSITIVE[i]
        if a - lo[0] < hi[0] - a:
            code = lo[1]
        elif a - lo[0] > hi[0] - a:
            code = hi[1]
        else:
            code = lo[1] if lo[1] % 2 == 0 else hi[1]
    return sign | code


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def read_safetensors(path: Path) -> dict[str, tuple[list[int], list[float]]]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", (name, entry["dtype"])
        start, end = entry["data_offsets"]
        count = (end - start) // 4
        out[name] = (entry["shape"], list(struct.unpack(f"<{count}f", data[base + start : base + end])))
    return out


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(tensors[name][2])


def f32_bytes(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def quantize(values: list[float], rows: int, cols: int, scale_of) -> tuple[bytes, list[float]]:
    """E4M3 codes of values / scale_of(r, c), and the f32 dequantized values."""
    codes = bytearray(rows * cols)
    dequantized = [0.0] * (rows * cols)
    for r in range(rows):
        for c in range(cols):
            scale = scale_of(r, c)
            code = e4m3_encode(values[r * cols + c] / scale)
            codes[r * cols + c] = code
            dequantized[r * cols + c] = f32(e4m3_value(code) * scale)
    return bytes(codes), dequantized


def amax_scale(amax: float) -> float:
    return f32(amax / E4M3_MAX) if amax > 0 else 1.0


def build(name: str, per_block: bool) -> None:
    weights = read_safetensors(SOURCE / "model.safetensors")
    folder = OUT / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tensors, reference = {}, {}
    for tensor, (shape, values) in weights.items():
        module = tensor.removesuffix(".weight")
        if not (tensor.endswith(".weight") and module.split(".")[-1] in QUANTIZED):
            tensors[tensor] = ("F32", shape, f32_bytes(values))
            continue
        rows, cols = shape
        if per_block:
            brows, bcols = -(-rows // BLOCK), -(-cols // BLOCK)
            scales = []
            for br in range(brows):
                for bc in range(bcols):
                    block = [
                        abs(values[r * cols + c])
                        for r in range(br * BLOCK, min(rows, (br + 1) * BLOCK))
                        for c in range(bc * BLOCK, min(cols, (bc + 1) * BLOCK))
                    ]
                    scales.append(amax_scale(max(block)))
            codes, dequantized = quantize(
                values, rows, cols, lambda r, c: scales[(r // BLOCK) * bcols + c // BLOCK]
            )
            tensors[f"{module}.weight_scale_inv"] = ("F32", [brows, bcols], f32_bytes(scales))
        else:
            scales = [amax_scale(max(abs(v) for v in values[r * cols : (r + 1) * cols])) for r in range(rows)]
            codes, dequantized = quantize(values, rows, cols, lambda r, c: scales[r])
            tensors[f"{module}.weight_scale"] = ("F32", [rows, 1], f32_bytes(scales))
        tensors[tensor] = ("F8_E4M3", shape, codes)
        reference[tensor] = ("F32", shape, f32_bytes(dequantized))
    write_safetensors(folder / "model.safetensors", tensors)
    write_safetensors(folder / "reference.safetensors", reference)

    config = json.loads((SOURCE / "config.json").read_text())
    if per_block:
        config["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [BLOCK, BLOCK],
        }
    else:
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
                }
            },
            "ignore": ["lm_head"],
        }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {folder}")


if __name__ == "__main__":
    build("fp8_block", per_block=True)
    build("fp8_channel", per_block=False)
