// m3serve's version, as `m3serve --version` prints it and GET /version reports it.
#pragma once

namespace m3 {
inline constexpr const char* kVersion = "0.1.0";
}  // namespace m3
