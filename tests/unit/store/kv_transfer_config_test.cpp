// --kv-transfer-config as vLLM's JSON: the recipe's MultiConnector (NixlConnector + SimpleCPUOffloadConnector)
// gives the host KV tier its size and lazy_offload and reports the GPU parts as not applicable;
// RedisConnector and kv_load_failure_policy are read; unknown keys and connectors are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "base/error.h"
#include "store/kv_transfer_config.h"

using m3::store::KvTransferConfig;

namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& x) { return x.find(s) != std::string::npos; });
}

std::string error_of(const std::string& json) {
  try {
    KvTransferConfig::parse(json);
  } catch (const m3::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(KvTransferConfig, RecipeMultiConnectorConfiguresTheHostTier) {
  // The recipe's AMD prefill node, verbatim.
  const KvTransferConfig c = KvTransferConfig::parse(
      R"({"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[
         {"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_connector_extra_config":{"num_threads":4}},
         {"kv_connector":"SimpleCPUOffloadConnector","kv_role":"kv_both","kv_connector_extra_config":{
           "cpu_bytes_to_use_per_rank":601295421440,"cpu_hugepage_block_size":"1GB","lazy_offload":false}}]}})");
  ASSERT_TRUE(c.cpu_offload.has_value());
  EXPECT_EQ(c.cpu_offload->bytes, 601295421440);
  EXPECT_FALSE(c.cpu_offload->lazy);
  ASSERT_TRUE(c.nixl.has_value());  // P/D on the prefill side, its num_threads serving reads
  EXPECT_EQ(c.nixl->num_threads, 4);
  EXPECT_FALSE(has(c.not_applicable, "num_threads"));
  EXPECT_TRUE(has(c.not_applicable, "cpu_hugepage_block_size"));
  EXPECT_FALSE(c.redis.has_value());
  EXPECT_EQ(c.load_failure_policy, "recompute");
  // The recipe's AgentX presets give the total (cpu_bytes_to_use) with the per-rank size null;
  // lazy_offload defaults to true; the policy is read at the top level.
  const KvTransferConfig d = KvTransferConfig::parse(
      R"({"kv_connector":"SimpleCPUOffloadConnector","kv_load_failure_policy":"fail",
          "kv_connector_extra_config":{"cpu_bytes_to_use_per_rank":null,"cpu_bytes_to_use":860000000000}})");
  ASSERT_TRUE(d.cpu_offload.has_value());
  EXPECT_EQ(d.cpu_offload->bytes, 860000000000);
  EXPECT_TRUE(d.cpu_offload->lazy);
  EXPECT_EQ(d.load_failure_policy, "fail");
}

TEST(KvTransferConfig, RefusesWhatItDoesNotKnowByName) {
  EXPECT_NE(error_of(R"({"kv_connector":"SimpleCPUOffloadConnector","kv_connector_extra_config":{}})")
                .find("needs cpu_bytes_to_use or cpu_bytes_to_use_per_rank"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"SimpleCPUOffloadConnector","kv_connector_extra_config":
                        {"cpu_bytes_to_use_per_rank":1024,"pin_memory":true}})")
                .find("no key \"pin_memory\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"SimpleCPUOffloadConnector","kv_connector_extra_config":
                        {"cpu_bytes_to_use_per_rank":-5}})")
                .find("positive integer"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"SimpleCPUOffloadConnector","kv_connector_extra_config":
                        {"cpu_bytes_to_use_per_rank":1024,"lazy_offload":"yes"}})")
                .find("lazy_offload must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"MultiConnector","kv_connector_extra_config":{"connectors":[
                        {"kv_connector":"SimpleCPUOffloadConnector","kv_connector_extra_config":{"cpu_bytes_to_use_per_rank":1}},
                        {"kv_connector":"SimpleCPUOffloadConnector","kv_connector_extra_config":{"cpu_bytes_to_use_per_rank":1}}]}})")
                .find("given twice"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"SimpleCPUOffloadConnector","kv_connector_extra_config":
                        {"cpu_bytes_to_use_per_rank":1024,"cpu_bytes_to_use":2048}})")
                .find("not both"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"FancyConnector"})").find("unknown kv_connector \"FancyConnector\""), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"NixlConnector","kv_load_failure_policy":"retry"})").find("recompute"),
            std::string::npos);
}

TEST(KvTransferConfig, NixlConnectorConfiguresDisaggregation) {
  const KvTransferConfig c = KvTransferConfig::parse(
      R"({"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_ip":"127.0.0.1","kv_port":0,
          "engine_id":"p0","kv_load_failure_policy":"fail",
          "kv_connector_extra_config":{"kv_lease_duration":2.5,"backends":["UCX"],"engine_ttl":0}})");
  ASSERT_TRUE(c.nixl.has_value());
  EXPECT_TRUE(c.nixl->producer());
  EXPECT_FALSE(c.nixl->consumer());
  EXPECT_EQ(c.nixl->engine_id, "p0");
  EXPECT_EQ(c.nixl->port, 0);
  EXPECT_TRUE(c.nixl->port_given);
  EXPECT_DOUBLE_EQ(c.nixl->lease_seconds, 2.5);
  EXPECT_EQ(c.load_failure_policy, "fail");
  EXPECT_TRUE(has(c.not_applicable, "engine_ttl"));
  // The recipe's GPU deployment (a NixlConnector in a MultiConnector, buffer on the GPU): KV is in host
  // memory here, which the start-up note says; the connector still serves P/D.
  const KvTransferConfig r = KvTransferConfig::parse(
      R"({"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[
         {"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cuda","kv_connector_extra_config":
          {"backends":["UCX"],"enforce_handshake_compat":false,"kv_lease_duration":120}}]}})");
  ASSERT_TRUE(r.nixl.has_value());
  EXPECT_DOUBLE_EQ(r.nixl->lease_seconds, 120);
  EXPECT_TRUE(has(r.not_applicable, "kv_buffer_device \"cuda\""));
  EXPECT_TRUE(has(r.not_applicable, "enforce_handshake_compat false"));
  const KvTransferConfig d = KvTransferConfig::parse(R"({"kv_connector":"NixlConnector","kv_role":"kv_both"})");
  EXPECT_TRUE(d.nixl->producer() && d.nixl->consumer());
  EXPECT_DOUBLE_EQ(d.nixl->lease_seconds, 480);  // vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT
  EXPECT_EQ(d.nixl->port, 5600);
  EXPECT_FALSE(d.nixl->port_given);  // a busy default gives way to any free port (cmd_serve)
  EXPECT_EQ(d.nixl->num_threads, 4);  // vLLM's NixlConnector default
  // num_threads: the threads serving KV reads on a producer; a consumer serves none, which is said.
  const KvTransferConfig t = KvTransferConfig::parse(
      R"({"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_connector_extra_config":{"num_threads":2}})");
  EXPECT_EQ(t.nixl->num_threads, 2);
  EXPECT_FALSE(has(t.not_applicable, "num_threads"));
  const KvTransferConfig u = KvTransferConfig::parse(
      R"({"kv_connector":"NixlConnector","kv_role":"kv_consumer","kv_connector_extra_config":{"num_threads":2}})");
  EXPECT_TRUE(has(u.not_applicable, "num_threads"));
}

TEST(KvTransferConfig, NixlConnectorRefusesWhatItCannotServe) {
  EXPECT_NE(error_of(R"({"kv_connector":"NixlConnector","kv_role":"kv_producer","kv_buffer_device":"xpu"})")
                .find("kv_buffer_device \"xpu\" is not served"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"NixlConnector"})").find("kv_role"), std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"NixlConnector","kv_role":"kv_both",
                        "kv_connector_extra_config":{"backends":["LIBFABRIC"]}})")
                .find("UCX"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"NixlConnector","kv_role":"kv_both",
                        "kv_connector_extra_config":{"kv_lease_duration":0}})")
                .find("kv_lease_duration"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"NixlConnector","kv_role":"kv_both",
                        "kv_connector_extra_config":{"num_threads":0}})")
                .find("num_threads must be an integer in [1, 256]"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"kv_connector":"NixlConnector","kv_role":"kv_both",
                        "kv_connector_extra_config":{"warp_drive":1}})")
                .find("no key \"warp_drive\""),
            std::string::npos);
}
