// CORS headers and preflight answers (see cors.h).
#include "server/cors.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/text_list.h"

namespace m3::server {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

bool all(const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "*") != v.end(); }

bool origin_allowed(const CorsOptions& o, std::string_view origin) {
  return all(o.allowed_origins) ||
         std::find(o.allowed_origins.begin(), o.allowed_origins.end(), origin) != o.allowed_origins.end();
}

// The methods a preflight may name: every HTTP method when "*", else those listed (case as given by
// the browser: methods are case-sensitive tokens, upper-case in practice).
std::vector<std::string> methods(const CorsOptions& o) {
  if (all(o.allowed_methods)) return {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
  std::vector<std::string> m;
  for (const std::string& x : o.allowed_methods) m.push_back(x);
  return m;
}

// Allowed request headers, lower-case, with the CORS-safelisted ones always in.
std::vector<std::string> headers(const CorsOptions& o) {
  std::vector<std::string> h = {"accept", "accept-language", "content-language", "content-type"};
  for (const std::string& x : o.allowed_headers) {
    const std::string l = lower(x);
    if (std::find(h.begin(), h.end(), l) == h.end()) h.push_back(l);
  }
  std::sort(h.begin(), h.end());
  return h;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

std::vector<std::string> parse_cors_list(const std::vector<std::string>& values, const char* flag) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    const std::string t = trim_blanks(v);
    if (!t.empty() && t.front() == '[') {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(t);
      } catch (const nlohmann::json::exception& e) {
        throw Error(std::string(flag) + ": not a JSON list of strings: " + e.what());
      }
      for (const auto& x : j) {
        if (!x.is_string()) throw Error(std::string(flag) + ": expected a JSON list of strings, got " + j.dump());
        out.push_back(x.get<std::string>());
      }
      continue;
    }
    for (std::string& item : split_trimmed(t)) out.push_back(std::move(item));
  }
  if (out.empty()) throw Error(std::string(flag) + ": no value given");
  return out;
}

HeaderList cors_response_headers(const CorsOptions& o, std::string_view origin, bool has_cookie) {
  HeaderList h;
  if (origin.empty() || !origin_allowed(o, origin)) return h;
  // Any origin and no credentials: "*". A credentialed request (a cookie, with credentials allowed)
  // or an explicit origin list: the origin itself, and Vary so caches keep answers apart.
  if (all(o.allowed_origins) && !(has_cookie && o.allow_credentials)) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    h.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    h.emplace_back("Vary", "Origin");
  }
  if (o.allow_credentials) h.emplace_back("Access-Control-Allow-Credentials", "true");
  return h;
}

PreflightAnswer cors_preflight(const CorsOptions& o, std::string_view origin, std::string_view method,
                               std::string_view request_headers) {
  PreflightAnswer a;
  std::vector<std::string> failures;
  const bool explicit_origin = !all(o.allowed_origins) || o.allow_credentials;
  if (origin_allowed(o, origin)) {
    a.headers.emplace_back("Access-Control-Allow-Origin", explicit_origin ? std::string(origin) : std::string("*"));
    if (explicit_origin) a.headers.emplace_back("Vary", "Origin");
  } else {
    failures.push_back("origin");
  }
  const std::vector<std::string> ms = methods(o);
  a.headers.emplace_back("Access-Control-Allow-Methods", join(ms));
  if (std::find(ms.begin(), ms.end(), method) == ms.end()) failures.push_back("method");
  a.headers.emplace_back("Access-Control-Max-Age", "600");
  if (all(o.allowed_headers)) {
    if (std::string asked = trim_blanks(request_headers); !asked.empty())
      a.headers.emplace_back("Access-Control-Allow-Headers", std::move(asked));
  } else {
    const std::vector<std::string> hs = headers(o);
    a.headers.emplace_back("Access-Control-Allow-Headers", join(hs));
    for (const std::string& name : split_trimmed(lower(request_headers)))
      if (std::find(hs.begin(), hs.end(), name) == hs.end()) {
        failures.push_back("headers");
        break;
      }
  }
  if (o.allow_credentials) a.headers.emplace_back("Access-Control-Allow-Credentials", "true");
  if (failures.empty()) {
    a.body = "OK";
  } else {
    a.status = 400;
    a.body = "Disallowed CORS " + join(failures);
  }
  return a;
}

}  // namespace m3::server
