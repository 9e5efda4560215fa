// The video path against a Pillow reference: tests/tools/video_pillow_reference.py generates PNG frames,
// encodes them losslessly with the ffmpeg CLI (FFV1 in Matroska, PNG in QuickTime) and computes vLLM's
// frame sampling, the video processor's smart resize, Pillow's BICUBIC and the temporal-pair patches from
// the source frames. Our decode -> sample -> resize -> patchify must give the same floats (tolerance
// zero), the same sampled indices and timestamps. Also: an H.264 MP4 smoke case, the sampling rule on
// its own, and every bad video refused with a message saying what is wrong.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "test_tmp.h"
#include "vision/video_preprocess.h"

namespace {

using m3::vision::VideoOptions;

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

const std::string& reference_dir() {
  static const std::string dir = [] {
    std::string d = m3test::test_tmp_dir() + "/video_ref";
    std::string cmd = "/usr/bin/python3 " M3_TEST_DATA "/../tools/video_pillow_reference.py " + d;
    if (std::system(cmd.c_str()) != 0) d.clear();
    return d;
  }();
  return dir;
}

std::string error_of(const std::vector<uint8_t>& bytes, const VideoOptions& vo = {}) {
  try {
    m3::vision::preprocess_video(bytes.data(), bytes.size(), {}, {}, vo, true);
  } catch (const m3::Error& e) {
    return e.what();
  }
  return "";
}

TEST(VideoPillow, SampledResizedPatchesEqualPillow) {
  const std::string dir = reference_dir();
  ASSERT_FALSE(dir.empty()) << "the reference failed (ffmpeg, python3-pil and python3-numpy are needed; make deps)";
  nlohmann::json man;
  std::ifstream(dir + "/manifest.json") >> man;
  ASSERT_EQ(man["cases"].size(), 5u);
  for (const auto& c : man["cases"]) {
    const std::string file = c["file"];
    SCOPED_TRACE(file);
    const auto bytes = read_bytes(dir + "/" + file);
    const auto pv = m3::vision::preprocess_video(bytes.data(), bytes.size(), {}, {}, {}, true);
    EXPECT_EQ(pv.info.width, int(c["width"]));
    EXPECT_EQ(pv.info.height, int(c["height"]));
    EXPECT_DOUBLE_EQ(pv.info.fps, double(c["fps"]));
    EXPECT_EQ(pv.info.frames_read, int64_t(c["frames"]));
    EXPECT_EQ(pv.indices, c["indices"].get<std::vector<int64_t>>());
    EXPECT_EQ(pv.patches.grid_t, int(c["grid"][0]));
    EXPECT_EQ(pv.patches.grid_h, int(c["grid"][1]));
    EXPECT_EQ(pv.patches.grid_w, int(c["grid"][2]));
    ASSERT_EQ(pv.timestamps.size(), c["timestamps"].size());
    for (size_t g = 0; g < pv.timestamps.size(); ++g) {
      char ts[64];
      std::snprintf(ts, sizeof ts, "]<]%.1f seconds[>[", pv.timestamps[g]);
      EXPECT_EQ(std::string(ts), c["timestamps"][g].get<std::string>());
    }
    const auto ref = read_bytes(dir + "/" + file.substr(0, file.rfind('.')) + ".patches");
    ASSERT_EQ(pv.patches.values.size() * sizeof(float), ref.size());
    size_t diff = 0;
    for (size_t i = 0; i < pv.patches.values.size(); ++i) {
      float r;
      std::memcpy(&r, ref.data() + i * 4, 4);
      diff += pv.patches.values[i] != r;
    }
    EXPECT_EQ(diff, 0u) << "patch values differing from the Pillow reference";
    // Counting only (for /tokenize): the same grid and frames without pixels.
    const auto count = m3::vision::preprocess_video(bytes.data(), bytes.size(), {}, {}, {}, false);
    EXPECT_TRUE(count.patches.values.empty());
    EXPECT_EQ(count.patches.num_patches(), pv.patches.num_patches());
    EXPECT_EQ(count.indices, pv.indices);
  }
}

TEST(VideoPillow, H264Mp4Smoke) {
  const std::string dir = reference_dir();
  ASSERT_FALSE(dir.empty());
  const auto bytes = read_bytes(dir + "/smoke.mp4");
  const auto pv = m3::vision::preprocess_video(bytes.data(), bytes.size(), {}, {}, {}, true);
  EXPECT_EQ(pv.info.fps, 10.0);
  EXPECT_EQ(pv.info.frames_read, 30);
  EXPECT_EQ(pv.indices, (std::vector<int64_t>{0, 10, 20}));
  EXPECT_EQ(pv.patches.grid_t, 2);
  EXPECT_EQ(pv.patches.grid_h, 32);
  EXPECT_EQ(pv.patches.grid_w, 32);
  EXPECT_EQ(pv.patches.values.size(), size_t(2 * 32 * 32) * 1176);
}

TEST(VideoSampling, CeilIntervalRule) {
  using m3::vision::sample_indices;
  EXPECT_EQ(sample_indices(4, 1, 1), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(sample_indices(100, 30, 1), (std::vector<int64_t>{0, 30, 60, 90}));
  EXPECT_EQ(sample_indices(61, 30, 2), (std::vector<int64_t>{0, 15, 30, 45, 60}));
  // 29.97 fps: ceil((prev / 29.97 + 1 - 1e-4) * 29.97).
  EXPECT_EQ(sample_indices(95, 30000.0 / 1001, 1), (std::vector<int64_t>{0, 30, 60, 90}));
  // Sampling faster than the video: every frame once.
  EXPECT_EQ(sample_indices(3, 2, 5), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(sample_indices(0, 30, 1).empty());
  EXPECT_EQ(m3::vision::group_timestamps({0, 30, 60}, 30, 2), (std::vector<double>{0.0, 2.0}));
}

TEST(VideoPillow, BadVideosRefusedByWhatIsWrong) {
  const std::string dir = reference_dir();
  ASSERT_FALSE(dir.empty());
  const auto good = read_bytes(dir + "/v4_ffv1.mkv");
  std::vector<uint8_t> junk(4096);
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = uint8_t(i * 131 + 7);
  EXPECT_NE(error_of(junk).find("not a video container"), std::string::npos) << error_of(junk);
  EXPECT_NE(error_of({}).find("no bytes"), std::string::npos);
  // Truncated: the first third of the file.
  const std::vector<uint8_t> cut(good.begin(), good.begin() + std::ptrdiff_t(good.size() / 3));
  const std::string e_cut = error_of(cut);
  EXPECT_NE(e_cut.find("truncated"), std::string::npos) << "a truncated video: '" << e_cut << "'";
  // An MP4 cut before its index cannot be opened.
  const auto mp4 = read_bytes(dir + "/smoke.mp4");
  const std::vector<uint8_t> mp4_cut(mp4.begin(), mp4.begin() + std::ptrdiff_t(mp4.size() / 2));
  EXPECT_FALSE(error_of(mp4_cut).empty()) << "a truncated MP4 was accepted";
  // Too long (a 4 s clip against a 2 s limit), too many frames, too many pixels.
  VideoOptions vo;
  vo.max_duration = 2;
  EXPECT_NE(error_of(good, vo).find("at most 2.000000 s are accepted"), std::string::npos) << error_of(good, vo);
  vo = {};
  vo.max_frames = 3;
  EXPECT_NE(error_of(good, vo).find("more than 3 frames sampled"), std::string::npos) << error_of(good, vo);
  vo = {};
  vo.total_pixels = 3 * 448 * 448;
  EXPECT_NE(error_of(good, vo).find("total_pixels"), std::string::npos) << error_of(good, vo);
  // Frame size above the decode limits, refused before decoding.
  m3::vision::DecodeLimits small;
  small.max_side = 256;
  try {
    m3::vision::preprocess_video(good.data(), good.size(), small, {}, {}, true);
    ADD_FAILURE() << "a 448x448 video passed a 256-pixel side limit";
  } catch (const m3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("above the limit"), std::string::npos) << e.what();
  }
  // A playlist naming a local file: libav must not open it (no nested URLs, playlists are not containers here).
  const std::string m3u = "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nfile:///etc/hostname\n#EXT-X-ENDLIST\n";
  EXPECT_NE(error_of(std::vector<uint8_t>(m3u.begin(), m3u.end())).find("not a video container"), std::string::npos);
  const std::string concat = "ffconcat version 1.0\nfile " + dir + "/v4_ffv1.mkv\n";
  EXPECT_NE(error_of(std::vector<uint8_t>(concat.begin(), concat.end())).find("not a video container"), std::string::npos);
  // An audio-only container: no video stream.
  const std::string wav = dir + "/tone.mka";
  ASSERT_EQ(std::system(("ffmpeg -hide_banner -loglevel error -y -f lavfi -i sine=frequency=440:duration=1 " + wav).c_str()), 0);
  EXPECT_NE(error_of(read_bytes(wav)).find("no video stream"), std::string::npos) << error_of(read_bytes(wav));
}

}  // namespace
