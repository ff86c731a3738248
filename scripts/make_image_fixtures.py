#!/usr/bin/env python3
"""Build the image preprocessing fixtures that media/tests/hf_preprocess.rs reads.

Pinned reference stack (the versions the committed fixtures were generated with):

    torch        == 2.15.0
    torchvision  == 0.29.2   (transformers' default "torchvision" image-processor backend)
    transformers == 5.24.0
    pillow       == 13.0.0   (the "pil" backend, and the decoder HF users load images with)
    numpy        == 2.4.6

Run by hand, once, by whoever changes a fixture; CI never runs it. Setup (scripts/README.md):

    python3 -m venv ~/.cache/mlxkit/fixtures-venv
    ~/.cache/mlxkit/fixtures-venv/bin/pip install torch==2.15.0 torchvision==0.29.2 \
        transformers==5.24.0 pillow==13.0.0 safetensors numpy
    ~/.cache/mlxkit/fixtures-venv/bin/python scripts/make_image_fixtures.py

What it writes under media/tests/fixtures/hf_preprocess/:

    <name>.<png|jpg|webp>   three small, non-square, photo-like images drawn from a seeded
                            generator and encoded by Pillow at fixed settings: an RGBA PNG with
                            transparent and half-transparent regions, a 4:2:0 JPEG (quality 85,
                            as cameras write) and a lossy WebP (quality 80). These are the inputs.
    <name>.decoded.u8       Pillow's decode, as HF's processors receive it after `convert_rgb`
                            (PIL's alpha_composite over opaque white for the PNG), H x W x 3.
    <name>.<case>.u8        the processor's pixels before rescale/normalise (do_rescale and
                            do_normalize off, everything else as configured), H x W x 3 u8.
    <name>.<case>.f32       the processor's `pixel_values` with its defaults, 3 x H x W,
                            little-endian f32 (only for the small cases).
    gemma3_896.png          the large cases (Gemma 3's real 896 x 896 on the JPEG, LLaVA 1.5's
    llava_336.png           336 x 336 on the PNG, both enlarging) as lossless PNGs of the u8
                            pixels before rescale/normalise.
    manifest.json           every case: image, processor class, backend, size, the config
                            that `preprocessor_config.json` would hold, shapes and files.

<case> is `<processor>_<backend>`: processor `gemma3` (Gemma3ImageProcessor: bilinear resize
straight to size x size, rescale 1/255, normalise 0.5/0.5) or `clip` (CLIPImageProcessor:
bicubic resize of the shortest edge to size, centre crop size x size, CLIP mean/std) or `llava`
(LlavaImageProcessor without `do_pad`, as llava-hf configures it: CLIP's steps, checked at 336
to give CLIPImageProcessor's pixels exactly, `same_as_clip` in the manifest); backend
`torchvision` (the default AutoImageProcessor picks when torchvision is installed: a uint8
tensor resized by torch's antialiased kernels) or `pil` (`*ImageProcessorPil`: PIL.Image.resize).

Qwen2-VL's dynamic-resolution processor (Qwen2VLImageProcessor, which Qwen2.5-VL keeps) adds
`<name>.qwen2_vl_<backend>` cases (and `photo_webp.qwen2_vl_up_<backend>`, resized up by its
min_pixels): the same u8 pixels before rescale/normalise (as `.u8`, or `.png` for the large
upscaled one), `.f32` for the small pil cases only (the normalised image taken back out of its
patches, 3 x H x W), and in the manifest the grid (`image_grid_thw`), the patch row length and
the sha256 of `pixel_values` as little-endian f32 — the patches themselves, in the processor's
order, are several times the image's size. `qwen2_vl_smart_resize` in the manifest holds
transformers' smart_resize on a table of sizes (ties, thin strips, both budgets).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import PIL
import PIL.Image
import torch
import torchvision
import transformers
from transformers import (
    CLIPImageProcessor,
    CLIPImageProcessorPil,
    Gemma3ImageProcessor,
    Gemma3ImageProcessorPil,
    LlavaImageProcessor,
    LlavaImageProcessorPil,
    Qwen2VLImageProcessor,
    Qwen2VLImageProcessorPil,
)
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
from transformers.models.auto.image_processing_auto import _resolve_backend

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = REPO_ROOT / "media" / "tests" / "fixtures" / "hf_preprocess"
SMALL = 64
LARGE = 896
LLAVA = 336

# name, width, height, format; sizes chosen so that 64 * long / short is not an integer and
# rounds differently from how it truncates (HF truncates the long side: 150x113 -> 84 not 85,
# 107x160 -> 95 not 96, 176x99 -> 113 not 114).
IMAGES = [
    ("rgba_png", 150, 113, "png"),
    ("photo_jpeg", 107, 160, "jpg"),
    ("photo_webp", 176, 99, "webp"),
]

PROCESSORS = {
    "gemma3": {
        "torchvision": Gemma3ImageProcessor,
        "pil": Gemma3ImageProcessorPil,
        "kwargs": lambda size: {"size": {"height": size, "width": size}},
    },
    "clip": {
        "torchvision": CLIPImageProcessor,
        "pil": CLIPImageProcessorPil,
        "kwargs": lambda size: {
            "size": {"shortest_edge": size},
            "crop_size": {"height": size, "width": size},
        },
    },
    "llava": {
        "torchvision": LlavaImageProcessor,
        "pil": LlavaImageProcessorPil,
        "kwargs": lambda size: {
            "size": {"shortest_edge": size},
            "crop_size": {"height": size, "width": size},
        },
        # Only at LLaVA's size, on one image: its 64-pixel cases would repeat CLIP's.
        "small": False,
    },
}


# Qwen2-VL's processor at its real patch (14), merge (2) and frame (2) sizes, with a pixel budget
# that shrinks the fixtures to 56-84 pixels a side (its own default, 28 * 28 * 1280, would keep
# them near their size); the upscaled case lifts photo_webp (176x99) by min_pixels to 252x140.
QWEN2_VL = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 8}
QWEN2_VL_UP = {"min_pixels": 28 * 28 * 40, "max_pixels": 28 * 28 * 1280}
QWEN2_VL_CLASSES = {"torchvision": Qwen2VLImageProcessor, "pil": Qwen2VLImageProcessorPil}


def unpatchify(patches: np.ndarray, grid: list[int], patch: int, merge: int, frames: int) -> np.ndarray:
    """The 3 x H x W image of Qwen2-VL's patches (checking every frame is the same)."""
    t, gh, gw = grid
    assert t == 1, grid
    x = patches.reshape(gh // merge, gw // merge, merge, merge, 3, frames, patch, patch)
    for f in range(1, frames):
        assert np.array_equal(x[..., f, :, :], x[..., 0, :, :]), "frames differ"
    x = x[..., 0, :, :]  # [bh, bw, mh, mw, c, p, p]
    return np.ascontiguousarray(x.transpose(4, 0, 2, 5, 1, 3, 6).reshape(3, gh * patch, gw * patch))


def qwen2_vl_case(name: str, pil, backend: str, budget: dict, suffix: str) -> tuple[dict, dict]:
    """One Qwen2VLImageProcessor run: the manifest entry and the files to write."""
    cls = QWEN2_VL_CLASSES[backend]
    raw = cls(**budget, do_rescale=False, do_normalize=False)(images=pil, return_tensors="np")
    out = cls(**budget)(images=pil, return_tensors="np")
    grid = [int(v) for v in out["image_grid_thw"][0]]
    patch, merge, frames = cls.patch_size, cls.merge_size, cls.temporal_patch_size
    u8 = unpatchify(np.asarray(raw["pixel_values"]), grid, patch, merge, frames)
    assert np.array_equal(u8, np.rint(u8)) and u8.min() >= 0 and u8.max() <= 255
    hwc = np.ascontiguousarray(u8.transpose(1, 2, 0)).astype(np.uint8)
    values = np.asarray(out["pixel_values"]).astype("<f4")
    case = f"{name}.qwen2_vl{suffix}_{backend}"
    processor = cls(**budget)
    cfg = json.loads(processor.to_json_string())
    entry = {
        "name": case,
        "image": name,
        "processor": "qwen2_vl",
        "class": cls.__name__,
        "backend": backend,
        "config": {k: cfg[k] for k in (
            "image_processor_type", "size", "resample", "do_rescale", "rescale_factor",
            "do_normalize", "image_mean", "image_std", "patch_size", "temporal_patch_size",
            "merge_size", "do_convert_rgb") if k in cfg},
        "height": int(hwc.shape[0]),
        "width": int(hwc.shape[1]),
        "image_grid_thw": grid,
        "patch_len": int(values.shape[1]),
        "pixel_values_shape": list(values.shape),
        "pixel_values_sha256": hashlib.sha256(values.tobytes()).hexdigest(),
        "u8_sha256": hashlib.sha256(hwc.tobytes()).hexdigest(),
    }
    files = {}
    if suffix:
        entry["png"] = f"{case}.png"
        files[entry["png"]] = ("png", hwc)
    else:
        entry["u8"] = f"{case}.u8"
        files[entry["u8"]] = ("raw", hwc.tobytes())
    if backend == "pil" and not suffix:
        f32 = unpatchify(values, grid, patch, merge, frames)
        entry["f32"] = f"{case}.f32"
        files[entry["f32"]] = ("raw", f32.astype("<f4").tobytes())
    return entry, files


def smart_resize_table() -> list[dict]:
    """transformers' smart_resize on sizes that exercise each branch and Python's rounding."""
    rows = []
    sizes = [(113, 150), (160, 107), (99, 176), (70, 98), (42, 126), (14, 14), (10, 1900),
             (1900, 10), (3000, 4000), (1080, 1920), (224, 224), (98, 70), (126, 42), (29, 2900),
             (500, 1), (6000, 30), (57, 85), (55, 83), (2, 3)]
    budgets = [(56 * 56, 28 * 28 * 1280), (28 * 28 * 40, 28 * 28 * 1280), (56 * 56, 28 * 28 * 8),
               (0, 28 * 28 * 4), (3136, 3136)]
    for h, w in sizes:
        for factor in (28, 32):
            for lo, hi in budgets:
                try:
                    out = [int(v) for v in smart_resize(h, w, factor=factor, min_pixels=lo, max_pixels=hi)]
                except ValueError:
                    out = None
                rows.append({"height": h, "width": w, "factor": factor, "min_pixels": lo,
                             "max_pixels": hi, "out": out})
    return rows


def photo_like(width: int, height: int, seed: int, alpha: bool) -> np.ndarray:
    """Smooth gradients, a textured band, hard-edged shapes and sensor-like noise."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    u, v = x / width, y / height
    r = 40 + 170 * u + 30 * np.sin(6.0 * v + 1.0)
    g = 60 + 120 * v + 40 * np.cos(5.0 * u * v * 3.0)
    b = 200 - 150 * u * v + 25 * np.sin(11.0 * u)
    img = np.stack([r, g, b], axis=-1)
    # A high-frequency texture band (foliage, fabric) and a few hard edges (a window, a sign).
    band = (v > 0.55) & (v < 0.75)
    img[band] += (40 * np.sin(1.7 * x[band]) * np.cos(1.3 * y[band]))[:, None]
    for _ in range(4):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rad = rng.uniform(0.08, 0.2) * min(width, height)
        colour = rng.uniform(0, 255, size=3)
        disc = (x - cx) ** 2 + (y - cy) ** 2 < rad**2
        img[disc] = colour
    x0, y0 = int(0.6 * width), int(0.1 * height)
    img[y0 : y0 + height // 5, x0 : x0 + width // 4] = [250, 250, 240]
    img[y0 + 3 : y0 + height // 5 - 3, x0 + 3 : x0 + width // 4 - 3] = [20, 30, 35]
    img += rng.normal(0.0, 3.0, size=img.shape)
    img = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    if not alpha:
        return img
    # Opaque left part, a ramp to fully transparent on the right, a transparent hole and a
    # half-transparent disc, so compositing over white is exercised at every alpha.
    a = np.clip(255 * (1.6 - 2.0 * u), 0, 255)
    a[(x - 0.3 * width) ** 2 + (y - 0.5 * height) ** 2 < (0.12 * height) ** 2] = 0
    a[(x - 0.5 * width) ** 2 + (y - 0.3 * height) ** 2 < (0.15 * height) ** 2] = 128
    return np.concatenate([img, np.rint(a).astype(np.uint8)[..., None]], axis=-1)


def encode(pixels: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    if fmt == "png":
        PIL.Image.fromarray(pixels, "RGBA").save(out, format="PNG", optimize=True)
    elif fmt == "jpg":
        # subsampling=2 is 4:2:0; no optimisation or progressive mode, baseline as cameras write.
        PIL.Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=85, subsampling=2)
    elif fmt == "webp":
        PIL.Image.fromarray(pixels, "RGB").save(out, format="WEBP", quality=80, method=4)
    else:
        raise ValueError(fmt)
    return out.getvalue()


def run_processor(cls, image: PIL.Image.Image, size: int, kwargs_fn, normalised: bool) -> np.ndarray:
    kwargs = kwargs_fn(size)
    if not normalised:
        kwargs.update(do_rescale=False, do_normalize=False)
    processor = cls(**kwargs)
    out = processor(images=image, return_tensors="pt")["pixel_values"]
    assert out.shape[0] == 1, out.shape
    return out[0].numpy()


def config_json(cls, size: int, kwargs_fn) -> dict:
    """What save_pretrained would write as preprocessor_config.json for this processor."""
    processor = cls(**kwargs_fn(size))
    cfg = json.loads(processor.to_json_string())
    keep = (
        "image_processor_type", "do_resize", "size", "resample", "do_center_crop", "crop_size",
        "do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std", "do_convert_rgb",
    )
    return {k: cfg[k] for k in keep if k in cfg}


def main() -> None:
    torch.set_num_threads(1)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for stale in OUT_DIR.iterdir():
        stale.unlink()
    default_backend = _resolve_backend(None, None, None)
    manifest = {
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "torchvision": torchvision.__version__,
            "pillow": PIL.__version__,
            "numpy": np.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "default_backend": default_backend,
        "images": [],
        "cases": [],
        "qwen2_vl_cases": [],
        "qwen2_vl_smart_resize": smart_resize_table(),
    }
    for seed, (name, width, height, fmt) in enumerate(IMAGES):
        pixels = photo_like(width, height, seed=100 + seed, alpha=fmt == "png")
        data = encode(pixels, fmt)
        file = f"{name}.{fmt}"
        (OUT_DIR / file).write_bytes(data)
        pil = PIL.Image.open(io.BytesIO(data))
        pil.load()
        # What every processor starts from: transformers' convert_rgb (alpha over white).
        decoded = transformers.image_transforms.convert_to_rgb(pil, return_numpy=True)
        assert decoded.shape == (height, width, 3) and decoded.dtype == np.uint8
        (OUT_DIR / f"{name}.decoded.u8").write_bytes(decoded.tobytes())
        # load_image (URLs, paths, chat templates) instead drops the alpha channel.
        dropped = np.array(pil.convert("RGB"))
        manifest["images"].append({
            "name": name,
            "file": file,
            "format": fmt,
            "mode": pil.mode,
            "width": width,
            "height": height,
            "bytes": len(data),
            "decoded": f"{name}.decoded.u8",
            "alpha_dropped_vs_composited_max_diff": int(
                np.abs(dropped.astype(int) - decoded.astype(int)).max()
            ),
        })
        cases = [
            (proc, backend, SMALL)
            for proc in PROCESSORS
            if PROCESSORS[proc].get("small", True)
            for backend in ("torchvision", "pil")
        ]
        if name == "photo_jpeg":
            cases += [("gemma3", "torchvision", LARGE), ("gemma3", "pil", LARGE)]
        if name == "rgba_png":
            cases += [("llava", "torchvision", LLAVA), ("llava", "pil", LLAVA)]
        for proc, backend, size in cases:
            spec = PROCESSORS[proc]
            cls = spec[backend]
            u8 = run_processor(cls, pil, size, spec["kwargs"], normalised=False)
            assert u8.dtype == np.uint8, (cls, u8.dtype)
            hwc = np.ascontiguousarray(u8.transpose(1, 2, 0))
            case = f"{name}.{proc}_{backend}" + ("" if size == SMALL else f"_{size}")
            entry = {
                "name": case,
                "image": name,
                "processor": proc,
                "class": cls.__name__,
                "backend": backend,
                "size": size,
                "config": config_json(cls, size, spec["kwargs"]),
                "height": int(hwc.shape[0]),
                "width": int(hwc.shape[1]),
                "u8_sha256": hashlib.sha256(hwc.tobytes()).hexdigest(),
            }
            if size == SMALL:
                (OUT_DIR / f"{case}.u8").write_bytes(hwc.tobytes())
                entry["u8"] = f"{case}.u8"
                f32 = run_processor(cls, pil, size, spec["kwargs"], normalised=True)
                assert f32.dtype == np.float32 and f32.shape == u8.shape
                (OUT_DIR / f"{case}.f32").write_bytes(f32.astype("<f4").tobytes())
                entry["f32"] = f"{case}.f32"
                # How far the normalised values are from normalising the u8 ones in f64.
                cfg = entry["config"]
                mean = np.array(cfg["image_mean"])[:, None, None]
                std = np.array(cfg["image_std"])[:, None, None]
                exact = (u8.astype(np.float64) * cfg["rescale_factor"] - mean) / std
                entry["f32_vs_f64_of_u8_max_abs_diff"] = float(np.abs(f32 - exact).max())
            else:
                png = f"{case}.png"
                PIL.Image.fromarray(hwc, "RGB").save(OUT_DIR / png, format="PNG", optimize=True)
                entry["png"] = png
            if proc == "llava":
                clip = PROCESSORS["clip"][backend]
                same = run_processor(clip, pil, size, spec["kwargs"], normalised=False)
                entry["same_as_clip"] = bool(np.array_equal(same, u8))
                if not entry["same_as_clip"]:
                    raise SystemExit(f"{case}: LlavaImageProcessor and CLIPImageProcessor differ")
            manifest["cases"].append(entry)
        budgets = [("", QWEN2_VL)] + ([("_up", QWEN2_VL_UP)] if name == "photo_webp" else [])
        for suffix, budget in budgets:
            for backend in ("torchvision", "pil"):
                entry, files = qwen2_vl_case(name, pil, backend, budget, suffix)
                for file, (kind, data) in files.items():
                    if kind == "png":
                        PIL.Image.fromarray(data, "RGB").save(OUT_DIR / file, format="PNG", optimize=True)
                    else:
                        (OUT_DIR / file).write_bytes(data)
                manifest["qwen2_vl_cases"].append(entry)
        # The two backends side by side, for the report.
        for proc in (p for p in PROCESSORS if PROCESSORS[p].get("small", True)):
            a = [c for c in manifest["cases"] if c["image"] == name and c["processor"] == proc]
            tv = next(c for c in a if c["backend"] == "torchvision" and c["size"] == SMALL)
            pl = next(c for c in a if c["backend"] == "pil" and c["size"] == SMALL)
            x = np.frombuffer((OUT_DIR / tv["u8"]).read_bytes(), np.uint8).astype(int)
            y = np.frombuffer((OUT_DIR / pl["u8"]).read_bytes(), np.uint8).astype(int)
            tv["vs_pil_max_diff"] = int(np.abs(x - y).max())
            tv["vs_pil_differing"] = int((x != y).sum())
    (OUT_DIR / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in OUT_DIR.iterdir())
    print(f"default backend: {default_backend}; {total / 1024:.0f} KiB in {OUT_DIR}")
    for img in manifest["images"]:
        print(img)
    for c in manifest["cases"]:
        print(c["name"], c["height"], c["width"], {k: c[k] for k in c if k.startswith("vs_") or k.startswith("f32_vs")})
    for c in manifest["qwen2_vl_cases"]:
        print(c["name"], c["height"], c["width"], c["image_grid_thw"])


if __name__ == "__main__":
    main()
