// `bench serve`'s HTTP endpoint and token counting (see bench_client.h).
#include "bench/bench_client.h"

#include <algorithm>

#include "base/error.h"
#include "base/http_error_text.h"

namespace m3::bench {

using json = nlohmann::json;

std::unique_ptr<httplib::Client> Endpoint::client() const {
  auto c = std::make_unique<httplib::Client>(base);
  c->set_connection_timeout(10);
  c->set_read_timeout(3600);
  c->set_write_timeout(600);
  c->set_default_headers(headers);
  return c;
}

json Endpoint::get_json(const std::string& path) const {
  auto r = client()->Get(path.c_str());
  if (!r) throw Error("GET " + base + path + ": " + http_error_text(r.error()));
  if (r->status != 200) throw Error("GET " + base + path + ": HTTP " + std::to_string(r->status) + ": " + r->body);
  return json::parse(r->body);
}

std::pair<int, std::string> Endpoint::post(const std::string& path, const json& body) const {
  auto r = client()->Post(path.c_str(), body.dump(), "application/json");
  if (!r) throw Error("POST " + base + path + ": " + http_error_text(r.error()));
  return {r->status, r->body};
}

std::string Endpoint::get_text(const std::string& path) const {
  auto r = client()->Get(path.c_str());
  return (r && r->status == 200) ? r->body : std::string();
}

std::vector<int32_t> LocalTokens::encode(const std::string& t) { return tok_.encode(t, true); }

std::string LocalTokens::decode(const std::vector<int32_t>& ids) { return tok_.decode(ids, false); }

std::vector<int32_t> LocalTokens::allowed_ids() {
  std::vector<int32_t> a;
  for (int32_t i = 0; i < tok_.vocab_size(); ++i)
    if (tok_.is_valid(i) && !tok_.is_special(i)) a.push_back(i);
  return a;
}

std::vector<int32_t> ServerTokens::encode(const std::string& t) {
  auto [st, body] = ep_.post("/tokenize", {{"model", model_}, {"prompt", t}});
  if (st != 200) throw Error("/tokenize: HTTP " + std::to_string(st) + ": " + body);
  return json::parse(body).at("tokens").get<std::vector<int32_t>>();
}

std::string ServerTokens::decode(const std::vector<int32_t>& ids) {
  auto [st, body] = ep_.post("/detokenize", {{"model", model_}, {"tokens", ids}});
  if (st != 200) throw Error("/detokenize: HTTP " + std::to_string(st) + ": " + body);
  return json::parse(body).at("prompt").get<std::string>();
}

std::vector<int32_t> ServerTokens::allowed_ids() {
  auto valid = [&](int32_t id) { return ep_.post("/detokenize", {{"model", model_}, {"tokens", {id}}}).first == 200; };
  if (!valid(0)) throw Error("/detokenize does not accept token id 0; pass --tokenizer DIR");
  int64_t lo = 0, hi = 1 << 24;  // valid(lo), !valid(hi)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (valid(int32_t(mid)) ? lo : hi) = mid;
  }
  const int64_t vocab = lo + 1;
  const int64_t keep = std::max<int64_t>(1, vocab - std::max<int64_t>(64, vocab / 100));
  std::vector<int32_t> a(static_cast<size_t>(keep));
  for (int64_t i = 0; i < keep; ++i) a[size_t(i)] = int32_t(i);
  return a;
}

std::vector<int32_t> chat_prompt_ids(const Endpoint& ep, const std::string& model, const std::string& user_text) {
  const json body = {{"model", model},
                     {"messages", json::array({{{"role", "user"}, {"content", user_text}}})},
                     {"add_generation_prompt", true}};
  auto [st, text] = ep.post("/tokenize", body);
  if (st != 200) throw Error("/tokenize with messages (the chat template): HTTP " + std::to_string(st) + ": " + text);
  return json::parse(text).at("tokens").get<std::vector<int32_t>>();
}

}  // namespace m3::bench
