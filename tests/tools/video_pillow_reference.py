#!/usr/bin/env python3
"""Reference for tests/unit/vision/video_pillow_test.cpp: makes test videos with the ffmpeg CLI from
PNG frames generated with Pillow, in lossless codecs (FFV1 in Matroska, PNG in QuickTime) so the decoded
frames are the source frames exactly, and runs the reference M3 video path on the source frames: vLLM's
MiniMaxM3VideoBackend frame sampling (ceil-interval at `fps`, 1 by default), the video processor's
smart_resize bounds (min_pixels 3136, max_pixels 602112 per frame), Pillow's BICUBIC resize, numpy
rescale/normalise as for images, temporal pairs with the last frame repeated for an odd count, and the
merge-window patch order. Also an H.264 (libx264, else MPEG-4) clip for the smoke case. Writes, per
case, the video, the float32 patch tensor and manifest.json (grid, sampled indices, timestamps).

usage: video_pillow_reference.py OUT_DIR
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
from PIL import Image

# The image reference's constants and smart_resize (the same rule; only the video's pixel bound differs).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vision_pillow_reference import MEAN, STD, smart_resize as image_smart_resize  # noqa: E402

VIDEO_MAX_PIXELS = 768 * 28 * 28  # the video processor's per-frame bound (602112), not the image one


def smart_resize(height, width):
    return image_smart_resize(height, width, max_pixels=VIDEO_MAX_PIXELS)


def sample(total, video_fps, fps):
    # vllm/models/minimax_m3/common/mm_preprocess.py compute_frames_index_to_sample
    interval, eps, out, prev = 1.0 / fps, 1e-4, [], -float("inf")
    while True:
        if not out:
            target = 0
        else:
            target = max(math.ceil((prev + interval - eps) * video_fps), out[-1] + 1)
        if target >= total:
            break
        out.append(target)
        prev = target / video_fps
    return out or [0]


def patches(frames, p=14, m=2, t=2):
    a = np.stack([np.asarray(f) for f in frames]).astype(np.float64) * (1 / 255)
    a = ((a.astype(np.float32) - MEAN) / STD).astype(np.float32)  # n, H, W, C
    if len(a) % t:
        a = np.concatenate([a, np.repeat(a[-1:], t - len(a) % t, axis=0)])
    n, h, w, c = a.shape
    gt, gh, gw = n // t, h // p, w // p
    a = a.transpose(0, 3, 1, 2).reshape(gt, t, c, gh // m, m, p, gw // m, m, p)
    a = a.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # gt, bh, bw, mh, mw, C, T, ph, pw
    return np.ascontiguousarray(a.reshape(gt * gh * gw, c * t * p * p), dtype=np.float32), (gt, gh, gw)


def frame(rng, w, h, k):
    # A moving gradient plus noise, different in every frame.
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1) + 9 * k) % 256, (y * 255 // max(h - 1, 1)) % 256,
                     ((x + y) * 7 + 31 * k) % 256], -1)
    noise = rng.integers(0, 256, size=(h, w, 3))
    sel = rng.random((h, w, 1)) < 0.2
    return Image.fromarray(np.where(sel, noise, base).astype(np.uint8), "RGB")


def ffmpeg(args):
    subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-y"] + args, check=True)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(44)
    # name, frames, rate, width, height, container
    specs = [("v4_ffv1", 4, 1, 448, 448, "ffv1"),       # 4 frames at 1 fps: 4 sampled, grid_t 2
             ("v10_ffv1", 10, 1, 200, 120, "ffv1"),     # 10 sampled, grid_t 5 (two tower segments)
             ("v7_png", 7, 1, 90, 60, "png"),           # odd: the last frame repeated
             ("v25fps_ffv1", 60, 25, 96, 64, "ffv1"),   # 2.4 s at 25 fps: frames 0, 25, 50 sampled
             ("v12fps_png", 14, 12, 900, 720, "png")]  # downscaled by max_pixels; frames 0, 12 sampled
    cases = []
    for name, n, rate, w, h, kind in specs:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        frames = [frame(rng, w, h, k) for k in range(n)]
        for k, f in enumerate(frames):
            f.save(os.path.join(d, f"{k:04d}.png"))
        src = ["-framerate", str(rate), "-i", os.path.join(d, "%04d.png")]
        if kind == "ffv1":
            path = os.path.join(out, name + ".mkv")
            ffmpeg(src + ["-c:v", "ffv1", "-pix_fmt", "bgr0", path])
        else:
            path = os.path.join(out, name + ".mov")
            ffmpeg(src + ["-c:v", "png", "-pix_fmt", "rgb24", path])
        idx = sample(n, float(rate), 1.0)
        rh, rw = smart_resize(h, w)
        resized = [frames[i].resize((rw, rh), Image.BICUBIC) for i in idx]
        pt, grid = patches(resized)
        pt.tofile(os.path.join(out, name + ".patches"))
        ts = [idx[min(g * 2, len(idx) - 1)] / rate for g in range(grid[0])]
        cases.append({"file": os.path.basename(path), "frames": n, "fps": rate, "width": w, "height": h,
                      "indices": idx, "grid": list(grid), "timestamps": [f"]<]{t:.1f} seconds[>[" for t in ts]})
    # Smoke: a lossy H.264 (libx264 where Debian's ffmpeg has it, else MPEG-4 part 2) MP4 of 3 s at 10 fps.
    d = os.path.join(out, "v4_ffv1")
    codec = "libx264" if b"libx264" in subprocess.run(["ffmpeg", "-hide_banner", "-encoders"],
                                                      capture_output=True).stdout else "mpeg4"
    ffmpeg(["-framerate", "10", "-loop", "1", "-t", "3", "-i", os.path.join(d, "0000.png"), "-c:v", codec,
            "-pix_fmt", "yuv420p", os.path.join(out, "smoke.mp4")])
    json.dump({"cases": cases, "smoke": {"file": "smoke.mp4", "codec": codec}},
              open(os.path.join(out, "manifest.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
