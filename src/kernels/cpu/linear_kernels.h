// The matmul entries of the kernel table (LinearOps: linear_rows, linear_rows_claimed, decode_rows, dot,
// axpy), compiled once per ISA by linear_generic.cpp, linear_avx2.cpp and linear_avx512.cpp. rows_setup and
// rows_run choose per matrix and step among the kernels the including build has: the AVX2 ones
// (linear_avx2.h, lane_gemm.h), the 512-bit ones (linear_avx512.h, linear_bf16_dot.h), and the portable
// decode-then-dot path every build keeps.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/aligned_vector.h"
#include "formats/quantize.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/linear_decode.h"
#include "kernels/cpu/linear_nvfp4_q8.h"
#include "kernels/cpu/vector_ops.h"
#ifdef M3_KERNELS_AVX2
#include "kernels/cpu/lane_gemm.h"
#include "kernels/cpu/linear_avx2.h"
#endif
#ifdef M3_KERNELS_AVX512
#include "kernels/cpu/linear_avx512.h"
#include "kernels/cpu/linear_bf16_dot.h"
#endif

namespace m3::cpu {
namespace {

#ifdef M3_KERNELS_AVX512
constexpr bool kAvx512 = true;
#else
constexpr bool kAvx512 = false;
#endif

// What a call sets up once for its matrix and activations before any rows: the int8 copy of x
// (NVFP4 with --nvfp4-activations int8), the per-scale copies of x (MXFP8 decode), the scale table
// (NVFP4 decode).
struct RowsSetup {
  const Q8Acts* q8 = nullptr;
  const float* xr = nullptr;      // act_bf16: x rounded to BF16 (every kernel then reads this x)
  const uint16_t* xbf = nullptr;  // act_bf16, avx512 with BF16 dot products: xr packed for bf16_dot_rows,
  bool xbf_panel = false;         // or for bf16_panel_rows
  const float* mxfp8_xs = nullptr;
  const float* const* mxfp8_xsp = nullptr;  // mxfp8_xs's copies by scale code
  bool mxfp8_xshift = false;                // avx512, one token: the scales as exponent offsets on x
  bool nvfp4_fused = false;
  float nvfp4_stab[256];
  const float* nvfp4_wtab = nullptr;  // avx512: nvfp4_weight_table when nvfp4_fused
  const float* nvfp4_scales = nullptr;  // the lane GEMM of an NVFP4 matrix: nvfp4_block_scales
#ifdef M3_KERNELS_AVX2
  const LaneX* lane_x = nullptr;  // x packed for the lane GEMM (kLaneGemmMinTokens tokens or more)
#endif
};

// Whether rows_setup packed the activations for the lane GEMM.
inline bool lane_taken(const RowsSetup& s) {
#ifdef M3_KERNELS_AVX2
  return s.lane_x != nullptr;
#else
  (void)s;
  return false;
#endif
}

// x[0, n) rounded to BF16 (to nearest, ties to even; NaN stays NaN), as floats: the activations of a
// matrix with act_bf16 on every ISA and path.
inline void round_to_bf16(const float* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    u = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(out + i, &u, 4);
  }
}

#ifdef M3_KERNELS_AVX2
// One 32-element block of mxfp4_qdq_row (formats/quantize.h) in AVX2, the same values: the scale byte from
// the largest |x| bit pattern (integer max: NaN patterns sort above infinity), then each |x| * 2^(127 -
// byte) rounded to the E2M1 grid (steps of 0.5 below 2, 1 below 4, 2 above: round-half-even on the step,
// which is float_to_e2m1's ties-to-even-code rule), saturated at 6, signed and scaled back.
inline void mxfp4_qdq_block_avx2(const float* x, bool floor_mode, float* out) {
  const __m256i absm = _mm256_set1_epi32(0x7fffffff);
  __m256i m = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) m = _mm256_max_epi32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 8 * j)), absm));
  __m128i h = _mm_max_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  uint32_t bits = uint32_t(_mm_cvtsi128_si32(h));
  if (bits > 0x7f800000u) {  // a NaN in the block
    for (int i = 0; i < 32; ++i) out[i] = NAN;
    return;
  }
  if (!floor_mode) bits = (bits + 0x200000u) & 0x7f800000u;
  const int byte = std::clamp(int(bits >> 23) - 2, 0, 254);
  const __m256 up = _mm256_set1_ps(std::ldexp(1.0f, 127 - byte)), down = _mm256_set1_ps(std::ldexp(1.0f, byte - 127));
  const __m256 two = _mm256_set1_ps(2.0f), four = _mm256_set1_ps(4.0f), six = _mm256_set1_ps(6.0f);
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u)));
  for (int j = 0; j < 4; ++j) {
    const __m256 v = _mm256_loadu_ps(x + 8 * j);
    const __m256 a = _mm256_mul_ps(_mm256_andnot_ps(sign, v), up);
    // step 0.5 / 1 / 2 and its inverse, by range (powers of two: every product below is exact).
    const __m256 ge2 = _mm256_cmp_ps(a, two, _CMP_GE_OQ), ge4 = _mm256_cmp_ps(a, four, _CMP_GE_OQ);
    const __m256 step = _mm256_blendv_ps(_mm256_blendv_ps(half, one, ge2), two, ge4);
    const __m256 inv = _mm256_blendv_ps(_mm256_blendv_ps(two, one, ge2), half, ge4);
    __m256 q = _mm256_mul_ps(_mm256_round_ps(_mm256_mul_ps(a, inv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), step);
    q = _mm256_min_ps(q, six);
    _mm256_storeu_ps(out + 8 * j, _mm256_mul_ps(_mm256_or_ps(q, _mm256_and_ps(v, sign)), down));
  }
}
#endif

// x[0, n) (n % 32 == 0) through the dynamic MXFP4 activation quantiser of an act_mxfp4 matrix.
inline void mxfp4_qdq(const float* x, int64_t n, uint8_t mode, float* out) {
  const bool floor_mode = mode == 1;
#ifdef M3_KERNELS_AVX2
  for (int64_t b = 0; b < n; b += 32) mxfp4_qdq_block_avx2(x + b, floor_mode, out + b);
#else
  m3::mxfp4_qdq_row(x, n, floor_mode ? m3::Mxfp4ScaleMode::Floor : m3::Mxfp4ScaleMode::Even, out);
#endif
}

void rows_setup(const m3::Linear& W, const float* x, int64_t T, RowsSetup& s) {
  if (W.act_mxfp4) {
    static thread_local m3::AlignedVector<float> xq;  // grown on demand: no allocation in steady-state decode
    if (xq.size() < size_t(T * W.K)) xq.resize(size_t(T * W.K));
    mxfp4_qdq(x, T * W.K, W.act_mxfp4_mode, xq.data());
    s.xr = x = xq.data();
  }
  if (W.act_bf16) {
    static thread_local m3::AlignedVector<float> xr;  // grown on demand: no allocation in steady-state decode
    if (xr.size() < size_t(T * W.K)) xr.resize(size_t(T * W.K));
    round_to_bf16(x, T * W.K, xr.data());
    s.xr = x = xr.data();
#ifdef M3_KERNELS_AVX512
    static thread_local m3::AlignedVector<uint16_t> xp;
    const bool nv = W.kind == m3::LinearKind::NVFP4;
    if (bf16_dot_applies(W, T)) {
      if (xp.size() < size_t(T * W.K * 2)) xp.resize(size_t(T * W.K * 2));
      if (nv)
        nvfp4_bf16_dot_pack_x(s.xr, T, W.K, xp.data());
      else
        bf16_dot_pack_x(s.xr, T, W.K, xp.data());
      s.xbf = xp.data();
      return;
    }
    if (bf16_panel_applies(W, T)) {
      if (xp.size() < size_t(T * W.K)) xp.resize(size_t(T * W.K));
      if (nv)
        nvfp4_bf16_panel_pack_x(s.xr, T, W.K, xp.data());
      else
        bf16_panel_pack_x(s.xr, T, W.K, xp.data());
      s.xbf = xp.data();
      s.xbf_panel = true;
      return;
    }
#endif
  }
  if (W.kind == m3::LinearKind::NVFP4 && W.act_int8) {
    static thread_local Q8Acts acts;  // grown on demand: no allocation in steady-state decode
    q8_quantize(x, T, W.K, acts);
    s.q8 = &acts;
    return;
  }
#ifdef M3_KERNELS_AVX2
  s.nvfp4_fused = (T <= kTileTokensMax || kAvx512) &&
                  ((W.kind == m3::LinearKind::NVFP4 && nvfp4_placed_scales(W, s.nvfp4_stab)) ||
                   (W.kind == m3::LinearKind::MXFP4 && mxfp4_placed_scales(W, s.nvfp4_stab)));
#ifdef M3_KERNELS_AVX512
  if (s.nvfp4_fused && W.tiled) {
    alignas(64) static thread_local float wtab[256 * 16];
    nvfp4_weight_table(s.nvfp4_stab, wtab);
    s.nvfp4_wtab = wtab;
  }
#endif
  // The copies of x serve the AVX2 decode step; where the 512-bit kernels take every tile (rows_run) they
  // would be made and never read (up to 16 copies of x, 128 KB of stores, per matrix and thread).
  bool all_512 = false;
#ifdef M3_KERNELS_AVX512
  all_512 = W.N % m3::kLinearTileRows == 0 && tile512_applies(W, s.nvfp4_wtab);
#endif
  // The two one-token MXFP8 shortcuts (copies of x per scale code for the AVX2 step, the exponent offset
  // for the 512-bit one) decide from one scan of x's exponent fields.
  const bool one_mxfp8 = T == 1 && W.kind == m3::LinearKind::MXFP8;
  const bool xs_wanted = one_mxfp8 && W.N >= 4 && !all_512 && W.scale_hi - W.scale_lo < m3::kMxfp8PrescaleCodes;
  bool shift_wanted = false;
#ifdef M3_KERNELS_AVX512
  shift_wanted = one_mxfp8 && W.N >= m3::kLinearTileRows && tile512_applies(W, nullptr);
#endif
  if (xs_wanted || shift_wanted) {
    uint32_t emin, emax;
    bool zero;
    x_exponent_fields(x, W.K, emin, emax, zero);
    if (xs_wanted && m3::mxfp8_prescale_exact_fields(emin, emax, W.scale_lo, W.scale_hi))
      s.mxfp8_xs = mxfp8_prescaled_x(W, x, s.mxfp8_xsp);
    s.mxfp8_xshift = shift_wanted && m3::mxfp8_x_shift_exact_fields(emin, emax, zero, W.scale_lo, W.scale_hi);
  }
  if (T >= m3::kLaneGemmMinTokens && W.N >= kLaneRows && !all_512) {
    static thread_local LaneX lx;
    if (lane_pack_x(x, T, W.K, lx)) s.lane_x = &lx;
    if (s.lane_x && W.kind == m3::LinearKind::NVFP4) {
      static thread_local float scales[256];
      nvfp4_block_scales(W, scales);
      s.nvfp4_scales = scales;
    }
  }
#endif
}

#ifdef M3_KERNELS_AVX2
// The tile at row r for T tokens (2 <= T <= kTileTokensMax) through mxfp8_tile_tokens /
// nvfp4_tile_tokens / bf16_tile_tokens, tokens in groups of three, then two or one; false when none applies.
bool tile_tokens(const m3::Linear& W, const RowsSetup& s, const float* x, int64_t T, float* y, int64_t r, bool more) {
  const int64_t K = W.K, N = W.N;
  const bool mx = W.kind == m3::LinearKind::MXFP8 && W.scale_hi <= m3::kMxfp8PrescaleMaxCode;
  const bool bf = W.kind == m3::LinearKind::BF16;
  if (!mx && !bf && !s.nvfp4_fused) return false;
  for (int64_t t = 0; t < T; more = false) {
    const int64_t nt = std::min<int64_t>(3, T - t);
    const float* xt = x + t * K;
    float* yt = y + t * N + r;
    with_group_size(nt, [&](auto g) {
      constexpr int NT = decltype(g)::value;
      if (bf) {
        bf16_tile_tokens<NT>(reinterpret_cast<const uint16_t*>(W.w) + size_t(r) * K, xt, K, N, yt, more, W.tiled);
      } else if (mx) {
        mxfp8_tile_tokens<NT>(W.w + size_t(r) * K, W.scales + size_t(r) * (K / 32), xt, K, N, yt, more, W.tiled);
      } else if (W.kind == m3::LinearKind::MXFP4) {
        const uint8_t *q = W.w + size_t(r) * (K / 2), *sc = W.scales + size_t(r) * (K / 32);
        if (W.tiled)
          nvfp4_tile_tokens<true, NT, true>(q, sc, s.nvfp4_stab, xt, K, N, yt, more);
        else
          nvfp4_tile_tokens<false, NT, true>(q, sc, s.nvfp4_stab, xt, K, N, yt, more);
      } else {
        const uint8_t *q = W.w + size_t(r) * (K / 2), *sc = W.scales + size_t(r) * (K / 16);
        if (W.tiled)
          nvfp4_tile_tokens<true, NT>(q, sc, s.nvfp4_stab, xt, K, N, yt, more);
        else
          nvfp4_tile_tokens<false, NT>(q, sc, s.nvfp4_stab, xt, K, N, yt, more);
      }
    });
    t += nt;
  }
  return true;
}
#endif

#ifdef M3_KERNELS_AVX2
// y rows [r, r + 4 * np) for all T tokens from np decoded tiles w (4 rows of K floats each, one after
// the other): tokens in groups of three, then two, then one, each group over every tile. (Products of
// kLaneGemmMinTokens tokens or more take the lane GEMM for whole 16-row panels, with the same bits.)
void tokens_over_tiles(const float* w, int64_t np, int64_t K, int64_t N, const float* x, int64_t T, float* y,
                       int64_t r) {
  const int64_t tr = m3::kLinearTileRows;
  int64_t t = 0;
  for (; t + 3 <= T; t += 3)
    for (int64_t q = 0; q < np; ++q)
      dot_rows4_x3(w + q * tr * K, K, x + t * K, x + (t + 1) * K, x + (t + 2) * K, y + t * N + r + q * tr,
                   y + (t + 1) * N + r + q * tr, y + (t + 2) * N + r + q * tr);
  for (; t + 2 <= T; t += 2)
    for (int64_t q = 0; q < np; ++q)
      dot_rows4_x2(w + q * tr * K, K, x + t * K, x + (t + 1) * K, y + t * N + r + q * tr, y + (t + 1) * N + r + q * tr);
  if (t < T)
    for (int64_t q = 0; q < np; ++q) dot_rows4_x1(w + q * tr * K, K, x + t * K, y + t * N + r + q * tr);
}
#endif

// Rows [r0, r1) (whole tiles, or up to N) after rows_setup. The decode step prefetches the next tile
// while it is below pf_end (a prefetch of rows another thread then takes is harmless).
void rows_run(const m3::Linear& W, const RowsSetup& s, const float* x, int64_t T, float* y, int64_t r0, int64_t r1,
              int64_t pf_end, float* scratch) {
  if (s.q8) {
    nvfp4_q8_rows(W, *s.q8, T, y, r0, r1, pf_end, scratch);
    return;
  }
  if (s.xr) x = s.xr;
  const int64_t K = W.K, N = W.N;
#ifdef M3_KERNELS_AVX512
  if (s.xbf) {
    const int64_t full = r0 + (r1 - r0) / m3::kLinearTileRows * m3::kLinearTileRows;  // a partial last tile below
    if (s.xbf_panel)
      bf16_panel_rows(W, s.xbf, T, y, r0, full);
    else
      bf16_dot_rows(W, s.xbf, T, y, r0, full, pf_end);
    r0 = full;
  }
#endif
#ifdef M3_KERNELS_AVX512
  if (tile512_applies(W, s.nvfp4_wtab)) {
    const int64_t full = r0 + (r1 - r0) / m3::kLinearTileRows * m3::kLinearTileRows;  // a partial last tile below
    rows512(W, s.nvfp4_wtab, x, T, y, r0, full, pf_end, s.mxfp8_xshift);
    r0 = full;
  }
#endif
#ifdef M3_KERNELS_AVX2
  if (s.lane_x) {  // whole 16-row panels; the tiles after the last one below
    const int64_t full = r0 + (r1 - r0) / kLaneRows * kLaneRows;
    lane_rows(W, *s.lane_x, y, r0, full, s.nvfp4_scales);
    r0 = full;
  }
#endif
  for (int64_t r = r0; r < r1; r += m3::kLinearTileRows) {
    const int64_t nr = std::min<int64_t>(m3::kLinearTileRows, r1 - r);
#ifdef M3_KERNELS_AVX2
    if (T == 1 && nr == 4) {
      const bool more = r + 8 <= pf_end;  // a full next tile: prefetch it
      if (s.mxfp8_xs) {
        r += mxfp8_placed_tiles<false>(W, s.mxfp8_xs, s.mxfp8_xsp, r, r1, pf_end, y) - m3::kLinearTileRows;
        continue;
      }
      if (W.kind == m3::LinearKind::MXFP8 && W.scale_hi <= m3::kMxfp8PrescaleMaxCode) {
        r += mxfp8_placed_tiles<true>(W, x, nullptr, r, r1, pf_end, y) - m3::kLinearTileRows;
        continue;
      }
      if (W.kind == m3::LinearKind::MXFP8) {
        dot_rows4_mxfp8(W.w + size_t(r) * K, W.scales + size_t(r) * (K / 32), x, K, y + r, more, W.tiled);
        continue;
      }
      if (s.nvfp4_fused && W.kind == m3::LinearKind::MXFP4) {
        const uint8_t* q = W.w + size_t(r) * (K / 2);
        const uint8_t* sc = W.scales + size_t(r) * (K / 32);
        if (W.tiled)
          dot_rows4_nvfp4<true, true>(q, sc, s.nvfp4_stab, x, K, y + r, more);
        else
          dot_rows4_nvfp4<false, true>(q, sc, s.nvfp4_stab, x, K, y + r, more);
        continue;
      }
      if (s.nvfp4_fused) {
        const uint8_t* q = W.w + size_t(r) * (K / 2);
        const uint8_t* sc = W.scales + size_t(r) * (K / 16);
        if (W.tiled)
          dot_rows4_nvfp4<true>(q, sc, s.nvfp4_stab, x, K, y + r, more);
        else
          dot_rows4_nvfp4<false>(q, sc, s.nvfp4_stab, x, K, y + r, more);
        continue;
      }
      if (W.bf16_nibbles) {
        dot_rows4_bf16_nibbles(W.bf16_nibbles + r / 4 * (K / 32) * m3::kBf16NibbleSlot,
                               reinterpret_cast<const uint16_t*>(W.w) + size_t(r) * K, x, K, y + r, more);
        continue;
      }
      if (W.kind == m3::LinearKind::BF16) {
        dot_rows4_bf16(reinterpret_cast<const uint16_t*>(W.w) + size_t(r) * K, x, K, y + r, more, W.tiled);
        continue;
      }
    }
    if (T >= 2 && T <= kTileTokensMax && nr == 4 && tile_tokens(W, s, x, T, y, r, r + 8 <= pf_end)) continue;
#else
    (void)pf_end;
#endif
    if (nr == m3::kLinearTileRows)
      decode_tile(W, r, scratch);
    else
      for (int64_t i = 0; i < nr; ++i) decode_row(W, r + i, scratch + i * K);
#ifdef M3_KERNELS_AVX2
    if (nr == 4) {
      tokens_over_tiles(scratch, 1, K, N, x, T, y, r);
      continue;
    }
#endif
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = x + t * K;
      float* yt = y + t * N + r;
      for (int64_t i = 0; i < nr; ++i) yt[i] = dot_impl(xt, scratch + i * K, K);
    }
  }
}

void linear_rows_impl(const m3::Linear& W, const float* x, int64_t T, float* y, int64_t r0, int64_t r1,
                      float* scratch) {
  RowsSetup s;
  rows_setup(W, x, T, s);
  rows_run(W, s, x, T, y, r0, r1, r1, scratch);
}

void linear_rows_claimed_impl(const m3::Linear& W, const float* x, int64_t T, float* y, m3::RowClaim claim, void* ctx,
                              float* scratch) {
  RowsSetup s;
  bool ready = false;
  // Products of many tokens run adjacent claims (the scheduler's chunks shrink to 2 tiles when T is
  // large) together, up to 16 tiles, so a panel of the avx512 build (rows512) spans them and the
  // tokens' activations stream once per panel instead of once per chunk. Only from 128 tokens: merging
  // from 41 tokens made the routed experts (many small jobs) slower. Not for the lane GEMM, whose
  // panels are single claims: a merged run cannot be shared out at the end of the call.
  int64_t merge_rows = 0;
  int64_t p0 = 0, p1 = 0;  // claimed rows not yet run
  for (int64_t r0, r1; claim(ctx, &r0, &r1);) {
    if (!ready) {  // not for a call that gets no rows
      rows_setup(W, x, T, s);
      ready = true;
      merge_rows = T >= 128 && !lane_taken(s) ? 16 * m3::kLinearTileRows : 0;
    }
    if (r0 == p1 && r1 - p0 <= merge_rows) {
      p1 = r1;
      continue;
    }
    if (p1 > p0) rows_run(W, s, x, T, y, p0, p1, W.N, scratch);
    p0 = r0, p1 = r1;
  }
  if (p1 > p0) rows_run(W, s, x, T, y, p0, p1, W.N, scratch);
}

// This build's part of the kernel table (exported by linear_<isa>.cpp under its ISA's name).
constexpr LinearOps kLinearTable = {
    .dot = dot_impl,
    .axpy = axpy_impl,
    .linear_rows = linear_rows_impl,
    .linear_rows_claimed = linear_rows_claimed_impl,
    .decode_rows = decode_rows_impl,
};

}  // namespace
}  // namespace m3::cpu
