// Image URLs of chat content parts (server/image_inputs.h): strict base64, data: and file:// URLs, the
// refusals (an http URL without a host, other schemes, paths outside --allowed-local-media-path) each naming the part, and
// --limit-mm-per-prompt's JSON.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "server/errors.h"
#include "server/image_inputs.h"

using namespace m3;
using namespace m3::server;
namespace fs = std::filesystem;

namespace {

std::string refusal(const ImageInput& in, const MediaOptions& opt) {
  try {
    load_image_bytes(in, opt);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages");
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ImageInputs, Base64) {
  std::vector<uint8_t> out;
  ASSERT_TRUE(base64_decode("xxaGVsbG8=", 2, out));
  EXPECT_EQ(std::string(out.begin(), out.end()), "hello");
  ASSERT_TRUE(base64_decode("aGVsbG8", 0, out));  // padding optional
  EXPECT_EQ(std::string(out.begin(), out.end()), "hello");
  ASSERT_TRUE(base64_decode("_-8=", 0, out));  // URL-safe alphabet
  EXPECT_EQ(out, (std::vector<uint8_t>{0xff, 0xef}));
  EXPECT_FALSE(base64_decode("aGVs bG8=", 0, out));
  EXPECT_FALSE(base64_decode("a", 0, out));
  EXPECT_FALSE(base64_decode("aGVsbG8==", 0, out));
  EXPECT_FALSE(base64_decode("@@@@", 0, out));
}

TEST(ImageInputs, DataUrls) {
  MediaOptions opt;
  const auto b = load_image_bytes({"messages[0].content[1]", "data:image/png;base64,aGVsbG8="}, opt);
  EXPECT_EQ(std::string(b.begin(), b.end()), "hello");
  const std::string at = "messages[2].content[0]";
  EXPECT_EQ(refusal({at, "data:image/png;base64,%%%"}, opt), at + ": the data URL is not valid base64");
  EXPECT_EQ(refusal({at, "data:image/png;base64,"}, opt), at + ": the data URL holds no bytes");
  EXPECT_NE(refusal({at, "data:image/png,abc"}, opt).find(at + ": only base64 data URLs"), std::string::npos);
  EXPECT_NE(refusal({at, "data:text/plain;base64,aGVsbG8="}, opt).find("media type must be image/"), std::string::npos);
  EXPECT_NE(refusal({at, "data:image/png;base64"}, opt).find("needs a ','"), std::string::npos);
  opt.decode.max_bytes = 3;
  EXPECT_NE(refusal({at, "data:image/png;base64,aGVsbG8gd29ybGQ="}, opt).find("at most 3 are accepted"),
            std::string::npos);
}

TEST(ImageInputs, SchemesAndLocalFiles) {
  MediaOptions opt;
  const std::string at = "messages[0].content[0]";
  EXPECT_NE(refusal({at, "http://"}, opt).find(at + ": image URL without a host"), std::string::npos);
  EXPECT_NE(refusal({at, "ftp://x/a.png"}, opt).find("unsupported image URL scheme"), std::string::npos);
  EXPECT_NE(refusal({at, "file:///etc/hostname"}, opt).find("--allowed-local-media-path"), std::string::npos);

  const fs::path dir = fs::temp_directory_path() / ("m3_image_inputs_" + std::to_string(::getpid()));
  fs::create_directories(dir / "in");
  std::ofstream(dir / "in" / "a.bin", std::ios::binary) << "abc";
  std::ofstream(dir / "out.bin", std::ios::binary) << "xyz";
  opt.allowed_local_media_path = (dir / "in").string();
  const auto b = load_image_bytes({at, "file://" + (dir / "in" / "a.bin").string()}, opt);
  EXPECT_EQ(std::string(b.begin(), b.end()), "abc");
  EXPECT_NE(refusal({at, "file://" + (dir / "out.bin").string()}, opt).find("outside --allowed-local-media-path"),
            std::string::npos);
  EXPECT_NE(refusal({at, "file://" + (dir / "in" / ".." / "out.bin").string()}, opt).find("outside"),
            std::string::npos);
  EXPECT_NE(refusal({at, "file://" + (dir / "in" / "none.png").string()}, opt).find("no such file"),
            std::string::npos);
  EXPECT_NE(refusal({at, "file://relative/a.png"}, opt).find("bad path"), std::string::npos);
  // Percent-escapes are decoded (Path.as_uri() writes a space as %20, non-ASCII as UTF-8 %XX), also for
  // the escape check: %2e%2e is "..".
  std::ofstream(dir / "in" / "sp ace \xe5\x9b\xbe.bin", std::ios::binary) << "def";
  const auto c = load_image_bytes({at, "file://" + (dir / "in").string() + "/sp%20ace%20%E5%9B%BE.bin"}, opt);
  EXPECT_EQ(std::string(c.begin(), c.end()), "def");
  EXPECT_NE(refusal({at, "file://" + (dir / "in").string() + "/%2e%2e/out.bin"}, opt).find("outside"), std::string::npos);
  EXPECT_NE(refusal({at, "file://" + (dir / "in").string() + "/a%00.bin"}, opt).find("NUL"), std::string::npos);
  fs::remove_all(dir);
}

TEST(ImageInputs, LimitMmPerPrompt) {
  MediaOptions opt;
  EXPECT_EQ(opt.limit_image, 999);
  EXPECT_EQ(opt.limit_video, 999);
  parse_limit_mm(R"({"image": 3, "video": 2, "audio": 0})", opt);
  EXPECT_EQ(opt.limit_image, 3);
  EXPECT_EQ(opt.limit_video, 2);
  auto err = [](const std::string& j) {
    MediaOptions o;
    try {
      parse_limit_mm(j, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(R"({"audio": 1})").find("audio input is not supported"), std::string::npos);
  EXPECT_NE(err(R"({"video": -1})").find("\"video\" must be a non-negative integer"), std::string::npos);
  EXPECT_NE(err(R"({"image": -1})").find("\"image\" must be a non-negative integer"), std::string::npos);
  EXPECT_NE(err(R"({"hologram": 1})").find("unknown modality \"hologram\""), std::string::npos);
  EXPECT_NE(err("[1]").find("expected a JSON object"), std::string::npos);
}
