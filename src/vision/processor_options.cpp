// preprocessor_config.json and --mm-processor-kwargs onto the image processor's settings (see the header).
#include "vision/processor_options.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace m3::vision {
namespace {

using nlohmann::json;

json parse_object(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(where + ": expected a JSON object");
  return j;
}

int64_t positive_int(const json& v, const std::string& what) {
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) throw Error(what + ": expected a positive integer, got " + v.dump());
  return v.get<int64_t>();
}

void check_bounds(const ProcessorConfig& pc, const std::string& where) {
  const int64_t f2 = int64_t(pc.factor()) * pc.factor();
  if (pc.min_pixels > pc.max_pixels)
    throw Error(where + ": min_pixels " + std::to_string(pc.min_pixels) + " is above max_pixels " +
                std::to_string(pc.max_pixels));
  if (pc.max_pixels < f2)
    throw Error(where + ": max_pixels " + std::to_string(pc.max_pixels) + " is below one merged patch (" +
                std::to_string(pc.factor()) + "x" + std::to_string(pc.factor()) + " = " + std::to_string(f2) + ")");
}

void triple(const json& v, const std::string& what, float out[3]) {
  if (!v.is_array() || v.size() != 3) throw Error(what + ": expected 3 numbers, got " + v.dump());
  for (int c = 0; c < 3; ++c) {
    if (!v[c].is_number()) throw Error(what + ": expected 3 numbers, got " + v.dump());
    out[c] = v[c].get<float>();
  }
}

void must_equal(const json& j, const char* key, int64_t expected, const std::string& where, const char* why) {
  if (!j.contains(key) || j[key].is_null()) return;
  if (!j[key].is_number_integer() || j[key].get<int64_t>() != expected)
    throw Error(where + ": " + key + " " + j[key].dump() + ", expected " + std::to_string(expected) + " (" + why + ")");
}

}  // namespace

void apply_preprocessor_config(const std::string& json_text, const std::string& where, ProcessorConfig& pc) {
  const json j = parse_object(json_text, where);
  must_equal(j, "patch_size", pc.patch_size, where, "the vision tower's patch size");
  must_equal(j, "merge_size", pc.merge_size, where, "the tower's spatial_merge_size");
  must_equal(j, "temporal_patch_size", pc.temporal_patch_size, where, "the tower's temporal_patch_size");
  must_equal(j, "resample", 3, where, "bicubic, the only resampling implemented");
  if (j.contains("rescale_factor") && !j["rescale_factor"].is_null() &&
      (!j["rescale_factor"].is_number() || std::fabs(j["rescale_factor"].get<double>() * 255.0 - 1.0) > 1e-9))
    throw Error(where + ": rescale_factor " + j["rescale_factor"].dump() + ", expected 1/255");
  for (const char* key : {"do_resize", "do_rescale", "do_normalize", "do_convert_rgb"})
    if (j.contains(key) && j[key] != json(true))
      throw Error(where + ": " + key + " " + j[key].dump() + ", expected true (the M3 processor always does it)");
  if (j.contains("size") && j["size"].is_object()) {
    const json& s = j["size"];
    if (s.contains("shortest_edge")) pc.min_pixels = positive_int(s["shortest_edge"], where + ": size.shortest_edge");
    if (s.contains("longest_edge")) pc.max_pixels = positive_int(s["longest_edge"], where + ": size.longest_edge");
  }
  // The flat keys win over `size`, as transformers' Qwen2-VL processor reads them last.
  if (j.contains("min_pixels") && !j["min_pixels"].is_null()) pc.min_pixels = positive_int(j["min_pixels"], where + ": min_pixels");
  if (j.contains("max_pixels") && !j["max_pixels"].is_null()) pc.max_pixels = positive_int(j["max_pixels"], where + ": max_pixels");
  if (j.contains("image_mean")) triple(j["image_mean"], where + ": image_mean", pc.image_mean);
  if (j.contains("image_std")) {
    triple(j["image_std"], where + ": image_std", pc.image_std);
    for (float s : pc.image_std)
      if (!(s > 0.0f)) throw Error(where + ": image_std " + j["image_std"].dump() + ", expected positive values");
  }
  check_bounds(pc, where);
}

void apply_mm_processor_kwargs(const std::string& json_text, ProcessorConfig& pc, VideoOptions& video) {
  if (json_text.empty()) return;
  const std::string where = "--mm-processor-kwargs";
  const json j = parse_object(json_text, where);
  auto positive_number = [&](const json& v, const std::string& what) {
    if (!v.is_number() || !(v.get<double>() > 0)) throw Error(what + ": expected a positive number, got " + v.dump());
    return v.get<double>();
  };
  for (const auto& [key, value] : j.items()) {
    if (key == "min_pixels")
      pc.min_pixels = video.min_pixels = positive_int(value, where + ": min_pixels");
    else if (key == "max_pixels")
      pc.max_pixels = video.max_pixels = positive_int(value, where + ": max_pixels");
    else if (key == "fps")
      video.fps = positive_number(value, where + ": fps");
    else if (key == "max_duration")
      video.max_duration = positive_number(value, where + ": max_duration");
    else if (key == "max_frames")
      video.max_frames = positive_int(value, where + ": max_frames");
    else if (key == "total_pixels")
      video.total_pixels = positive_int(value, where + ": total_pixels");
    else
      throw Error(where + ": '" + key +
                  "' is not supported (supported: min_pixels, max_pixels, fps, max_frames, total_pixels, max_duration)");
  }
  check_bounds(pc, where);
  ProcessorConfig v = pc;
  v.min_pixels = video.min_pixels;
  v.max_pixels = video.max_pixels;
  check_bounds(v, where + " (video)");
  if (video.total_pixels < video.min_pixels)
    throw Error(where + ": total_pixels " + std::to_string(video.total_pixels) + " is below one frame's min_pixels " +
                std::to_string(video.min_pixels));
}

void apply_mm_processor_kwargs(const std::string& json_text, ProcessorConfig& pc) {
  VideoOptions scratch;
  apply_mm_processor_kwargs(json_text, pc, scratch);
}

}  // namespace m3::vision
