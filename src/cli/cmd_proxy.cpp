// `m3serve proxy --prefill URL... --decode URL...`: the prefill/decode disaggregation proxy for plain
// OpenAI clients (src/proxy/pd_proxy.h).
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "proxy/pd_proxy.h"

namespace m3::cli {

void register_proxy(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "proxy", "Prefill/decode disaggregation proxy: prompt on a prefill engine, KV pulled by a decode engine");
  auto o = std::make_shared<proxy::ProxyOptions>();
  sub->add_option("--prefill", o->prefill, "Prefill engine base URL(s), http://HOST:PORT (round-robin)")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--decode", o->decode, "Decode engine base URL(s), http://HOST:PORT (round-robin)")
      ->required()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  sub->add_option("--host", o->host, "Address to listen on (default 127.0.0.1)");
  sub->add_option("--port", o->port, "Port (default 8000; 0 = any free port, printed at start)")->check(CLI::Range(0, 65535));
  sub->add_option("--timeout", o->timeout_s, "Seconds one engine request may take (default 600)")
      ->check(positive_number());
  sub->callback([o] { proxy::run_proxy(*o); });
}

}  // namespace m3::cli
