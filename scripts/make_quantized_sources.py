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
    nvfp4_modelopt    NVIDIA ModelOpt NVFP4: packed E2M1 `weight` (two per byte), E4M3
                      `weight_scale` per 16 values, f32 `weight_scale_2` per tensor.
    nvfp4_compressed  compressed-tensors NVFP4 ("nvfp4-pack-quantized"): `weight_packed`, E4M3
                      `weight_scale`, and `weight_global_scale`, the reciprocal of ModelOpt's
                      second scale, divided by.

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


def fresh_folder(name: str) -> Path:
    folder = OUT / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def build(name: str, per_block: bool) -> None:
    folder = fresh_folder(name)
    tensors, reference = {}, {}
    for tensor, (shape, values) in read_safetensors(SOURCE / "model.safetensors").items():
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


# E2M1 (FP4) magnitudes by code 0..7; bit 3 is the sign.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
NVFP4_GROUP = 16


def e2m1_encode(x: float) -> int:
    """Nearest E2M1 code to x (clamped to +-6), ties to the even code."""
    sign = 0x8 if x < 0 else 0
    a = min(abs(x), 6.0)
    i = bisect.bisect_left(E2M1, a)
    if i == 0:
        return sign
    if i == len(E2M1):
        return sign | 7
    lo, hi = E2M1[i - 1], E2M1[i]
    if a - lo < hi - a:
        code = i - 1
    elif a - lo > hi - a:
        code = i
    else:
        code = i - 1 if (i - 1) % 2 == 0 else i
    return sign | code


def e2m1_value(code: int) -> float:
    return (-1.0 if code & 0x8 else 1.0) * E2M1[code & 0x7]


def nvfp4(values: list[float], rows: int, cols: int):
    """NVIDIA's two-level NVFP4 recipe (ModelOpt): a global f32 scale amax / (6 * 448), an E4M3
    scale per 16 values (block amax / 6, divided by the global scale), E2M1 values. Returns the
    packed bytes (element 2i in the low nibble), the scale codes, the global scale and the f32
    dequantization E2M1 * E4M3 * global."""
    amax = max(abs(v) for v in values)
    global_scale = f32(amax / (6.0 * E4M3_MAX)) if amax > 0 else 1.0
    packed = bytearray(rows * cols // 2)
    scale_codes = bytearray(rows * cols // NVFP4_GROUP)
    dequantized = [0.0] * (rows * cols)
    for r in range(rows):
        for g in range(cols // NVFP4_GROUP):
            block = values[r * cols + g * NVFP4_GROUP : r * cols + (g + 1) * NVFP4_GROUP]
            block_amax = max(abs(v) for v in block)
            scale_code = e4m3_encode(f32(f32(block_amax / 6.0) / global_scale))
            scale_codes[r * (cols // NVFP4_GROUP) + g] = scale_code
            scale = f32(e4m3_value(scale_code) * global_scale)
            for k, v in enumerate(block):
                code = e2m1_encode(v / scale) if scale > 0 else 0
                index = r * cols + g * NVFP4_GROUP + k
                packed[index // 2] |= code << (4 * (index % 2))
                dequantized[index] = f32(f32(e2m1_value(code) * e4m3_value(scale_code)) * global_scale)
    return bytes(packed), bytes(scale_codes), global_scale, dequantized


def build_nvfp4(name: str, compressed_tensors: bool) -> None:
    folder = fresh_folder(name)
    tensors, reference = {}, {}
    for tensor, (shape, values) in read_safetensors(SOURCE / "model.safetensors").items():
        module = tensor.removesuffix(".weight")
        if not (tensor.endswith(".weight") and module.split(".")[-1] in QUANTIZED):
            tensors[tensor] = ("F32", shape, f32_bytes(values))
            continue
        rows, cols = shape
        packed, scale_codes, global_scale, dequantized = nvfp4(values, rows, cols)
        scale_shape = [rows, cols // NVFP4_GROUP]
        if compressed_tensors:
            # compressed-tensors stores the reciprocal global scale and divides by it.
            tensors[f"{module}.weight_packed"] = ("U8", [rows, cols // 2], packed)
            tensors[f"{module}.weight_scale"] = ("F8_E4M3", scale_shape, scale_codes)
            tensors[f"{module}.weight_global_scale"] = ("F32", [1], f32_bytes([f32(1.0 / global_scale)]))
            tensors[f"{module}.input_global_scale"] = ("F32", [1], f32_bytes([1.0]))
            dequantized = [
                f32(f32(e2m1_value(code) * e4m3_value(scale_codes[i // NVFP4_GROUP]))
                    / f32(1.0 / global_scale))
                for i, code in enumerate((packed[i // 2] >> (4 * (i % 2))) & 0xF for i in range(rows * cols))
            ]
        else:
            tensors[tensor] = ("U8", [rows, cols // 2], packed)
            tensors[f"{module}.weight_scale"] = ("F8_E4M3", scale_shape, scale_codes)
            tensors[f"{module}.weight_scale_2"] = ("F32", [], f32_bytes([global_scale]))
            tensors[f"{module}.input_scale"] = ("F32", [], f32_bytes([1.0]))
        reference[tensor] = ("F32", shape, f32_bytes(dequantized))
    write_safetensors(folder / "model.safetensors", tensors)
    write_safetensors(folder / "reference.safetensors", reference)
    config = json.loads((SOURCE / "config.json").read_text())
    if compressed_tensors:
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": NVFP4_GROUP, "symmetric": True},
                }
            },
            "ignore": ["lm_head"],
        }
    else:
        config["quantization_config"] = {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": NVFP4_GROUP,
            "exclude_modules": ["lm_head"],
        }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {folder}")


if __name__ == "__main__":
    build("fp8_block", per_block=True)
    build("fp8_channel", per_block=False)
    build_nvfp4("nvfp4_modelopt", compressed_tensors=False)
    build_nvfp4("nvfp4_compressed", compressed_tensors=True)
