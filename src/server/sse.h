// Server-sent events framing for streamed responses: `data: <json>\n\n` and the final `data: [DONE]`.
#pragma once
#include <string>

namespace m3::server {

inline std::string sse_event(const std::string& json) { return "data: " + json + "\n\n"; }
inline const std::string& sse_done() {
  static const std::string s = "data: [DONE]\n\n";
  return s;
}

}  // namespace m3::server
