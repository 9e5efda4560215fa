// Where the M3 image processor's settings come from besides the defaults of model.md section 9.1: the
// checkpoint's preprocessor_config.json (transformers' keys) and the serve flag --mm-processor-kwargs
// (vLLM's spelling: min_pixels / max_pixels, and the video keys fps, max_frames, total_pixels,
// max_duration). Keys that change the math are checked, never ignored.
#pragma once
#include <string>

#include "vision/preprocess.h"
#include "vision/video_sampling.h"

namespace m3::vision {

// Applies preprocessor_config.json's text (`where` names the file in errors): min_pixels / max_pixels or
// size {shortest_edge, longest_edge}, image_mean, image_std; patch_size, merge_size, temporal_patch_size,
// resample, rescale_factor and the do_* switches must agree with what this processor does. Throws m3::Error.
void apply_preprocessor_config(const std::string& json_text, const std::string& where, ProcessorConfig& pc);

// Applies --mm-processor-kwargs (a JSON object; empty text: nothing): min_pixels, max_pixels (the image
// and the video processor's per-frame bounds, as vLLM hands the kwargs to both), fps, max_frames,
// total_pixels, max_duration (video). Any other key is refused by name. Throws m3::Error.
void apply_mm_processor_kwargs(const std::string& json_text, ProcessorConfig& pc, VideoOptions& video);
void apply_mm_processor_kwargs(const std::string& json_text, ProcessorConfig& pc);

}  // namespace m3::vision
