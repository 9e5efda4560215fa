// m3::Error: the one exception type raised at the edges (loading, parsing). Its message names the
// culprit (file, tensor, key) and what was expected; the CLI prints it and exits non-zero.
#pragma once
#include <stdexcept>
#include <string>

namespace m3 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace m3
