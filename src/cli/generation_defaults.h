// The sampling defaults a checkpoint's generation_config.json sets (temperature, top_p, top_k, min_p,
// repetition_penalty), as vLLM applies them to requests that leave those fields out: read once for
// `serve` and for `generate --input`, so both sample alike.
#pragma once
#include <string>

#include "engine/sampler.h"

namespace m3::cli {

// Defaults for the fields generation_config.json may set; the others as SamplingParams has them. A missing
// or unreadable file leaves OpenAI's defaults (temperature 1, top_p 1, no top_k / min_p / penalty).
SamplingParams generation_defaults(const std::string& model_dir);

}  // namespace m3::cli
