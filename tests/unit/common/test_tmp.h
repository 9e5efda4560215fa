// A scratch directory private to this test process: ctest runs test cases as parallel processes,
// so fixed names under the shared temp dir would race. The directory and what the tests wrote in it
// are removed when the process exits normally (a crashed test leaves its directory for inspection).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace m3test {

inline std::string test_tmp_dir() {
  struct Dir {
    std::string path = testing::TempDir() + "/m3test-" + std::to_string(::getpid());
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;  // best effort: nothing to report at exit
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

}  // namespace m3test
