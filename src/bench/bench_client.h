// `bench serve`'s view of the server: one HTTP endpoint (base URL and headers, a fresh client per
// request so that concurrent requests never share a connection) and the token counting the
// datasets need, either from a local tokenizer.json or from the server's /tokenize and /detokenize.
#pragma once
#include <httplib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace m3::bench {

struct Endpoint {
  std::string base;
  httplib::Headers headers;
  std::unique_ptr<httplib::Client> client() const;
  nlohmann::json get_json(const std::string& path) const;
  // Returns status and body; throws only when the server cannot be reached.
  std::pair<int, std::string> post(const std::string& path, const nlohmann::json& body) const;
  // The body of a 200 answer, else empty.
  std::string get_text(const std::string& path) const;
};

// Tokenizer access: a local tokenizer.json, or the server's /tokenize and /detokenize.
class TokenBackend {
 public:
  virtual ~TokenBackend() = default;
  virtual std::vector<int32_t> encode(const std::string& text) = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) = 0;
  // Ids usable in random prompts (special tokens excluded).
  virtual std::vector<int32_t> allowed_ids() = 0;
};

class LocalTokens : public TokenBackend {
 public:
  explicit LocalTokens(const std::string& dir) : tok_(Tokenizer::from_dir(dir)) {}
  std::vector<int32_t> encode(const std::string& t) override;
  std::string decode(const std::vector<int32_t>& ids) override;
  std::vector<int32_t> allowed_ids() override;

 private:
  Tokenizer tok_;
};

class ServerTokens : public TokenBackend {
 public:
  ServerTokens(const Endpoint& ep, std::string model) : ep_(ep), model_(std::move(model)) {}
  std::vector<int32_t> encode(const std::string& t) override;
  std::string decode(const std::vector<int32_t>& ids) override;
  // The vocabulary size is found by bisection on /detokenize (valid ids answer 200). Hugging Face
  // tokenizers put the added (special) tokens last, so the top 1% (at least 64 ids) is left out;
  // --tokenizer gives the exact set.
  std::vector<int32_t> allowed_ids() override;

 private:
  const Endpoint& ep_;
  std::string model_;
};

// The server renders the chat template (its /tokenize with `messages`): the prompt token ids of one
// user message, generation prompt added, as a chat request would see them.
std::vector<int32_t> chat_prompt_ids(const Endpoint& ep, const std::string& model, const std::string& user_text);

}  // namespace m3::bench
