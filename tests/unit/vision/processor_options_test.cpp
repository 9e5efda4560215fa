// preprocessor_config.json and --mm-processor-kwargs onto the M3 image processor: the sizes they set,
// and each refusal naming its key.
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "vision/preprocess.h"
#include "vision/processor_options.h"

namespace {

using m3::vision::ProcessorConfig;

std::string error_of(void (*f)(const std::string&, ProcessorConfig&), const std::string& text) {
  ProcessorConfig pc;
  try {
    f(text, pc);
  } catch (const m3::Error& e) {
    return e.what();
  }
  return "";
}

void apply_file(const std::string& text, ProcessorConfig& pc) {
  m3::vision::apply_preprocessor_config(text, "preprocessor_config.json", pc);
}

TEST(VisionProcessorOptions, PreprocessorConfigSetsSizesAndNormalisation) {
  ProcessorConfig pc;
  apply_file(R"({"min_pixels": 6272, "max_pixels": 1003520, "patch_size": 14, "merge_size": 2,
                 "temporal_patch_size": 2, "resample": 3, "rescale_factor": 0.00392156862745098,
                 "do_resize": true, "do_normalize": true, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.25, 0.5, 1],
                 "image_processor_type": "MiniMaxM3VLImageProcessor"})",
             pc);
  EXPECT_EQ(pc.min_pixels, 6272);
  EXPECT_EQ(pc.max_pixels, 1003520);
  EXPECT_FLOAT_EQ(pc.image_mean[1], 0.5f);
  EXPECT_FLOAT_EQ(pc.image_std[0], 0.25f);
  EXPECT_FLOAT_EQ(pc.image_std[2], 1.0f);
  // transformers' newer `size` spelling, with the flat keys winning where both are given.
  ProcessorConfig s;
  apply_file(R"({"size": {"shortest_edge": 3136, "longest_edge": 200704}})", s);
  EXPECT_EQ(s.min_pixels, 3136);
  EXPECT_EQ(s.max_pixels, 200704);
  apply_file(R"({"size": {"shortest_edge": 3136, "longest_edge": 200704}, "max_pixels": 100352})", s);
  EXPECT_EQ(s.max_pixels, 100352);
  // Then the sizes reach smart_resize: 448 x 448 under max_pixels 224^2 becomes 224 x 224.
  ProcessorConfig k;
  m3::vision::apply_mm_processor_kwargs(R"({"max_pixels": 50176})", k);
  const auto rs = m3::vision::smart_resize(448, 448, k);
  EXPECT_EQ(rs.height, 224);
  EXPECT_EQ(rs.width, 224);
}

TEST(VisionProcessorOptions, PreprocessorConfigDisagreementsAreRefusedByName) {
  EXPECT_NE(error_of(apply_file, R"({"patch_size": 16})").find("patch_size 16, expected 14"), std::string::npos);
  EXPECT_NE(error_of(apply_file, R"({"merge_size": 3})").find("merge_size 3, expected 2"), std::string::npos);
  EXPECT_NE(error_of(apply_file, R"({"resample": 2})").find("resample 2, expected 3"), std::string::npos);
  EXPECT_NE(error_of(apply_file, R"({"rescale_factor": 1.0})").find("rescale_factor 1.0, expected 1/255"),
            std::string::npos);
  EXPECT_NE(error_of(apply_file, R"({"do_normalize": false})").find("do_normalize false, expected true"),
            std::string::npos);
  EXPECT_NE(error_of(apply_file, R"({"image_std": [1, 0, 1]})").find("image_std"), std::string::npos);
  EXPECT_NE(error_of(apply_file, R"({"image_mean": [1, 2]})").find("image_mean: expected 3 numbers"), std::string::npos);
  EXPECT_NE(error_of(apply_file, R"({"min_pixels": 500000})").find("min_pixels 500000 is above max_pixels 451584"),
            std::string::npos);
  EXPECT_NE(error_of(apply_file, "[1]").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error_of(apply_file, "{").find("not valid JSON"), std::string::npos);
}

TEST(VisionProcessorOptions, MmProcessorKwargsTakePixelBoundsAndVideoSampling) {
  ProcessorConfig pc;
  m3::vision::apply_mm_processor_kwargs("", pc);  // no flag: defaults
  EXPECT_EQ(pc.min_pixels, 3136);
  EXPECT_EQ(pc.max_pixels, 451584);
  m3::vision::apply_mm_processor_kwargs(R"({"min_pixels": 12544, "max_pixels": 100352})", pc);
  EXPECT_EQ(pc.min_pixels, 12544);
  EXPECT_EQ(pc.max_pixels, 100352);
  void (*f)(const std::string&, ProcessorConfig&) = m3::vision::apply_mm_processor_kwargs;
  EXPECT_NE(error_of(f, R"({"do_pan_and_scan": true})").find("--mm-processor-kwargs: 'do_pan_and_scan' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(f, R"({"fps": 0})").find("fps: expected a positive number"), std::string::npos);
  // The video keys, and the pixel bounds reaching the video processor too (vLLM passes the kwargs to both).
  m3::vision::VideoOptions vo;
  EXPECT_EQ(vo.max_pixels, 602112);
  EXPECT_EQ(vo.fps, 1.0);
  m3::vision::apply_mm_processor_kwargs(
      R"({"fps": 2.5, "max_frames": 16, "total_pixels": 1000000, "max_duration": 20, "max_pixels": 200704})", pc, vo);
  EXPECT_EQ(vo.fps, 2.5);
  EXPECT_EQ(vo.max_frames, 16);
  EXPECT_EQ(vo.total_pixels, 1000000);
  EXPECT_EQ(vo.max_duration, 20.0);
  EXPECT_EQ(vo.max_pixels, 200704);
  EXPECT_EQ(pc.max_pixels, 200704);
  EXPECT_NE(error_of(f, R"({"max_pixels": -1})").find("max_pixels: expected a positive integer"), std::string::npos);
  EXPECT_NE(error_of(f, R"({"min_pixels": 100, "max_pixels": 100})").find("below one merged patch"), std::string::npos);
  EXPECT_NE(error_of(f, R"({"min_pixels": "big"})").find("min_pixels: expected a positive integer"), std::string::npos);
}

}  // namespace
