// Decoding JPEG, PNG, WebP and GIF (first frame) into RgbImage, the way the reference (vLLM's
// loader on top of Pillow) sees the picture: an RGBA image is composited onto white (vLLM's
// rgba_to_rgb), every other mode is converted with Pillow's convert("RGB") rules (alpha dropped,
// palettes expanded, grey replicated, 16-bit samples cut to their high byte).
//
// Libraries: Debian's libjpeg-turbo, libpng, libwebp and giflib, the same codecs Debian's Pillow is
// built against, so the decoded pixels are the same bits (the JPEG IDCT and the WebP YUV->RGB
// upsampling are library choices stb_image would not reproduce). Each decoder reads the header first
// and refuses dimensions above DecodeLimits before allocating the pixels.
#pragma once
#include <cstddef>
#include <cstdint>
#include "vision/image.h"

namespace m3::vision {

// Throws m3::Error naming the format and what is wrong (corrupt, truncated, zero-sized, too large,
// unsupported format or colour space).
RgbImage decode_image(const uint8_t* data, size_t n, const DecodeLimits& limits = {});

// vLLM's RGBA -> RGB: Pillow's paste of the image onto white through its alpha (per channel
// (255 - a) * 255 + a * c, divided by 255 with Pillow's rounding).
uint8_t composite_on_white(uint8_t c, uint8_t a);

}  // namespace m3::vision
