// A scratch directory private to this test process: ctest runs test cases as parallel processes,
// so fixed names under the shared temp dir would race.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace m3test {

inline std::string test_tmp_dir() {
  static const std::string dir = [] {
    const std::string d = testing::TempDir() + "/m3test-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

}  // namespace m3test
