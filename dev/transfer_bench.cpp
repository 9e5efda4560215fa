// Throughput of the P/D KV transfer on this host, without the model's compute: a prefill-side
// KvTransferServer and a decode-side UcxKvFetcher in one process (two UCX workers, loopback; UCX_TLS
// chooses the transport), N pages of MODEL's cache layout leased and pulled R times. The page bytes are
// whatever the pool holds (the fetcher does not verify; the engine's import does), so this times the
// handshake, the lease check, the export (copy + checksum) and the wire.
// With CONCURRENT > 1: after that, CONCURRENT decode-side threads pull a lease each at once, from a
// listener with one serving thread and from one with CONCURRENT (num_threads), alternated R times: the
// aggregate GB/s of the pulls together (RMA reads).
// Usage: transfer_bench MODEL PAGES REPS [CONCURRENT]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "engine/engine.h"
#include "model/model.h"
#include "transfer/kv_transfer_client.h"
#include "transfer/kv_transfer_server.h"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: transfer_bench MODEL PAGES REPS [CONCURRENT]\n");
    return 2;
  }
  const int pages = std::atoi(argv[2]), reps = std::atoi(argv[3]), conc = argc == 5 ? std::atoi(argv[4]) : 1;
  m3::ModelOptions mo;
  mo.weight_memory = m3::WeightMemory::Mmap;
  m3::Model model(argv[1], mo);
  m3::EngineConfig c;
  c.num_pages = pages;
  m3::Engine e(model, nullptr, c);
  e.enable_kv_leases(std::chrono::seconds(600));
  m3::transfer::Hello h;
  h.layout_id = e.kv_layout_id();
  h.block_size = e.block_size();
  h.dtypes = e.kv_dtypes();
  h.page_bytes = e.kv_page_blob_bytes();
  h.engine_id = "bench";
  auto ctx = std::make_shared<m3::transfer::UcxContext>();
  m3::transfer::KvTransferServer srv(ctx, e, h, "127.0.0.1", 0);
  m3::transfer::UcxKvFetcher f(ctx, h);
  std::vector<int32_t> ids(static_cast<size_t>(pages));
  const std::vector<int32_t> tokens(static_cast<size_t>(pages) * static_cast<size_t>(e.block_size()), 1);
  for (int i = 0; i < pages; ++i) ids[size_t(i)] = i;
  std::printf("%d pages of %zu bytes (%.1f MB) per pull, %s\n", pages, e.kv_page_blob_bytes(),
              double(pages) * double(e.kv_page_blob_bytes()) / 1e6, std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "UCX_TLS unset");
  {
    // The export alone (copy out of the pool + checksum), as the server does per page.
    const auto chain = m3::transfer_chain(tokens, e.block_size());
    std::string blob;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pages; ++i) e.export_leased_page(i, chain[size_t(i)], blob);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("export alone: %.1f ms, %.2f GB/s\n", s * 1e3, double(pages) * double(e.kv_page_blob_bytes()) / s / 1e9);
  }
  std::vector<double> gbs[2];
  for (int r = 0; r < 2 * reps; ++r) {
    const int mode = r % 2;  // 0 rma, 1 stream: side by side in one run
    f.set_mode(mode == 0 ? m3::transfer::ReadMode::Rma : m3::transfer::ReadMode::Stream);
    m3::RemoteKvRef ref;
    ref.engine_id = "bench";
    ref.host = "127.0.0.1";
    ref.port = srv.port();
    ref.block_ids = ids;
    ref.request_id = e.kv_leases()->grant(ids, m3::transfer_chain(tokens, e.block_size()), std::chrono::steady_clock::now());
    m3::RemotePrefill got;
    const auto t0 = std::chrono::steady_clock::now();
    const m3::FetchResult res = f.fetch(ref, got);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (res.status != m3::FetchStatus::Ok) {
      std::fprintf(stderr, "pull failed (%s): %s\n", mode ? "stream" : "rma", res.why.c_str());
      return 1;
    }
    gbs[mode].push_back(double(pages) * double(e.kv_page_blob_bytes()) / s / 1e9);
    std::printf("pull %d %-6s: %.1f ms, %.2f GB/s\n", r / 2 + 1, mode ? "stream" : "rma", s * 1e3, gbs[mode].back());
  }
  for (int m = 0; m < 2; ++m) {
    std::vector<double> v = gbs[m];
    std::sort(v.begin(), v.end());
    std::printf("%-6s GB/s: median %.2f, min %.2f, max %.2f over %zu pulls\n", m ? "stream" : "rma", v[v.size() / 2],
                v.front(), v.back(), v.size());
  }
  if (conc > 1) {
    m3::transfer::KvTransferServer one(ctx, e, h, "127.0.0.1", 0, 1), many(ctx, e, h, "127.0.0.1", 0, conc);
    std::vector<double> agg[2];
    for (int r = 0; r < 2 * reps; ++r) {
      const int which = r % 2;  // 0: one serving thread, 1: CONCURRENT
      const int port = which ? many.port() : one.port();
      std::vector<m3::RemoteKvRef> refs(static_cast<size_t>(conc));
      for (auto& ref : refs) {
        ref.engine_id = "bench";
        ref.host = "127.0.0.1";
        ref.port = port;
        ref.block_ids = ids;
        ref.request_id = e.kv_leases()->grant(ids, m3::transfer_chain(tokens, e.block_size()), std::chrono::steady_clock::now());
      }
      std::vector<m3::FetchResult> res(refs.size());
      std::vector<std::thread> ts;
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t k = 0; k < refs.size(); ++k)
        ts.emplace_back([&, k] {
          m3::transfer::UcxKvFetcher fk(ctx, h);
          m3::RemotePrefill got;
          res[k] = fk.fetch(refs[k], got);
        });
      for (auto& t : ts) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (const auto& x : res)
        if (x.status != m3::FetchStatus::Ok) {
          std::fprintf(stderr, "concurrent pull failed: %s\n", x.why.c_str());
          return 1;
        }
      agg[which].push_back(double(conc) * double(pages) * double(e.kv_page_blob_bytes()) / s / 1e9);
      std::printf("%d pulls at once, %d serving thread(s): %.1f ms, %.2f GB/s together\n", conc, which ? conc : 1,
                  s * 1e3, agg[which].back());
    }
    for (int m = 0; m < 2; ++m) {
      std::vector<double> v = agg[m];
      std::sort(v.begin(), v.end());
      std::printf("%d serving thread(s): median %.2f GB/s together, min %.2f, max %.2f\n", m ? conc : 1,
                  v[v.size() / 2], v.front(), v.back());
    }
  }
  return 0;
}
