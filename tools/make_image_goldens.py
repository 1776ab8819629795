#!/usr/bin/python3
"""Writes the image test files and their goldens (tests/data/images/):

  *.jpg, *.png, *.webp       images generated here (a photo-like picture: smooth
                             colour fields, noise and saturated hard-edged
                             blocks, which make bicubic overshoot and clip),
                             saved by Pillow in many layouts: baseline /
                             progressive / 4:4:4 / grayscale / Adobe CMYK JPEG,
                             RGB / RGBA / palette+tRNS / gray / 1-bit PNG,
                             lossy / lossless / alpha WebP, and EXIF
                             orientations 1-8 (JPEG APP1, PNG eXIf, WebP EXIF)
  tests/data/datasets/vision/  a small multimodal dataset (vlm.jsonl) in
                             ms-swift's, OpenAI's and LLaVA's forms, with tiny
                             images beside it (tests/test_media.c)
  tests/fuzz/image/          the seed corpus of fuzz/fuzz_image.c: the small
                             images, and copies cut short
  goldens.safetensors        what the Python pipeline makes of them:
    decoded.FILE   U8 [h, w, 3]  Image.open -> ImageOps.exif_transpose ->
                                 convert("RGB") (ms-swift's load_image, plus
                                 the orientation)
    resized.CASE   U8 [h, w, 3]  Image.resize((w, h), BICUBIC) to smart_resize's size
    patches.CASE   F32 [n, 1176] and grid.CASE I32 [3]: the processor's output
    metadata "cases": the processor cases (file, min_pixels, max_pixels, size)
    metadata "smart_resize": [[h, w, factor, min_pixels, max_pixels, out_h, out_w], ...]
                             (out_h = out_w = 0 where it refuses)

The processor is transformers' Qwen2VLImageProcessor reimplemented in numpy
(transformers is not a dependency): smart_resize as qwen_vl_utils and
transformers (4.50+) have it, resize through Pillow as transformers'
image_transforms.resize does (uint8 in, uint8 out), rescale as
image_transforms.rescale (float64 multiply, cast to float32), normalize as
image_transforms.normalize (float32), then the reshape / transpose / flatten of
Qwen2VLImageProcessor._preprocess. When transformers is importable, its
processor's output is compared with ours here as well.

Run from the repository root:  /usr/bin/python3 tools/make_image_goldens.py
(Debian's python3-pil and python3-numpy.)
"""
import base64
import io
import json
import math
import os

import numpy as np
from PIL import Image, ImageOps

from safetensors_np import write_safetensors

OUT = "tests/data/images"
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]
PATCH, TEMPORAL, MERGE = 14, 2, 2
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280


def photo(w, h, seed):
    rs = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 128 + 100 * np.sin(x / 7.0 + seed) * np.cos(y / 11.0)
    g = 255 * x / max(w - 1, 1)
    b = 255 * (1 - y / max(h - 1, 1))
    img = np.stack([r, g, b], -1) + rs.normal(0, 12, (h, w, 3))
    img[h // 4:h // 2, w // 5:w // 3] = [255, 0, 0]
    img[h // 2:h - h // 5, w // 2:w - w // 6] = [0, 0, 255]
    img[h // 3:h // 3 + 2, :] = 255
    return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8), "RGB")


def exif_bytes(orientation):
    ex = Image.Exif()
    ex[0x0112] = orientation
    return ex.tobytes()


def save_images():
    files = {}

    def put(name, img, **kw):
        buf = io.BytesIO()
        fmt = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}[name.rsplit(".", 1)[1]]
        img.save(buf, fmt, **kw)
        files[name] = buf.getvalue()

    p = photo(120, 80, 1)
    put("photo.jpg", p, quality=90)
    put("photo444.jpg", photo(77, 51, 2), quality=95, subsampling=0)
    put("progressive.jpg", photo(64, 48, 3), quality=85, progressive=True)
    put("gray.jpg", photo(61, 45, 4).convert("L"), quality=90)
    put("cmyk.jpg", photo(40, 30, 5).convert("CMYK"), quality=90)
    put("exif6.jpg", photo(60, 40, 6), quality=90, exif=exif_bytes(6))
    put("big.jpg", photo(640, 480, 7), quality=80)
    put("photo.png", photo(97, 61, 8))
    rgba = photo(50, 37, 9).convert("RGBA")
    rgba.putalpha(Image.fromarray(np.random.RandomState(9).randint(0, 256, (37, 50)).astype(np.uint8)))
    put("rgba.png", rgba)
    pal = photo(45, 33, 10).quantize(colors=37)
    put("palette.png", pal, transparency=3)
    put("gray.png", photo(33, 29, 11).convert("L"))
    put("bw.png", photo(30, 20, 12).convert("1"))
    put("tiny.png", photo(10, 7, 13))
    put("wide.png", photo(300, 20, 14))
    put("lossy.webp", photo(90, 70, 15), quality=80)
    put("lossless.webp", photo(41, 39, 16), lossless=True)
    a = photo(48, 36, 17).convert("RGBA")
    a.putalpha(Image.fromarray(np.random.RandomState(17).randint(0, 256, (36, 48)).astype(np.uint8)))
    put("alpha.webp", a, quality=90)
    put("exif8.webp", photo(50, 30, 18), quality=90, exif=exif_bytes(8))
    small = photo(5, 3, 19)
    for o in range(1, 9):
        put("orient%d.png" % o, small, exif=exif_bytes(o))
    os.makedirs(OUT, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(OUT, name), "wb") as fh:
            fh.write(data)
    seeds = "tests/fuzz/image"
    os.makedirs(seeds, exist_ok=True)
    for name, data in files.items():
        if len(data) > 8000:
            continue
        with open(os.path.join(seeds, name), "wb") as fh:
            fh.write(data)
        if name.startswith(("photo", "lossy", "progressive", "palette")):
            with open(os.path.join(seeds, "cut_" + name), "wb") as fh:
                fh.write(data[:len(data) * 2 // 3])
    return sorted(files)


def load(name):
    """ms-swift's load_image (Image.open, convert("RGB")) with the EXIF
    orientation applied first."""
    img = Image.open(os.path.join(OUT, name))
    img = ImageOps.exif_transpose(img)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img


def smart_resize(height, width, factor=28, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS):
    if max(height, width) / min(height, width) > 200:
        raise ValueError("aspect ratio over 200")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# Qwen3-VL's preprocessor_config.json: patch 16 (factor 32), mean and std 0.5
PRESETS = {"qwen2_vl": (PATCH, MEAN, STD), "qwen3_vl": (16, [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])}


def process(img, min_pixels, max_pixels, preset="qwen2_vl"):
    """Qwen2VLImageProcessor._preprocess for one image, in numpy, with the
    patch size, mean and std of preset."""
    PATCH, MEAN, STD = PRESETS[preset]
    w, h = img.size
    rh, rw = smart_resize(h, w, PATCH * MERGE, min_pixels, max_pixels)
    resized = np.array(img.resize((rw, rh), resample=Image.BICUBIC))  # uint8, as transformers' resize
    x = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)  # image_transforms.rescale
    x = (x - np.array(MEAN, dtype=np.float32)) / np.array(STD, dtype=np.float32)  # normalize
    x = x.transpose(2, 0, 1)[None]  # (1, C, H, W)
    x = np.concatenate([x] * TEMPORAL, 0)  # the one frame repeated temporal_patch_size times
    gt, gh, gw = x.shape[0] // TEMPORAL, rh // PATCH, rw // PATCH
    x = x.reshape(gt, TEMPORAL, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = x.reshape(gt * gh * gw, 3 * TEMPORAL * PATCH * PATCH)
    return resized, np.ascontiguousarray(flat, dtype=np.float32), (gt, gh, gw)


def check_against_transformers(img, min_pixels, max_pixels, flat, grid, preset="qwen2_vl"):
    try:
        from transformers import Qwen2VLImageProcessor
    except ImportError:
        return False
    patch, mean, std = PRESETS[preset]
    proc = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=patch, image_mean=mean,
                                 image_std=std)
    out = proc(images=[img], return_tensors="np")
    assert tuple(out["image_grid_thw"][0]) == grid
    assert np.abs(out["pixel_values"] - flat).max() <= 1e-6
    return True


def make_vision_dataset():
    d = "tests/data/datasets/vision"
    os.makedirs(os.path.join(d, "images"), exist_ok=True)
    Image.new("RGB", (56, 56), (220, 20, 30)).save(os.path.join(d, "images/red.png"))
    Image.new("RGB", (60, 40), (20, 30, 220)).save(os.path.join(d, "images/blue.png"))
    photo(120, 30, 21).save(os.path.join(d, "images/wide.jpg"), quality=85)
    buf = io.BytesIO()
    Image.new("RGB", (28, 84), (30, 200, 40)).save(buf, "PNG")
    green = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    recs = [
        {"messages": [{"role": "user", "content": "<image>What colour is this?"},
                      {"role": "assistant", "content": "Red."}], "images": ["images/red.png"]},
        {"messages": [{"role": "user", "content": "<image> and <image>: which is green?"},
                      {"role": "assistant", "content": "The second."}], "images": ["images/red.png", green]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "images/wide.jpg"}},
                                                   {"type": "text", "text": "Describe it."}]},
                      {"role": "assistant", "content": "A wide picture."}]},
        {"id": "000000033471", "image": "images/red.png",
         "conversations": [{"from": "human", "value": "<image>\nWhat is shown?"},
                           {"from": "gpt", "value": "A red square."}]},
        {"messages": [{"role": "user", "content": "Name the colour."}, {"role": "assistant", "content": "Blue."}],
         "images": [{"path": "images/blue.png"}]},
    ]
    with open(os.path.join(d, "vlm.jsonl"), "w") as fh:
        for r in recs:
            fh.write(json.dumps(r) + "\n")


def main():
    make_vision_dataset()
    names = save_images()
    tensors = []
    for n in names:
        if n != "big.jpg":  # only its resized form is kept
            tensors.append(("decoded." + n, np.array(load(n))))
    # (case, file, min_pixels, max_pixels, keep the patches)
    cases = [("photo_default", "photo.jpg", MIN_PIXELS, MAX_PIXELS, False),
             ("photo_down", "photo.jpg", 28 * 28, 3000, True),
             ("big_down", "big.jpg", 28 * 28, 56 * 56, False),
             ("big_mid", "big.jpg", MIN_PIXELS, 150 * 100, False),
             ("tiny_up", "tiny.png", MIN_PIXELS, MAX_PIXELS, True),
             ("gray_default", "gray.jpg", MIN_PIXELS, MAX_PIXELS, True),
             ("wide_default", "wide.png", MIN_PIXELS, MAX_PIXELS, False),
             ("lossy_default", "lossy.webp", MIN_PIXELS, MAX_PIXELS, False),
             ("exif6_default", "exif6.jpg", MIN_PIXELS, MAX_PIXELS, False),
             ("rgba_default", "rgba.png", MIN_PIXELS, MAX_PIXELS, False),
             ("photo_qwen3", "photo.jpg", 64 * 64, 160 * 120, True, "qwen3_vl"),
             ("tiny_qwen3", "tiny.png", 4096, 128 * 128, True, "qwen3_vl")]
    meta_cases, hf = [], 0
    for case, f, lo, hi, keep, *preset in cases:
        preset = preset[0] if preset else "qwen2_vl"
        img = load(f)
        resized, flat, grid = process(img, lo, hi, preset)
        tensors.append(("resized." + case, resized))
        if keep:
            tensors.append(("patches." + case, flat))
            tensors.append(("grid." + case, np.array(grid, dtype=np.int32)))
        hf += check_against_transformers(img, lo, hi, flat, grid, preset)
        meta_cases.append({"name": case, "file": f, "min_pixels": lo, "max_pixels": hi, "patches": keep})
        if preset != "qwen2_vl":
            meta_cases[-1].update(patch_size=PRESETS[preset][0], image_mean=PRESETS[preset][1],
                                  image_std=PRESETS[preset][2])
    table = []
    sizes = [(100, 150), (42, 42), (70, 70), (98, 126), (14, 14), (7, 10), (1, 1), (3024, 4032), (1080, 1920),
             (4032, 3024), (20, 300), (28, 5600), (27, 5600), (50000, 300), (640, 480), (1000, 1000), (13, 2000)]
    bounds = [(MIN_PIXELS, MAX_PIXELS), (28 * 28, 3000), (256 * 28 * 28, 16384 * 28 * 28), (3136, 12845056)]
    for h, w in sizes:
        for lo, hi in bounds:
            try:
                rh, rw = smart_resize(h, w, 28, lo, hi)
            except ValueError:
                rh = rw = 0
            table.append([h, w, 28, lo, hi, rh, rw])
    write_safetensors(os.path.join(OUT, "goldens.safetensors"), tensors,
                      {"generator": "tools/make_image_goldens.py (Pillow %s, numpy %s)" % (Image.__version__,
                                                                                           np.__version__),
                       "cases": json.dumps(meta_cases), "smart_resize": json.dumps(table)})
    print("wrote %d images, %d tensors, %d smart_resize cases%s" %
          (len(names), len(tensors), len(table), ", checked against transformers" if hf else ""))


if __name__ == "__main__":
    main()
