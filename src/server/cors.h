// Cross-origin resource sharing, as vLLM's server answers it (its --allowed-origins, --allowed-methods,
// --allowed-headers and --allow-credentials, applied by the CORS middleware in front of every route):
// headers added to responses for requests that carry an Origin, and the answer to a browser's
// preflight (OPTIONS with Access-Control-Request-Method). Pure functions of the request's headers.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace m3::server {

struct CorsOptions {
  std::vector<std::string> allowed_origins{"*"};  // "*": any origin
  std::vector<std::string> allowed_methods{"*"};  // "*": every method
  std::vector<std::string> allowed_headers{"*"};  // "*": whatever the preflight asks for
  bool allow_credentials = false;
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// Parses one flag's values as vLLM accepts them: a JSON list ('["https://a.example"]') or plain
// values, comma-separated or repeated. Throws m3::Error naming the flag for a malformed list.
std::vector<std::string> parse_cors_list(const std::vector<std::string>& values, const char* flag);

// Headers for the response to a request with this Origin (empty origin: none). A disallowed origin
// gets no CORS headers (the browser then withholds the response from the page).
HeaderList cors_response_headers(const CorsOptions& o, std::string_view origin, bool has_cookie);

struct PreflightAnswer {
  int status = 200;  // 400 when the origin, method or a header is not allowed
  std::string body;  // "OK" or "Disallowed CORS origin, method, headers"
  HeaderList headers;
};

// The answer to OPTIONS with Origin and Access-Control-Request-Method (and optionally
// Access-Control-Request-Headers, comma-separated).
PreflightAnswer cors_preflight(const CorsOptions& o, std::string_view origin, std::string_view method,
                               std::string_view request_headers);

}  // namespace m3::server
