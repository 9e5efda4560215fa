// Bicubic resampling equal to Pillow's Image.resize(size, BICUBIC) on an 8-bit RGB image (no
// reducing_gap): the two-pass separable convolution of Pillow's Resample.c, written from its rule:
// - the cubic kernel with a = -0.5, support 2 scaled by the downscale factor (never below 1);
// - per output pixel, centre = (i + 0.5) * in / out, taps [int(c - s + 0.5), int(c + s + 0.5)) clipped
//   to the image, weights k((x - c + 0.5) / filterscale) normalised to sum 1 in double;
// - weights rounded to fixed point with 22 fractional bits (round half away from zero), accumulated
//   in int32 from 1 << 21, the result clipped to [0, 255] after >> 22;
// - horizontal pass first (only over the source rows the vertical pass reads), then vertical;
//   a pass whose size does not change is skipped.
// The result is the same bytes as Pillow's (tests/unit/vision/resample_pillow_test.cpp).
#pragma once
#include "vision/image.h"

namespace m3::vision {

RgbImage resize_bicubic(const RgbImage& in, int out_width, int out_height);

}  // namespace m3::vision
