// What the chat image and video tests set up alike: make-model's tiny m31 checkpoint with its vision tower,
// the tower's encoder, a tokenizer and a server context with the real M3 chat template, for tokenize_chat
// without HTTP. With real_ids, the placeholders are M3's real ids (image 200025, video 200026) and the
// tokenizer the o200k vocabulary with M3's specials (m3_tokenizer.h), so the exact ids can be checked.
#pragma once
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_template.h"
#include "m3_tokenizer.h"
#include "model/config.h"
#include "model/image_encoder.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"
#include "tools/make_model.h"

namespace m3test {

inline std::string slurp_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

struct ChatMediaSetup {
  ChatMediaSetup(const std::string& dir, uint64_t seed, bool real_ids) {
    m3::MakeModelOptions o = m3::make_model_preset("tiny", m3::ModelLayout::M31);
    o.seed = seed;
    m3::make_model(o, dir);
    if (real_ids) {  // a tiny vocabulary makes make-model pick stand-in placeholder ids
      auto cfg = nlohmann::json::parse(slurp_file(dir + "/config.json"));
      cfg["image_token_index"] = 200025;
      cfg["video_token_index"] = 200026;
      std::ofstream(dir + "/config.json") << cfg.dump(2);
    }
    mc = m3::ModelConfig::from_dir(dir);
    enc = std::make_unique<m3::ImageEncoder>(dir, mc.hidden);
    tok = std::make_unique<m3::Tokenizer>(m3::Tokenizer::from_dir(real_ids ? m3_tokenizer_dir(dir + "/m3tok") : dir));
    ctx.served_names = {"tiny"};
    ctx.tok = tok.get();
    ctx.vocab = real_ids ? 200064 : mc.vocab;
    ctx.max_model_len = 4096;
    ctx.images = enc.get();
    if (real_ids) {
      ctx.bos_token = tok->token_bytes(tok->bos_id());
      ctx.eos_token = tok->token_bytes(tok->eos_id());
    }
    ctx.chat_template =
        std::make_shared<m3::chat::ChatTemplate>(slurp_file(std::string(M3_TEST_DATA) + "/chat/MiniMax-M3.jinja"));
  }
  m3::ModelConfig mc;
  std::unique_ptr<m3::ImageEncoder> enc;
  std::unique_ptr<m3::Tokenizer> tok;
  m3::server::ServerContext ctx;
};

}  // namespace m3test
