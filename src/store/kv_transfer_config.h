// --kv-transfer-config: vLLM's KVTransferConfig JSON. Its keys are checked (unknown ones refused by
// name) and each connector is classified: "RedisConnector" (m3serve's shared KV tier on Redis:
// kv_connector_extra_config {"url": "redis://HOST:PORT", "save_decode_cache": bool, "timeout_ms": int,
// "ttl_seconds": int}) is honoured; the recipe's GPU / other-engine connectors (NixlConnector,
// MooncakeConnector, SimpleCPUOffloadConnector, OffloadingConnector, LMCacheConnectorV1, ...) are
// reported as not applicable here, except SimpleCPUOffloadConnector, which configures the local
// host-memory tier (as --kv-offloading-size does); MultiConnector's
// "connectors" are classified one by one; any other connector name is refused.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "store/redis_kv_tier.h"

namespace m3::store {

struct KvTransferConfig {
  std::optional<RedisTierOptions> redis;  // a RedisConnector was given
  // A SimpleCPUOffloadConnector was given: the local host-memory tier (the engine's
  // --kv-offloading-size) of cpu_bytes_to_use (or cpu_bytes_to_use_per_rank) bytes, offloading when evicted (lazy_offload
  // true, the default) or as computed.
  struct CpuOffload {
    int64_t bytes = 0;
    bool lazy = true;
  };
  std::optional<CpuOffload> cpu_offload;
  // A NixlConnector was given: prefill/decode disaggregation on vLLM's kv_transfer_params protocol, pages
  // moved over UCX (src/transfer). kv_role: "kv_producer" (prefills for decode engines: leases pages and
  // listens on kv_ip:kv_port), "kv_consumer" (pulls them), "kv_both". kv_connector_extra_config:
  // kv_lease_duration (seconds a leased prompt waits to be read; vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
  // 480), num_threads (threads serving KV reads on the prefill side, vLLM's default 4) and backends
  // (["UCX"] only); the recipe's kv_buffer_device "cuda", engine_ttl and enforce_handshake_compat false
  // are listed at start as not applicable (KV lives in host memory here).
  struct Nixl {
    std::string role;
    std::string engine_id;  // empty: a random one
    std::string host = "127.0.0.1";
    int port = 5600;  // vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default
    bool port_given = false;  // kv_port set: it must be had; the default gives way to any free port
    double lease_seconds = 480;
    int num_threads = 4;  // vLLM's NixlConnector default
    bool producer() const { return role == "kv_producer" || role == "kv_both"; }
    bool consumer() const { return role == "kv_consumer" || role == "kv_both"; }
  };
  std::optional<Nixl> nixl;
  bool save_decode_cache = false;
  std::string load_failure_policy = "recompute";
  std::vector<std::string> not_applicable;  // connectors accepted without effect, for the start-up note
  // Throws m3::Error naming the key or connector.
  static KvTransferConfig parse(const std::string& json);
};

}  // namespace m3::store
