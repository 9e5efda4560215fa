// OpenAI-style API errors: ApiError carries the HTTP status, message, type and the offending
// request field; error_body() renders {"error": {"message", "type", "param", "code"}}.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace m3::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = {})
      : std::runtime_error(message), status(status), param(std::move(param)) {}
  int status;
  std::string param;  // empty = null
};

inline const char* error_type(int status) {
  switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 404: return "NotFoundError";
    case 413: return "RequestTooLargeError";
    case 503: return "ServiceUnavailableError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
  }
}

inline nlohmann::ordered_json error_body(int status, const std::string& message, const std::string& param = {}) {
  nlohmann::ordered_json e;
  e["message"] = message;
  e["type"] = error_type(status);
  e["param"] = param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param);
  e["code"] = status;
  return {{"error", e}};
}

inline ApiError bad_request(const std::string& message, const std::string& param = {}) {
  return ApiError(400, message, param);
}

}  // namespace m3::server
