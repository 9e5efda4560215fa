// A tokenizer directory with the real o200k vocabulary (tests/data/tokenizer/o200k) and M3's special tokens
// at their real ids (model.md 7.1: 200000 on, ]<]image[>[ 200025, ]<]video[>[ 200026, ]<]start of image[>[
// 200029, ]<]end of image[>[ 200030), for tests of the exact ids the chat path gives around images and videos.
#pragma once
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace m3test {

// Writes tokenizer.json and tokenizer_config.json into `dir` (created) and returns it.
inline std::string m3_tokenizer_dir(const std::string& dir) {
  auto tj = nlohmann::json::parse([] {
    std::ifstream f(std::string(M3_TEST_DATA) + "/tokenizer/o200k/tokenizer.json", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }());
  const std::vector<std::string> specials = {
      "]!p~[", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<reponame>", "<filename>",
      "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>",
      "<jupyter_code>", "<jupyter_output>", "<empty_output>", "<commit_before>", "<commit_msg>", "<commit_after>",
      "]~b]", "[e~[", "]!d~[", "<function_call>", "<code_interpreter>", "]<]speech[>[", "]<]image[>[",
      "]<]video[>[", "]<]start of speech[>[", "]<]end of speech[>[", "]<]start of image[>[", "]<]end of image[>[",
      "]<]start of video[>[", "]<]end of video[>[", "]<]vision pad[>[", "]~!b[", "<jupyter_error>", "<add_file>",
      "<delete_file>", "<rename_file>", "<edit_file>", "<commit_message>", "<empty_source_file>", "<repo_struct>",
      "<code_context>", "<file_content>", "<source_files>", "<pr_start>", "<review_comment>", "<filepath>",
      "<file_sep>", "<think>", "</think>", "<tool_call>", "</tool_call>", "]<]frame[>[", "]<]start of frame[>[",
      "]<]end of frame[>[", "<|content_altered_placeholder|>", "]<]minimax[>[", "<mm:think>", "</mm:think>"};
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < specials.size(); ++i)
    added.push_back({{"id", 200000 + int(i)}, {"content", specials[i]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  tj["added_tokens"] = added;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token": "]~!b[", "eos_token": "[e~["})";
  return dir;
}

}  // namespace m3test
