// The weight side of a Linear (see linear.h): sizes, the MXFP8 scale range and activation-exactness
// checks, the opt-in activation modes, and the load-time repacking (4-row tiles, NVFP4 nibble order,
// the lossless BF16 packings for the decode step). The matmul's threading is in linear.cpp.
#include "kernels/cpu/linear.h"

#include <emmintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/aligned_vector.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dispatch.h"

namespace m3 {

const char* linear_kind_name(LinearKind k) {
  switch (k) {
    case LinearKind::None: return "none";
    case LinearKind::F32: return "F32";
    case LinearKind::BF16: return "BF16";
    case LinearKind::F16: return "F16";
    case LinearKind::MXFP8: return "MXFP8";
    case LinearKind::NVFP4: return "NVFP4";
    case LinearKind::MXFP4: return "MXFP4";
  }
  return "?";
}

size_t Linear::bytes() const {
  const size_t n = size_t(N) * size_t(K);
  switch (kind) {
    case LinearKind::None: return 0;
    case LinearKind::F32: return n * 4;
    case LinearKind::BF16:
    case LinearKind::F16: return n * 2;
    case LinearKind::MXFP8: return n + n / 32;
    case LinearKind::NVFP4: return n / 2 + n / 16;
    case LinearKind::MXFP4: return n / 2 + n / 32;
  }
  return 0;
}

size_t Linear::element_row_bytes() const {
  switch (kind) {
    case LinearKind::None: return 0;
    case LinearKind::F32: return size_t(K) * 4;
    case LinearKind::BF16:
    case LinearKind::F16: return size_t(K) * 2;
    case LinearKind::MXFP8: return size_t(K);
    case LinearKind::NVFP4:
    case LinearKind::MXFP4: return size_t(K) / 2;
  }
  return 0;
}

void set_scale_range(Linear& W) {
  if ((W.kind != LinearKind::MXFP8 && W.kind != LinearKind::MXFP4) || !W.scales) return;
  const size_t n = size_t(W.N) * size_t(W.K / 32);
  uint8_t lo = 255, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    lo = std::min(lo, W.scales[i]);
    hi = std::max(hi, W.scales[i]);
  }
  if (n == 0) lo = 0, hi = 255;
  W.scale_lo = lo;
  W.scale_hi = hi;
}

namespace {
// x[0, K)'s extreme exponent fields as mxfp8_prescale_exact_fields takes them, and whether some
// element is +-0: an integer loop over the bit patterns (no libm; the decode kernels' vector scan
// finds the same).
void exponent_fields(const float* x, int64_t K, uint32_t& emin, uint32_t& emax, bool& zero) {
  emax = 0, emin = 255, zero = false;
  for (int64_t k = 0; k < K; ++k) {
    uint32_t u;
    std::memcpy(&u, x + k, 4);
    u &= 0x7fffffffu;
    const uint32_t e = u >> 23;
    emax = std::max(emax, e);
    emin = std::min(emin, u ? e : 255u);
    zero |= u == 0;
  }
}
}  // namespace

bool mxfp8_prescale_exact(const float* x, int64_t K, int lo, int hi) {
  uint32_t emin, emax;
  bool zero;
  exponent_fields(x, K, emin, emax, zero);
  return mxfp8_prescale_exact_fields(emin, emax, lo, hi);
}

bool mxfp8_prescale_exact_fields(uint32_t emin, uint32_t emax, int lo, int hi) {
  if (lo < 0 || hi > kMxfp8PrescaleMaxCode || lo > hi) return false;
  // x * 2^j with j = c - 7 is exact iff the result's exponent field stays in [1, 254] (no overflow,
  // no rounding to a subnormal; a subnormal x scaled up is exact), so the extreme exponent fields of
  // the nonzero x decide for every c.
  if (emin == 255) return emax < 255;  // all zero (or only inf / NaN, rejected)
  return emax <= 254 && int(emax) + hi - 7 <= 254 && int(emin) + lo - 7 >= 1;
}

bool mxfp8_x_shift_exact(const float* x, int64_t K, int lo, int hi) {
  uint32_t emin, emax;
  bool zero;
  exponent_fields(x, K, emin, emax, zero);
  return mxfp8_x_shift_exact_fields(emin, emax, zero, lo, hi);
}

bool mxfp8_x_shift_exact_fields(uint32_t emin, uint32_t emax, bool zero, int lo, int hi) {
  // The copies' condition (the scaled field stays in [1, 254]) for normal, nonzero x only.
  return !zero && emin >= 1 && mxfp8_prescale_exact_fields(emin, emax, lo, hi);
}

namespace {
std::atomic<int> g_mxfp8_permute_form{-1};
}  // namespace

void set_mxfp8_permute_form(int form) { g_mxfp8_permute_form.store(form, std::memory_order_relaxed); }

bool mxfp8_two_source_permute() {
  const bool amd = cpu_features().amd;
  const int f = g_mxfp8_permute_form.load(std::memory_order_relaxed);
  return f < 0 ? amd : f == 1;
}

int64_t tile_chunk_bytes(const Linear& W) {
  switch (W.kind) {
    case LinearKind::MXFP8: return W.K % 32 == 0 ? 32 : 0;
    case LinearKind::NVFP4: return W.K % 32 == 0 && !W.act_int8 ? 16 : 0;
    case LinearKind::MXFP4: return W.K % 32 == 0 ? 16 : 0;
    case LinearKind::BF16: return W.K % 8 == 0 ? 16 : 0;
    default: return 0;
  }
}

namespace {
// f(i0, i1) over [0, n) split among the hardware threads, at least `grain` items each. Plain threads, not
// OpenMP: the loading thread is often not the one that runs the model (serve's engine thread), and an
// OpenMP team created here would keep a worker spinning beside the engine's under
// OMP_WAIT_POLICY=active (measured: one core busy while the server idled).
void on_load_threads(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  const int64_t nt = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), (n + grain - 1) / grain);
  if (nt <= 1) return f(0, n);
  std::vector<std::thread> pool;
  for (int64_t k = 0; k < nt; ++k) pool.emplace_back(f, n * k / nt, n * (k + 1) / nt);
  for (auto& th : pool) th.join();
}
}  // namespace

bool tile_rows(Linear& W, uint8_t* bytes) {
  const int64_t cb = tile_chunk_bytes(W);
  if (cb == 0 || W.N < kLinearTileRows || W.tiled || bytes != W.w) return false;
  const int64_t rb = int64_t(W.element_row_bytes());
  const int64_t tiles = W.N / kLinearTileRows, chunks = rb / cb;
  auto rewrite = [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> tile(size_t(kLinearTileRows * rb));  // once per thread and matrix, at load
    for (int64_t t = t0; t < t1; ++t) {
      uint8_t* dst = bytes + t * kLinearTileRows * rb;
      std::memcpy(tile.data(), dst, tile.size());
      for (int64_t c = 0; c < chunks; ++c)
        for (int i = 0; i < kLinearTileRows; ++i) {
          uint8_t* out = dst + (c * kLinearTileRows + i) * cb;
          const uint8_t* in = tile.data() + i * rb + c * cb;
          if (W.kind == LinearKind::NVFP4 || W.kind == LinearKind::MXFP4)
            nvfp4_chunk_nibbles(in, out, true);
          else
            std::memcpy(out, in, size_t(cb));
        }
    }
  };
  on_load_threads(tiles, 64, rewrite);
  W.tiled = true;
  return true;
}

// SSE2 (every x86-64 CPU) rather than one nibble at a time: the reorder runs over every NVFP4 byte
// of the checkpoint at load, where the scalar form took several times as long.
void nvfp4_chunk_nibbles(const uint8_t* in, uint8_t* out, bool to_tiled) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in)), m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  __m128i r;
  if (to_tiled) {
    // Checkpoint byte j holds elements 2j (low) and 2j + 1 (high): interleaving the low and high
    // nibbles gives elements 0..15, then 16..31; tiled byte j = element j | element 16 + j << 4.
    const __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
    r = _mm_or_si128(e0, _mm_slli_epi16(e1, 4));  // e1's bytes are below 16: no bits cross a byte
  } else {
    // Tiled: low nibbles are elements 0..15, high nibbles 16..31. Within each 16-bit lane of
    // (elements 2i, 2i + 1) the shift puts element 2i + 1 above element 2i in the low byte; packing the
    // low bytes gives checkpoint bytes 0..7 (from lo) and 8..15 (from hi).
    const __m128i b = _mm_set1_epi16(0x00ff);
    const __m128i p0 = _mm_and_si128(_mm_or_si128(lo, _mm_srli_epi16(lo, 4)), b);
    const __m128i p1 = _mm_and_si128(_mm_or_si128(hi, _mm_srli_epi16(hi, 4)), b);
    r = _mm_packus_epi16(p0, p1);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), r);
}

namespace {
// The BF16 packings' view of a tiled matrix: slot s = (tile s / chunks, 32-element chunk s % chunks), whose
// 256 bytes hold row i's elements 32c + 8j .. + 7 at 64j + 16i.
const uint8_t* tiled_bf16_chunk(const Linear& W, int64_t slot) {
  const int64_t chunks = W.K / 32;
  return W.w + slot / chunks * kLinearTileRows * W.K * 2 + slot % chunks * 256;
}
uint16_t tiled_bf16_value(const uint8_t* chunk, int row, int k) {
  uint16_t v;
  std::memcpy(&v, chunk + 64 * (k / 8) + 16 * row + 2 * (k % 8), 2);
  return v;
}
// A row's base in a chunk (its largest top seven exponent bits), or -1 when some weight lies more than 7
// steps below it (the chunk or row is then kept raw).
int tiled_bf16_row_base(const uint8_t* chunk, int row) {
  int hi = 0, lo = 127;
  for (int k = 0; k < 32; ++k) {
    const int e = (tiled_bf16_value(chunk, row, k) >> 8) & 0x7f;
    hi = std::max(hi, e), lo = std::min(lo, e);
  }
  return hi - lo > 7 ? -1 : hi;
}
}  // namespace

bool pack_bf16_tiles(Linear& W, AlignedVector<uint8_t>& out) {
  if (W.kind != LinearKind::BF16 || !W.tiled || W.K % 32 != 0 || W.N < kLinearTileRows) return false;
  const int64_t slots = W.N / kLinearTileRows * (W.K / 32);
  // Row bases, or kBf16PackedEscape when a weight of any row is out of reach.
  auto bases = [&](const uint8_t* chunk) {
    uint32_t b = 0;
    for (int r = 0; r < kLinearTileRows; ++r) {
      const int base = tiled_bf16_row_base(chunk, r);
      if (base < 0) return kBf16PackedEscape;
      b |= uint32_t(base) << (8 * r);
    }
    return b;
  };
  // On load threads over ranges of slots (the recipe model's lm_head, 200k x 6k, is 1.2 G weights:
  // seconds on one thread). Pass 1 finds the bases, then the escaped
  // chunks are numbered in slot order, pass 2 writes the bytes.
  std::vector<uint32_t> base(static_cast<size_t>(slots)), esc(static_cast<size_t>(slots), 0);
  on_load_threads(slots, 4096, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) base[size_t(s)] = bases(tiled_bf16_chunk(W, s));
  });
  int64_t escapes = 0;
  for (int64_t s = 0; s < slots; ++s)
    if (base[size_t(s)] == kBf16PackedEscape) esc[size_t(s)] = uint32_t(escapes++);
  out.assign(size_t(slots) * 196 + size_t(escapes) * 256, 0);
  uint8_t* const slot0 = out.data();
  uint8_t* const base0 = slot0 + slots * 192;
  uint8_t* const esc0 = base0 + slots * 4;
  on_load_threads(slots, 4096, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t* chunk = tiled_bf16_chunk(W, s);
      uint8_t* slot = slot0 + s * 192;
      const uint32_t b = base[size_t(s)];
      std::memcpy(base0 + s * 4, &b, 4);
      if (b == kBf16PackedEscape) {
        std::memcpy(slot, &esc[size_t(s)], 4);
        std::memcpy(esc0 + size_t(esc[size_t(s)]) * 256, chunk, 256);
        continue;
      }
      for (int half = 0; half < 2; ++half)  // rows 0, 1 then rows 2, 3
        for (int w = 0; w < 64; ++w) {
          const int r = 2 * half + w / 32;
          const uint16_t v = tiled_bf16_value(chunk, r, w % 32);
          const int off = int((b >> (8 * r)) & 0xff) - ((v >> 8) & 0x7f);
          slot[64 * half + w] = uint8_t(v & 0xff);
          slot[128 + w] |= uint8_t(((v >> 15) << 3 | off) << (4 * half));
        }
    }
  });
  W.bf16_packed = out.data();
  W.bf16_packed_bytes = out.size();
  return true;
}

bool pack_bf16_nibbles(Linear& W, AlignedVector<uint8_t>& out) {
  if (W.kind != LinearKind::BF16 || !W.tiled || W.K % 32 != 0 || W.N < kLinearTileRows) return false;
  const int64_t slots = W.N / kLinearTileRows * (W.K / 32);
  out.assign(size_t(slots * kBf16NibbleSlot), 0);
  on_load_threads(slots, 4096, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) {
      const uint8_t* chunk = tiled_bf16_chunk(W, s);
      uint8_t* slot = out.data() + s * kBf16NibbleSlot;
      for (int i = 0; i < kLinearTileRows; ++i) {
        const int hi = tiled_bf16_row_base(chunk, i);
        if (hi < 0) {
          slot[i] = kBf16NibblesEscape;
          continue;
        }
        slot[i] = uint8_t(0x7f - hi);
        uint8_t* row = slot + 4 + 48 * i;
        for (int p = 0; p < 32; ++p) {
          const uint16_t e = tiled_bf16_value(chunk, i, p < 16 ? 8 * (p / 4) + p % 4 : 8 * ((p - 16) / 4) + 4 + p % 4);
          row[p] = uint8_t(e & 0xff);
          row[32 + p % 16] |= uint8_t(((e >> 15) << 3 | (hi - ((e >> 8) & 0x7f))) << (p < 16 ? 0 : 4));
        }
      }
    }
  });
  W.bf16_nibbles = out.data();
  W.bf16_nibbles_bytes = out.size();
  return true;
}

bool pack_bf16_for_decode(Linear& W, AlignedVector<uint8_t>& out) {
  const std::string isa = cpu_ops().name;
  if (isa == "avx512") return pack_bf16_tiles(W, out);
  if (isa == "avx2") return pack_bf16_nibbles(W, out);
  return false;
}

bool enable_int8_activations(Linear& W) {
  if (W.kind != LinearKind::NVFP4 || W.K % 128 != 0 || W.tiled) return false;
  W.act_int8 = true;
  return true;
}

bool enable_bf16_activations(Linear& W) {
  if (W.kind != LinearKind::MXFP8 && W.kind != LinearKind::NVFP4) return false;
  if (W.act_int8) return false;
  W.act_bf16 = true;
  return true;
}

bool bf16_dot_products() { return std::string(cpu_ops().name) == "avx512" && cpu_features().avx512bf16; }

}  // namespace m3
