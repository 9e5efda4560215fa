// Anonymous host memory advised for transparent huge pages: the weights when they are read into
// memory (the default when they fit; --no-mmap) and the paged KV pool. Decode streams hundreds of MB
// per token and long-context attention walks tens of MB of K/V; on 4 KiB pages that is one TLB miss
// per 4 KiB (expensive in virtual machines), on 2 MiB pages one per 2 MiB (figures: docs/benchmarks.md
// section 3.3). Where the kernel has no THP (or it is disabled) the advice is ignored and the memory
// behaves like any other.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace m3 {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // `bytes` of zeroed, lazily committed memory starting on a 2 MiB boundary; throws m3::Error naming
  // `what` when the address space cannot be reserved.
  HugePageBuffer(size_t bytes, const std::string& what);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& o) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& o) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  size_t mapped_size() const { return len_; }  // size() rounded up to whole huge pages
  // Later writes fault (used for weights once they are read) / are allowed again.
  void make_read_only();
  void make_writable();

 private:
  uint8_t* p_ = nullptr;
  size_t n_ = 0, len_ = 0;  // requested bytes, mapped length
};

// Commits the memory of `bufs` now (pages allocated and zeroed, on huge pages where advised), on
// all OpenMP threads. The KV pool calls it at start, as vLLM and llama.cpp allocate theirs: a page
// touched first inside a decode step costs a fault and, where the kernel compacts memory for a huge
// page, up to milliseconds (docs/benchmarks.md section 5); and memory that is not there fails here
// with a clear message instead of an OOM kill in
// the middle of serving. Throws m3::Error naming `what` and the bytes when the kernel refuses.
void commit_memory(const std::vector<HugePageBuffer*>& bufs, const std::string& what);

// Bytes of RAM available to new allocations (MemAvailable of /proc/meminfo), 0 if unknown.
uint64_t available_memory_bytes();

// Bytes of this process on transparent huge pages (AnonHugePages of /proc/self/smaps_rollup), -1 if
// unknown.
int64_t huge_page_bytes_in_use();

// Whether madvise(MADV_HUGEPAGE) can give this process transparent huge pages (the setting in
// /sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise"; false when it is "never" or
// the file does not exist).
bool transparent_huge_pages_available();

}  // namespace m3
