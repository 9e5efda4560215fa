// cpp-httplib's client errors in words a user can act on ("Connection" alone says little), for every
// client in the project: the Hub downloads, bench serve, image URLs and the P/D proxy. Header-only: only
// targets that link cpp-httplib include it.
#pragma once
#include <httplib.h>

#include <string>

namespace m3 {

inline std::string http_error_text(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection: return "could not connect (no such host, or nothing listening there)";
    case httplib::Error::ConnectionTimeout: return "the connection timed out";
    case httplib::Error::Read: return "the connection broke mid-answer";
    case httplib::Error::Write: return "the request could not be sent";
    case httplib::Error::ExceedRedirectCount: return "too many redirects";
    case httplib::Error::SSLConnection: return "the TLS handshake failed";
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification:
      return "the TLS certificate check failed (install Debian's ca-certificates, or point SSL_CERT_FILE at the CA "
             "bundle that signs this endpoint)";
    default: return "HTTP client error " + httplib::to_string(e);
  }
}

}  // namespace m3
