#!/usr/bin/env python3
"""Reference for tests/unit/vision/preprocess_pillow_test.cpp: generates test images with Pillow
(many sizes and aspect ratios, every mode a request can carry), saves them as PNG / JPEG / WebP / GIF,
and runs the reference preprocessing on each file: vLLM's RGB conversion (RGBA pasted onto white,
everything else Image.convert("RGB")), transformers' M3 smart_resize, Pillow's BICUBIC resize, numpy
rescale/normalise (float64 rescale cast to float32, float32 normalise, as transformers' numpy path)
and the merge-window patch order. Writes, per image, the decoded RGB bytes, the resized RGB bytes and
the float32 patch tensor, plus manifest.json.

usage: vision_pillow_reference.py OUT_DIR
"""
import io
import json
import math
import os
import sys

import numpy as np
from PIL import Image

MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def smart_resize(height, width, factor=28, min_pixels=4 * 28 * 28, max_pixels=451584):
    # transformers/models/minimax_m3_vl/image_processing_minimax_m3_vl.py
    if max(height, width) / min(height, width) > 200:
        raise ValueError("aspect")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(im):
    # vllm/multimodal/image.py convert_image_mode / rgba_to_rgb
    if im.mode == "RGBA":
        out = Image.new("RGB", im.size, (255, 255, 255))
        out.paste(im, mask=im.split()[3])
        return out
    return im.convert("RGB")


def patches(rgb, p=14, m=2, t=2):
    a = np.asarray(rgb).astype(np.float64) * (1 / 255)
    a = a.astype(np.float32)
    a = (a - MEAN) / STD  # float32
    a = a.transpose(2, 0, 1)  # C, H, W
    c, h, w = a.shape
    gh, gw = h // p, w // p
    a = a.reshape(c, gh // m, m, p, gw // m, m, p)
    a = a.transpose(1, 4, 2, 5, 0, 3, 6)  # bh, bw, mh, mw, C, ph, pw
    a = np.repeat(a[:, :, :, :, :, None], t, axis=5)  # temporal after C
    return np.ascontiguousarray(a.reshape(gh * gw, c * t * p * p), dtype=np.float32)


def content(rng, w, h, channels):
    # Smooth gradients plus noise and hard edges: exercises the cubic overshoot and the clipping.
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256], -1)
    noise = rng.integers(0, 256, size=(h, w, 3))
    sel = rng.random((h, w, 1)) < 0.3
    rgb = np.where(sel, noise, base).astype(np.uint8)
    if channels == 4:
        alpha = rng.integers(0, 256, size=(h, w, 1)).astype(np.uint8)
        rgb = np.concatenate([rgb, alpha], -1)
    return rgb


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(43)
    sizes = [(7, 5), (29, 27), (56, 56), (100, 37), (37, 100), (224, 224), (333, 500), (640, 480),
             (1024, 768), (2000, 30), (30, 2000), (1300, 1100), (13, 2500), (700, 701), (449, 451), (95, 3),
             (2500, 12)]
    cases = []
    for i, (w, h) in enumerate(sizes):
        kinds = ["png_rgb", "jpeg_rgb", "webp_rgb", "gif"]
        kinds += [["png_rgba", "webp_rgba", "png_l", "jpeg_l", "png_la", "png_p_trns", "png_i16", "png_interlaced",
                   "webp_lossless", "jpeg_q30"][i % 10]]
        for kind in kinds:
            buf = io.BytesIO()
            if kind in ("png_rgba", "webp_rgba", "png_la"):
                im = Image.fromarray(content(rng, w, h, 4), "RGBA")
                if kind == "png_la":
                    im = im.convert("LA")
            else:
                im = Image.fromarray(content(rng, w, h, 3), "RGB")
            fmt = kind.split("_")[0]
            if kind in ("png_l", "jpeg_l"):
                im = im.convert("L")
            if kind == "png_p_trns":
                im = im.convert("P", palette=Image.ADAPTIVE, colors=64)
                im.info["transparency"] = 3
                im.save(buf, "PNG", transparency=3)
            elif kind == "png_i16":
                arr = (np.asarray(im.convert("L")).astype(np.uint16) * 3)  # values above 255 too
                Image.fromarray(arr, "I;16").save(buf, "PNG")
            elif kind == "png_interlaced":
                # Pillow cannot write Adam7; a palette PNG with optimisation stands in for variety.
                im.convert("P", palette=Image.ADAPTIVE).save(buf, "PNG", optimize=True)
            elif fmt == "png":
                im.save(buf, "PNG")
            elif kind == "jpeg_q30":
                im.save(buf, "JPEG", quality=30)
            elif fmt == "jpeg":
                im.save(buf, "JPEG", quality=90)
            elif kind == "webp_lossless":
                im.save(buf, "WEBP", lossless=True)
            elif fmt == "webp":
                im.save(buf, "WEBP", quality=80)
            elif fmt == "gif":
                im.convert("P", palette=Image.ADAPTIVE).save(buf, "GIF")
            name = f"img{i:02d}_{w}x{h}_{kind}"
            ext = {"png": "png", "jpeg": "jpg", "webp": "webp", "gif": "gif"}[fmt]
            path = os.path.join(out, f"{name}.{ext}")
            with open(path, "wb") as f:
                f.write(buf.getvalue())
            rgb = to_rgb(Image.open(path))
            rgb.load()
            case = {"file": os.path.basename(path), "width": w, "height": h, "mode": Image.open(path).mode}
            with open(os.path.join(out, name + ".decoded"), "wb") as f:
                f.write(rgb.tobytes())
            try:
                rh, rw = smart_resize(h, w)
            except ValueError:
                case["refused"] = True
                cases.append(case)
                continue
            resized = rgb.resize((rw, rh), Image.BICUBIC)
            with open(os.path.join(out, name + ".resized"), "wb") as f:
                f.write(resized.tobytes())
            with open(os.path.join(out, name + ".patches"), "wb") as f:
                f.write(patches(resized).tobytes())
            case.update({"resized_width": rw, "resized_height": rh, "stem": name})
            cases.append(case)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"pillow": Image.__version__, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
