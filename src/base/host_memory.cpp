// Huge-page-advised anonymous memory (see host_memory.h).
#include "base/host_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace m3 {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14; older kernels answer EINVAL (pages touched instead)
#endif
}

HugePageBuffer::HugePageBuffer(size_t bytes, const std::string& what) : n_(bytes) {
  if (bytes == 0) return;
  len_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Over-reserve by one huge page, then trim both ends so the start is 2 MiB-aligned (only aligned
  // 2 MiB ranges can be huge pages). MAP_NORESERVE: memory is committed as it is touched (or at once
  // by commit_memory).
  void* raw = ::mmap(nullptr, len_ + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
  if (raw == MAP_FAILED)
    throw Error(what + ": cannot reserve " + std::to_string(bytes) + " bytes of memory: " + std::strerror(errno));
  uint8_t* r = static_cast<uint8_t*>(raw);
  uint8_t* start = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(r) + kHugePage - 1) &
                                              ~uintptr_t(kHugePage - 1));
  if (start > r) ::munmap(r, size_t(start - r));
  if (uint8_t* end = r + len_ + kHugePage; end > start + len_) ::munmap(start + len_, size_t(end - (start + len_)));
  ::madvise(start, len_, MADV_HUGEPAGE);  // advice only: fails harmlessly without THP
  p_ = start;
}

HugePageBuffer::~HugePageBuffer() {
  if (p_) ::munmap(p_, len_);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& o) noexcept
    : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), len_(std::exchange(o.len_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(n_, o.n_);
  std::swap(len_, o.len_);
  return *this;
}

void HugePageBuffer::make_read_only() {
  if (p_) ::mprotect(p_, len_, PROT_READ);
}

void HugePageBuffer::make_writable() {
  if (p_) ::mprotect(p_, len_, PROT_READ | PROT_WRITE);
}

void commit_memory(const std::vector<HugePageBuffer*>& bufs, const std::string& what) {
  // 32 MiB pieces (whole huge pages), shared dynamically by the threads.
  constexpr size_t kPiece = size_t(32) << 20;
  std::vector<std::pair<uint8_t*, size_t>> pieces;
  size_t total = 0;
  for (HugePageBuffer* b : bufs) {
    if (!b || !b->data()) continue;
    const size_t len = b->mapped_size();
    total += len;
    for (size_t off = 0; off < len; off += kPiece) pieces.push_back({b->data() + off, std::min(kPiece, len - off)});
  }
  // Linux's out-of-memory killer ends the process long before MADV_POPULATE_WRITE reports ENOMEM, so a
  // size the machine cannot hold is refused here, with both numbers, before any page is touched.
  if (const uint64_t avail = available_memory_bytes(); avail > 0 && total > avail)
    throw Error(what + ": needs " + std::to_string(total >> 20) + " MiB of memory, but only " +
                std::to_string(avail >> 20) + " MiB is available (MemAvailable); choose a smaller --kv-cache-memory");
  int err = 0;
#pragma omp parallel for schedule(dynamic) reduction(max : err)
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto [p, n] = pieces[i];
    if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) continue;
    if (errno != EINVAL) {
      err = std::max(err, errno);
      continue;
    }
    // No MADV_POPULATE_WRITE: write each 4 KiB page (fresh memory, nobody else uses it yet).
    for (size_t off = 0; off < n; off += 4096) reinterpret_cast<volatile uint8_t*>(p)[off] = 0;
  }
  if (err)
    throw Error(what + ": cannot commit " + std::to_string(total >> 20) + " MiB of memory (" + std::strerror(err) +
                "); choose a smaller --kv-cache-memory");
}

int64_t huge_page_bytes_in_use() {
  std::ifstream in("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("AnonHugePages:", 0) == 0) return std::atoll(line.c_str() + 14) * 1024;
  return -1;
}

bool transparent_huge_pages_available() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return false;
  return line.find("[always]") != std::string::npos || line.find("[madvise]") != std::string::npos;
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace m3
