// Parsing of --kv-transfer-config (see kv_transfer_config.h).
#include "store/kv_transfer_config.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_flag.h"

namespace m3::store {

namespace {

using json = nlohmann::json;

const char* const kKeys[] = {"kv_connector",      "engine_id",     "kv_buffer_device", "kv_buffer_size",
                             "kv_role",           "kv_rank",       "kv_parallel_size", "kv_ip",
                             "kv_port",           "kv_connector_extra_config",           "kv_connector_module_path",
                             "enable_permute_local_kv",            "kv_load_failure_policy"};
const char* const kElsewhere[] = {"MooncakeConnector", "MooncakeConnectorV1",
                                  "MooncakeStoreConnector", "OffloadingConnector",
                                  "LMCacheConnectorV1",   "P2pNcclConnector",  "SharedStorageConnector",
                                  "ExampleConnector",     "DecodeBenchConnector"};

void connector(const json& c, const std::string& where, KvTransferConfig& out, bool top) {
  if (!c.is_object()) throw Error(where + ": expected a JSON object");
  for (auto it = c.begin(); it != c.end(); ++it) {
    bool known = false;
    for (const char* k : kKeys) known |= it.key() == k;
    if (!known) throw Error(where + ": unknown key \"" + it.key() + "\"");
  }
  if (c.contains("kv_load_failure_policy")) {
    const json& p = c["kv_load_failure_policy"];
    if (!p.is_string() || (p != "recompute" && p != "fail"))
      throw Error(where + ": kv_load_failure_policy must be \"recompute\" or \"fail\"");
    if (top) out.load_failure_policy = p.get<std::string>();
  }
  if (!c.contains("kv_connector") || !c["kv_connector"].is_string()) throw Error(where + ": kv_connector is required");
  const std::string name = c["kv_connector"].get<std::string>();
  const json extra = c.value("kv_connector_extra_config", json::object());
  if (!extra.is_object()) throw Error(where + ": kv_connector_extra_config must be an object");
  if (name == "MultiConnector") {
    if (!top) throw Error(where + ": a MultiConnector inside a MultiConnector");
    if (!extra.contains("connectors") || !extra["connectors"].is_array())
      throw Error(where + ": MultiConnector needs kv_connector_extra_config.connectors (a list)");
    for (size_t i = 0; i < extra["connectors"].size(); ++i)
      connector(extra["connectors"][i], where + " connectors[" + std::to_string(i) + "]", out, false);
    return;
  }
  if (name == "RedisConnector") {
    if (out.redis) throw Error(where + ": RedisConnector given twice");
    RedisTierOptions o = RedisTierOptions::from_url(extra.value("url", std::string("redis://127.0.0.1:6379")));
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (k == "url") {
        if (!v.is_string()) throw Error(where + ": url must be a string");
      } else if (k == "save_decode_cache") {
        if (!v.is_boolean()) throw Error(where + ": save_decode_cache must be true or false");
        out.save_decode_cache = v.get<bool>();
      } else if (k == "timeout_ms") {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 60000)
          throw Error(where + ": timeout_ms must be an integer in [1, 60000]");
        o.timeout_ms = int(v.get<int64_t>());
      } else if (k == "ttl_seconds") {
        if (!v.is_number_integer() || v.get<int64_t>() < 0) throw Error(where + ": ttl_seconds must be >= 0");
        o.ttl_seconds = v.get<int64_t>();
      } else {
        throw Error(where + ": RedisConnector has no key \"" + k +
                    "\" (known: url, save_decode_cache, timeout_ms, ttl_seconds)");
      }
    }
    out.redis = o;
    return;
  }
  if (name == "SimpleCPUOffloadConnector") {
    if (out.cpu_offload) throw Error(where + ": SimpleCPUOffloadConnector given twice");
    KvTransferConfig::CpuOffload o;
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (k == "cpu_bytes_to_use" || k == "cpu_bytes_to_use_per_rank") {
        // vLLM takes the total or the per-rank size (the other null); one process serves here, so
        // either is the tier's size.
        if (v.is_null()) continue;
        if (!v.is_number_integer() || v.get<int64_t>() < 1)
          throw Error(where + ": " + k + " must be a positive integer (bytes) or null");
        if (o.bytes) throw Error(where + ": give cpu_bytes_to_use or cpu_bytes_to_use_per_rank, not both");
        o.bytes = v.get<int64_t>();
      } else if (k == "lazy_offload") {
        if (!v.is_boolean()) throw Error(where + ": lazy_offload must be true or false");
        o.lazy = v.get<bool>();
      } else if (k == "cpu_hugepage_block_size") {
        // How vLLM pins its host buffer (1 GiB HugeTLB pages); the tier here keeps pages as they come.
        if (!v.is_string()) throw Error(where + ": cpu_hugepage_block_size must be a string such as \"1GB\"");
        out.not_applicable.push_back("--kv-transfer-config SimpleCPUOffloadConnector cpu_hugepage_block_size");
      } else {
        throw Error(where + ": SimpleCPUOffloadConnector has no key \"" + k +
                    "\" (known: cpu_bytes_to_use, cpu_bytes_to_use_per_rank, lazy_offload, "
                    "cpu_hugepage_block_size)");
      }
    }
    if (o.bytes == 0)
      throw Error(where + ": SimpleCPUOffloadConnector needs cpu_bytes_to_use or cpu_bytes_to_use_per_rank");
    out.cpu_offload = o;
    return;
  }
  if (name == "NixlConnector") {
    if (out.nixl) throw Error(where + ": NixlConnector given twice");
    KvTransferConfig::Nixl n;
    const std::string role = c.value("kv_role", std::string());
    if (role != "kv_producer" && role != "kv_consumer" && role != "kv_both")
      throw Error(where + ": NixlConnector needs kv_role \"kv_producer\", \"kv_consumer\" or \"kv_both\"");
    n.role = role;
    if (c.contains("kv_buffer_device")) {
      // Where NIXL registers its transfer buffer. The recipe's GPU deployments say "cuda"; here the KV
      // cache, and so every transfer, is in host memory: "cuda" is listed at start as not applicable, as
      // the recipe's other GPU settings are; anything else is refused.
      const json& d = c["kv_buffer_device"];
      if (d == "cuda")
        out.not_applicable.push_back("--kv-transfer-config NixlConnector kv_buffer_device \"cuda\" (the KV cache "
                                     "and its transfers are in host memory here)");
      else if (d != "cpu")
        throw Error(where + ": kv_buffer_device " + d.dump() +
                    " is not served: the KV cache lives in host memory here (\"cpu\")");
    }
    if (c.contains("engine_id") && !c["engine_id"].is_null()) {
      if (!c["engine_id"].is_string() || c["engine_id"].get<std::string>().empty())
        throw Error(where + ": engine_id must be a non-empty string");
      n.engine_id = c["engine_id"].get<std::string>();
    }
    if (c.contains("kv_ip")) {
      if (!c["kv_ip"].is_string()) throw Error(where + ": kv_ip must be a string (the transfer listener's address)");
      n.host = c["kv_ip"].get<std::string>();
    }
    if (c.contains("kv_port")) {
      const json& p = c["kv_port"];
      if (!p.is_number_integer() || p.get<int64_t>() < 0 || p.get<int64_t>() > 65535)
        throw Error(where + ": kv_port must be an integer in [0, 65535] (0: any free port)");
      n.port = int(p.get<int64_t>());
      n.port_given = true;
    }
    bool num_threads_given = false;
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (k == "kv_lease_duration") {
        if (!v.is_number() || v.get<double>() <= 0)
          throw Error(where + ": kv_lease_duration must be a positive number of seconds");
        n.lease_seconds = v.get<double>();
      } else if (k == "num_threads") {
        // NIXL's agent threads (vLLM's default 4): here the prefill side's serving threads, each
        // answering one decode engine's read at a time, so that reads run side by side.
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 256)
          throw Error(where + ": num_threads must be an integer in [1, 256] (threads serving KV reads)");
        n.num_threads = int(v.get<int64_t>());
        num_threads_given = true;
      } else if (k == "engine_ttl") {
        // NIXL's cache of remote engines' metadata: each read connects afresh here, so there is nothing
        // to keep (noted at start).
        if (!v.is_number_integer() || v.get<int64_t>() < 0) throw Error(where + ": " + k + " must be an integer >= 0");
        out.not_applicable.push_back("--kv-transfer-config NixlConnector " + k);
      } else if (k == "enforce_handshake_compat") {
        // The handshake's compatibility check cannot be skipped here: a page of another layout would be
        // garbage in this pool. false is listed at start as not applicable.
        if (!v.is_boolean()) throw Error(where + ": enforce_handshake_compat must be true or false");
        if (!v.get<bool>())
          out.not_applicable.push_back("--kv-transfer-config NixlConnector enforce_handshake_compat false (the "
                                       "handshake always checks model, layout, dtypes and page size here)");
      } else if (k == "backends") {
        if (!v.is_array() || v.size() != 1 || v[0] != "UCX")
          throw Error(where + ": backends: only [\"UCX\"] is served (pages move over UCX)");
      } else {
        throw Error(where + ": NixlConnector has no key \"" + k + "\" here (known: kv_lease_duration, backends, num_threads, "
                    "engine_ttl, enforce_handshake_compat)");
      }
    }
    // A decode-only engine serves no reads: its pulls run on the threads of the requests asking for them.
    if (num_threads_given && !n.producer())
      out.not_applicable.push_back("--kv-transfer-config NixlConnector num_threads (the threads serving KV reads: "
                                   "a kv_consumer serves none)");
    out.nixl = n;
    return;
  }
  for (const char* e : kElsewhere)
    if (name == e) {
      out.not_applicable.push_back("--kv-transfer-config " + name);
      return;
    }
  throw Error(where + ": unknown kv_connector \"" + name +
              "\" (RedisConnector, NixlConnector and SimpleCPUOffloadConnector here; GPU connectors such as "
              "MooncakeConnector are accepted without effect)");
}

}  // namespace

KvTransferConfig KvTransferConfig::parse(const std::string& text) {
  KvTransferConfig c;
  if (text.empty()) return c;
  connector(parse_json_flag(text, "--kv-transfer-config"), "--kv-transfer-config", c, true);
  return c;
}

}  // namespace m3::store
