// The image path against Pillow: tests/tools/vision_pillow_reference.py generates images of many sizes,
// aspect ratios and modes with Pillow (Debian's python3-pil), saves them as PNG / JPEG / WebP / GIF and
// writes Pillow's decoded RGB, its BICUBIC resize after transformers' smart_resize, and the normalised
// patch tensor. Our decode, resize and patchify must give the same bytes, every one (tolerance zero).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "test_tmp.h"
#include "vision/image_decode.h"
#include "vision/preprocess.h"
#include "vision/resample.h"

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

const std::string& reference_dir() {
  static const std::string dir = [] {
    std::string d = m3test::test_tmp_dir() + "/pillow_ref";
    // Debian's interpreter, where python3-pil and python3-numpy install.
    std::string cmd = "/usr/bin/python3 " M3_TEST_DATA "/../tools/vision_pillow_reference.py " + d;
    if (std::system(cmd.c_str()) != 0) d.clear();
    return d;
  }();
  return dir;
}

TEST(VisionPillow, DecodeResizeAndPatchesEqualPillow) {
  const std::string dir = reference_dir();
  ASSERT_FALSE(dir.empty()) << "the Pillow reference failed (python3-pil and python3-numpy are needed; make deps)";
  nlohmann::json man;
  std::ifstream(dir + "/manifest.json") >> man;
  m3::vision::ProcessorConfig cfg;
  int decoded = 0, resized = 0, refused = 0;
  for (const auto& c : man["cases"]) {
    const std::string file = c["file"];
    SCOPED_TRACE(file + " mode " + std::string(c["mode"]));
    auto bytes = read_bytes(dir + "/" + file);
    m3::vision::RgbImage im = m3::vision::decode_image(bytes.data(), bytes.size());
    ASSERT_EQ(im.width, int(c["width"]));
    ASSERT_EQ(im.height, int(c["height"]));
    std::string stem = file.substr(0, file.rfind('.'));
    auto ref_dec = read_bytes(dir + "/" + stem + ".decoded");
    ASSERT_EQ(im.rgb.size(), ref_dec.size());
    size_t diff = 0;
    for (size_t i = 0; i < ref_dec.size(); ++i) diff += im.rgb[i] != ref_dec[i];
    EXPECT_EQ(diff, 0u) << "decoded bytes differing from Pillow's";
    ++decoded;
    if (c.value("refused", false)) {
      EXPECT_THROW(m3::vision::smart_resize(im.height, im.width, cfg), m3::Error);
      ++refused;
      continue;
    }
    auto s = m3::vision::smart_resize(im.height, im.width, cfg);
    ASSERT_EQ(s.width, int(c["resized_width"]));
    ASSERT_EQ(s.height, int(c["resized_height"]));
    // Resize Pillow's decoded pixels so a resize difference is not masked by a decode difference.
    m3::vision::RgbImage src;
    src.width = im.width;
    src.height = im.height;
    src.rgb = ref_dec;
    auto r = m3::vision::resize_bicubic(src, s.width, s.height);
    auto ref_res = read_bytes(dir + "/" + stem + ".resized");
    ASSERT_EQ(r.rgb.size(), ref_res.size());
    diff = 0;
    for (size_t i = 0; i < ref_res.size(); ++i) diff += r.rgb[i] != ref_res[i];
    EXPECT_EQ(diff, 0u) << "resized bytes differing from Pillow's";
    auto pt = m3::vision::patchify(r, cfg);
    auto ref_p = read_bytes(dir + "/" + stem + ".patches");
    ASSERT_EQ(pt.values.size() * 4, ref_p.size());
    EXPECT_EQ(pt.grid_h, s.height / 14);
    EXPECT_EQ(pt.grid_w, s.width / 14);
    EXPECT_EQ(std::memcmp(pt.values.data(), ref_p.data(), ref_p.size()), 0) << "patch tensor differs";
    // The whole path from the file gives the same tensor.
    auto full = m3::vision::preprocess_image(im, cfg);
    EXPECT_EQ(std::memcmp(full.values.data(), ref_p.data(), ref_p.size()), 0);
    ++resized;
  }
  EXPECT_GE(decoded, 70);
  EXPECT_GE(resized, 60);
  EXPECT_GE(refused, 1);
  std::printf("Pillow %s: %d images decoded, %d resized and patchified, %d refused (aspect ratio)\n",
              std::string(man["pillow"]).c_str(), decoded, resized, refused);
}

TEST(VisionDecode, BadImagesAreErrorsNamingTheProblem) {
  const std::string dir = reference_dir();
  ASSERT_FALSE(dir.empty());
  auto expect_error = [](const std::vector<uint8_t>& b, const std::string& needle) {
    try {
      m3::vision::decode_image(b.data(), b.size());
      ADD_FAILURE() << "no error, expected one containing '" << needle << "'";
    } catch (const m3::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({}, "empty");
  expect_error({'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}, "unsupported image format");
  for (const char* f : {"img06_333x500_png_rgb.png", "img06_333x500_jpeg_rgb.jpg", "img06_333x500_webp_rgb.webp",
                        "img06_333x500_gif.gif"}) {
    SCOPED_TRACE(f);
    auto b = read_bytes(dir + "/" + f);
    ASSERT_GT(b.size(), 200u);
    b.resize(b.size() / 2);  // truncated
    expect_error(b, "truncated");
    auto c = read_bytes(dir + "/" + f);
    for (size_t i = 40; i < c.size(); i += 7) c[i] ^= 0x5a;  // corrupt after the header
    try {
      m3::vision::decode_image(c.data(), c.size());  // may decode garbage (JPEG is lenient); must not crash
    } catch (const m3::Error&) {
    }
  }
  // Too large: the header's size is refused before any pixel is allocated.
  m3::vision::DecodeLimits small;
  small.max_side = 300;
  auto b = read_bytes(dir + "/img06_333x500_png_rgb.png");
  try {
    m3::vision::decode_image(b.data(), b.size(), small);
    ADD_FAILURE() << "no error for a 333x500 image under a 300-pixel side limit";
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("above the decode limit"), std::string::npos) << e.what();
  }
  for (const char* f : {"img06_333x500_jpeg_rgb.jpg", "img06_333x500_webp_rgb.webp", "img06_333x500_gif.gif"}) {
    auto d = read_bytes(dir + "/" + f);
    EXPECT_THROW(m3::vision::decode_image(d.data(), d.size(), small), m3::Error) << f;
  }
}

TEST(VisionPreprocess, SmartResizeRules) {
  m3::vision::ProcessorConfig cfg;
  auto s = m3::vision::smart_resize(448, 448, cfg);
  EXPECT_EQ(s.height, 448);
  EXPECT_EQ(s.width, 448);
  s = m3::vision::smart_resize(896, 1344, cfg);  // 1.2 Mpx -> under 451584
  EXPECT_LE(int64_t(s.height) * s.width, cfg.max_pixels);
  EXPECT_EQ(s.height % 28, 0);
  EXPECT_EQ(s.width % 28, 0);
  // Python's round is half-to-even: 126 / 28 = 4.5 -> 4, 210 / 28 = 7.5 -> 8.
  s = m3::vision::smart_resize(126, 210, cfg);
  EXPECT_EQ(s.height, 112);
  EXPECT_EQ(s.width, 224);
  EXPECT_THROW(m3::vision::smart_resize(10, 2500, cfg), m3::Error);  // aspect 250
  EXPECT_THROW(m3::vision::smart_resize(0, 10, cfg), m3::Error);
}

}  // namespace
