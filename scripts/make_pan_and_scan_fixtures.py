#!/usr/bin/env python3
"""Build the pan-and-scan fixtures that media/tests/pan_and_scan.rs reads (issue 21).

Pinned reference stack (the versions the committed fixtures were generated with):

    transformers == 5.24.0   (Gemma3ImageProcessorPil: the PIL backend, which needs no torch)
    pillow       == 13.0.0
    numpy        == 2.4.6

Run by hand, once, by whoever changes the fixtures; CI never runs it:

    python3 -m venv /tmp/pas-venv
    /tmp/pas-venv/bin/pip install transformers==5.24.0 pillow==13.0.0 numpy==2.4.6
    /tmp/pas-venv/bin/python scripts/make_pan_and_scan_fixtures.py

It reads the three images of media/tests/fixtures/hf_preprocess/ (made by
make_image_fixtures.py), draws a fourth, a 199 x 61 strip long enough for three crops, and
writes under media/tests/fixtures/pan_and_scan/:

    strip.png            the strip (seeded noise over gradients, 8-bit RGB)
    <image>.<case>.f32   Gemma3ImageProcessorPil's `pixel_values` with `do_pan_and_scan`:
                         the whole image, then each crop, [1 + crops, 3, size, size],
                         little-endian f32
    manifest.json        per case: the image, the processor's settings, `num_crops`, and the
                         crop rectangles recomputed here from transformers' own arithmetic
                         (`pan_and_scan` returns the crops' pixels, not where they lie)
"""

import io
import itertools
import json
import math
import pathlib

import numpy as np
import PIL.Image
import transformers
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE = ROOT / "media/tests/fixtures/hf_preprocess"
OUT = ROOT / "media/tests/fixtures/pan_and_scan"

IMAGES = ["rgba_png.png", "photo_jpeg.jpg", "photo_webp.webp", "strip.png"]

# Small crops, so the fixtures' 61-199 pixel images are cut: the default ratio and count; a
# higher ratio (the PNG and JPEG stay whole); at most two crops.
CASES = [
    ("min32", {"pan_and_scan_min_crop_size": 32, "pan_and_scan_max_num_crops": 4,
               "pan_and_scan_min_ratio_to_activate": 1.2}),
    ("ratio1_6", {"pan_and_scan_min_crop_size": 20, "pan_and_scan_max_num_crops": 4,
                  "pan_and_scan_min_ratio_to_activate": 1.6}),
    ("max2", {"pan_and_scan_min_crop_size": 20, "pan_and_scan_max_num_crops": 2,
              "pan_and_scan_min_ratio_to_activate": 1.2}),
]
SIZE = 32


def crop_rects(width, height, cfg):
    """Where Gemma3ImageProcessorPil.pan_and_scan's crops lie, by its own arithmetic."""
    if width >= height:
        if width / height < cfg["pan_and_scan_min_ratio_to_activate"]:
            return []
        w = int(math.floor(width / height + 0.5))
        w = min(int(math.floor(width / cfg["pan_and_scan_min_crop_size"])), w)
        w = min(cfg["pan_and_scan_max_num_crops"], max(2, w))
        h = 1
    else:
        if height / width < cfg["pan_and_scan_min_ratio_to_activate"]:
            return []
        h = int(math.floor(height / width + 0.5))
        h = min(int(math.floor(height / cfg["pan_and_scan_min_crop_size"])), h)
        h = min(cfg["pan_and_scan_max_num_crops"], max(2, h))
        w = 1
    cw, ch = int(math.ceil(width / w)), int(math.ceil(height / h))
    if min(cw, ch) < cfg["pan_and_scan_min_crop_size"]:
        return []
    return [
        [x, y, min(cw, width - x), min(ch, height - y)]
        for y, x in itertools.product([ch * i for i in range(h)], [cw * i for i in range(w)])
    ]


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = {
        "versions": {
            "transformers": transformers.__version__,
            "pillow": PIL.__version__,
            "numpy": np.__version__,
        },
        "size": SIZE,
        "cases": [],
    }
    rng = np.random.default_rng(7)
    ys, xs = np.mgrid[0:61, 0:199]
    strip = np.stack([xs * 255 // 198, ys * 255 // 60, (xs + ys) % 256], axis=-1)
    strip = np.clip(strip + rng.integers(-40, 41, strip.shape), 0, 255).astype(np.uint8)
    PIL.Image.fromarray(strip, "RGB").save(OUT / "strip.png")
    for file in IMAGES:
        folder = OUT if file == "strip.png" else SOURCE
        pil = PIL.Image.open(io.BytesIO((folder / file).read_bytes()))
        rgb = transformers.image_transforms.convert_to_rgb(pil)  # a PIL image
        for name, cfg in CASES:
            processor = Gemma3ImageProcessorPil(
                size={"height": SIZE, "width": SIZE}, do_pan_and_scan=True, **cfg
            )
            out = processor(images=[rgb], return_tensors="np")
            pixels = np.asarray(out["pixel_values"], dtype=np.float32)
            crops = int(np.asarray(out["num_crops"]).reshape(-1)[0])
            rects = crop_rects(rgb.width, rgb.height, cfg)
            assert len(rects) == crops, (file, name, rects, crops)
            assert pixels.shape == (1 + crops, 3, SIZE, SIZE), pixels.shape
            stem = file.split(".")[0]
            out_file = f"{stem}.{name}.f32"
            (OUT / out_file).write_bytes(pixels.astype("<f4").tobytes())
            manifest["cases"].append({
                "image": file, "case": name, "config": cfg, "width": rgb.width,
                "height": rgb.height, "num_crops": crops, "crops": rects, "f32": out_file,
            })
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
