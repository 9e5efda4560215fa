// `m3serve logits`: run a token file, or a chat request with images (--input), through the model (one
// prefill, or one token at a time with --decode) and write raw little-endian float32 logits
// [n_tokens, vocab]. --input renders the messages with the server's own code (template, image markers
// expanded into placeholder tokens, the vision tower's embeddings placed on them), so a reference can
// check the whole multimodal forward.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "cli/chat_template_file.h"
#include "cli/commands.h"
#include "cli/model_flags.h"
#include "model/image_encoder.h"
#include "model/model.h"
#include "model/vision_config.h"
#include "server/errors.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace m3::cli {

namespace {

std::vector<int32_t> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open token file");
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long v = std::strtol(word.c_str(), &end, 10);
    if (*end != '\0' || word.empty() || v < 0 || v > INT32_MAX)
      throw Error(path + ": \"" + word + "\" is not a token id (expected whitespace-separated non-negative integers)");
    ids.push_back(int32_t(v));
  }
  return ids;
}

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open " + what);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The fields of a chat request that decide the prompt; anything else (sampling, max_tokens, ...) has no
// meaning for logits and is refused by name rather than ignored.
const char* const kInputFields[] = {"messages", "tools", "chat_template_kwargs", "add_generation_prompt",
                                    "reasoning_effort"};

struct ChatPrompt {
  std::vector<int32_t> ids;
  std::vector<MultimodalSpan> mm;  // each holds its image's embeddings
};

// Renders `path` (a chat-completions body) as the server does and tokenizes it, images encoded.
ChatPrompt chat_prompt(const std::string& path, const std::string& model_dir, const std::string& tokenizer_dir,
                       const std::string& template_flag, const std::string& media_dir, int64_t hidden, int64_t vocab) {
  using ojson = nlohmann::ordered_json;
  ojson body;
  try {
    body = ojson::parse(read_text(path, "the chat request"));
  } catch (const ojson::parse_error& e) {
    throw Error(path + ": not JSON (" + e.what() + ")");
  }
  if (!body.is_object()) throw Error(path + ": expected a chat request object {\"messages\": [...]}");
  for (auto it = body.begin(); it != body.end(); ++it) {
    bool known = false;
    for (const char* f : kInputFields) known = known || it.key() == f;
    if (!known)
      throw Error(path + ": field '" + it.key() +
                  "' is not read by logits --input (it takes messages, tools, chat_template_kwargs, "
                  "add_generation_prompt, reasoning_effort)");
  }
  ChatPrompt out;
  const Tokenizer tok = Tokenizer::from_dir(tokenizer_dir);
  server::ServerContext ctx;
  ctx.tok = &tok;
  ctx.vocab = vocab;
  if (tok.bos_id() >= 0) ctx.bos_token = tok.token_bytes(tok.bos_id());
  if (tok.eos_id() >= 0) ctx.eos_token = tok.token_bytes(tok.eos_id());
  const std::string tmpl = load_chat_template(template_flag, tokenizer_dir);
  if (!tmpl.empty()) ctx.chat_template = std::make_shared<chat::ChatTemplate>(tmpl);
  ctx.media.allowed_local_media_path = media_dir;
  std::unique_ptr<ImageEncoder> encoder;
  if (VisionConfig::from_json_text(read_text(model_dir + "/config.json", "config.json"), model_dir + "/config.json",
                                   int(hidden))
          .present) {
    encoder = std::make_unique<ImageEncoder>(model_dir, int(hidden));
    encoder->set_cache_bytes(0);  // each image is encoded once here
    const int32_t img = encoder->config().image_token_id;
    if (img < 0 || img >= vocab)
      throw Error(model_dir + "/config.json: image_token_index " + std::to_string(img) +
                  " is outside the vocabulary (" + std::to_string(vocab) + ")");
    ctx.images = encoder.get();
  }
  try {
    std::vector<server::ImageInput> images;
    const std::string text = server::render_messages(body, ctx, true, &images);
    server::ChatTokens ct = server::tokenize_chat(text, images, ctx, true);
    out.ids = std::move(ct.ids);
    out.mm = std::move(ct.mm);
  } catch (const server::ApiError& e) {
    throw Error(path + ": " + e.what());
  }
  for (int32_t id : out.ids)
    if (id >= vocab)
      throw Error(path + ": the prompt holds token id " + std::to_string(id) + ", outside the vocabulary (" +
                  std::to_string(vocab) + ")");
  return out;
}

}  // namespace

void register_logits(CLI::App& app) {
  auto* sub = app.add_subcommand("logits", "Write the logits of every position of a token file");
  struct Opts {
    std::string model, tokens, input, out, tokens_out, chat_template, media_dir, attention = "sparse";
    bool decode = false;
    ModelFlags model_flags;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--model", o->model, "Checkpoint directory (config.json + safetensors) or Hugging Face Hub id")
      ->required();
  auto* tokens_opt = sub->add_option("--tokens", o->tokens, "File of whitespace-separated token ids");
  auto* input_opt = sub->add_option(
      "--input", o->input,
      "A chat-completions request (JSON: messages with text and image_url parts, tools, chat_template_kwargs, "
      "add_generation_prompt, reasoning_effort) rendered and tokenized as the server does; the images' vision-tower "
      "embeddings replace their placeholder tokens");
  tokens_opt->excludes(input_opt);
  sub->add_option("--out", o->out, "Output file: raw little-endian float32 [n_tokens, vocab]")->required();
  sub->add_option("--tokens-out", o->tokens_out, "Also write the prompt's token ids (whitespace-separated)");
  sub->add_option("--chat-template", o->chat_template, "With --input: chat template file (default the checkpoint's)")
      ->needs(input_opt);
  sub->add_option("--allowed-local-media-path", o->media_dir, "With --input: file:// image URLs are read under DIR")
      ->needs(input_opt);
  sub->add_flag("--decode", o->decode, "Feed the tokens one at a time through the cache instead of one prefill");
  sub->add_option("--attention", o->attention, "sparse (the model), oracle (dense with MSA mask), dense (ignore MSA)")
      ->check(CLI::IsMember({"sparse", "oracle", "dense"}));
  add_model_flags(sub, o->model_flags);
  sub->callback([o] {
    const ModelOptions mo = o->model_flags.options();  // flag errors before a download
    const ModelDirs dirs = resolve_model_dirs(o->model_flags.ref, o->model);
    Model model(dirs.model, mo);
    if (const std::string d = describe_model_flags(o->model_flags, model); !d.empty())
      std::fprintf(stderr, "[m3serve] %s\n", d.c_str());
    if (o->tokens.empty() == o->input.empty()) throw Error("logits: give --tokens FILE or --input REQUEST.json");
    const int64_t V = model.config().vocab;
    std::vector<int32_t> ids;
    ChatPrompt chat;
    if (!o->input.empty()) {
      chat = chat_prompt(o->input, dirs.model, dirs.tokenizer, o->chat_template, o->media_dir, model.config().hidden, V);
      ids = chat.ids;
      if (ids.empty()) throw Error(o->input + ": the rendered prompt has no tokens");
    } else {
      ids = read_token_file(o->tokens);
      if (ids.empty()) throw Error(o->tokens + ": no token ids");
    }
    const int64_t n = int64_t(ids.size());
    for (int32_t id : ids)
      if (id >= V)
        throw Error((o->input.empty() ? o->tokens : o->input) + ": token id " + std::to_string(id) + " is outside the vocabulary (" + std::to_string(V) + ")");
    if (!o->tokens_out.empty()) {
      std::ofstream t(o->tokens_out);
      for (int64_t i = 0; i < n; ++i) t << ids[size_t(i)] << (i + 1 < n ? ' ' : '\n');
      if (!t) throw Error(o->tokens_out + ": write failed");
    }
    // Per position, the image embedding that replaces the placeholder token's own, or null.
    std::vector<const float*> embeds(size_t(n), nullptr);
    for (const MultimodalSpan& s : chat.mm)
      for (int64_t i = 0; i < s.count; ++i)
        embeds[size_t(s.offset + i)] = s.embeds->data() + i * model.config().hidden;
    std::vector<float> logits(size_t(n * V));
    ForwardOptions fo;
    fo.attention = o->attention == "oracle" ? AttentionPath::DenseMaskOracle
                   : o->attention == "dense" ? AttentionPath::DenseIgnoreMsa
                                             : AttentionPath::Sparse;
    SeqCache cache = model.new_cache(n);
    // One step of `len` tokens from position `at` (Model::forward with the image rows' embeddings).
    auto step = [&](int64_t at, int64_t len, bool all) {
      cache.reserve(cache.n_tokens + len);
      BatchItem it;
      it.kv = &cache;
      it.tokens = ids.data() + at;
      it.n = len;
      it.start = cache.n_tokens;
      it.logits_from = all ? 0 : len - 1;
      it.embeds = chat.mm.empty() ? nullptr : embeds.data() + at;
      model.forward_batch(&it, 1, logits.data() + (all ? at : at + len - 1) * V, fo.attention);
      cache.n_tokens += len;
    };
    const auto t0 = std::chrono::steady_clock::now();
    if (o->decode) {
      for (int64_t t = 0; t < n; ++t) step(t, 1, false);
    } else {
      step(0, n, true);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ofstream out(o->out, std::ios::binary);
    if (!out) throw Error(o->out + ": cannot open for writing");
    out.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * 4));
    if (!out) throw Error(o->out + ": write failed");
    std::fprintf(stderr, "%lld tokens (%s) in %.3f s: %.1f tokens/s\n", (long long)n, o->decode ? "decode" : "prefill",
                 s, double(n) / s);
  });
}

}  // namespace m3::cli
