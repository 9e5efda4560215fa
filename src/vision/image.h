// An 8-bit RGB image (interleaved, row-major) and the limits that bound decoding: every decoder
// checks the header's dimensions against DecodeLimits before it allocates a pixel.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace m3::vision {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3
  const uint8_t* row(int y) const { return rgb.data() + size_t(y) * size_t(width) * 3; }
};

// What a request may make us decode. The defaults bound one decode to 64 Mpx (192 MiB of RGB plus
// one row-sized scratch per decoder; the resize adds at most out_width x in_height x 3 bytes).
struct DecodeLimits {
  int max_side = 16384;
  int64_t max_pixels = int64_t(1) << 26;
  size_t max_bytes = size_t(64) << 20;  // encoded size
};

enum class ImageFormat { Unknown, Jpeg, Png, Webp, Gif };
const char* image_format_name(ImageFormat f);
// The format from the leading magic bytes (never from a file name or a MIME type).
ImageFormat sniff_image_format(const uint8_t* data, size_t n);

}  // namespace m3::vision
