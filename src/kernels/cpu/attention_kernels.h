// The attention entries of the kernel table (AttentionOps), compiled once per ISA by attention_generic.cpp,
// attention_avx2.cpp and attention_avx512.cpp. Two families:
//   max_dots_impl   - the MSA index scan: max over a block of index-key rows of q_h · k_j, for every
//                     index head h at once;
//   attn_block_impl - one key block of online-softmax attention for all query heads of a GQA group:
//                     scores, block max, rescale, exp, P·V in one call.
// Hand-written AVX2/FMA bodies (speed: at long context these are the only parts of a decode step
// that grow, and a function-pointer dot/axpy call per key row plus a scalar libm exp left them far
// from the FMA peak). Every (head, key) score keeps one accumulator fed in a fixed order whatever
// the tiling, and the softmax of a block depends only on that block's scores and the running state,
// so a query row's result does not depend on how many other rows share the step (batch invariance).
// The same exp (attn_exp*) is used for every softmax term and rescale factor.
// Over quantised cache rows read in place: attention_rows_avx2.h / attention_rows_avx512.h; other shapes
// decode the rows first (kv_decode.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "formats/dtype.h"
#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/isa_level.h"
#include "kernels/cpu/kv_decode.h"
#ifdef M3_KERNELS_AVX2
#include "kernels/cpu/attention_rows_avx2.h"
#endif
#ifdef M3_KERNELS_AVX512
#include "kernels/cpu/attention_rows_avx512.h"
#endif

namespace m3::cpu {
namespace {

void max_dots_impl(const float* q, int64_t qs, int H, const float* k, int64_t ks, int64_t n, int D, float* m) {
  max_dots_t<float>(q, qs, H, k, ks, n, D, m);
}

#ifdef M3_KERNELS_AVX2
template <class Rows>
void attn_block_quant(const float* q, int64_t qs, int H, const uint8_t* K, int64_t kb, const uint8_t* V, int64_t vb,
                      int64_t n, int D, float scale, float* m, float* l, float* acc, float* scratch,
                      const uint8_t* K_next, int64_t kb_next, int64_t n_next) {
  q = unit_q<Rows>(q, qs, H, D);
  const LinePrefetch next = LinePrefetch::bytes(K_next, kb_next, n_next, Rows::row_bytes(D));
#ifdef M3_KERNELS_AVX512
  if (D <= 256) {
    using R512 = std::conditional_t<std::is_same_v<Rows, Nvfp4Rows>, Nvfp4Rows512, Fp8Rows512>;
    return attn_block_src(q, qs, H, Block512<R512>{K, V, kb, vb, n}, n, D, scale, m, l, acc, scratch, next);
  }
#endif
  attn_block_src(q, qs, H, QuantBlock<Rows>{K, V, kb, vb, {}}, n, D, scale, m, l, acc, scratch, next);
}
#endif

// Whether the index scan and block attention decode quantised rows of this kind in registers: groups of
// 4 heads, whole 16-element blocks, FP8 or NVFP4 (the others decode to scratch first).
bool attn_block_rows_in_registers_impl(m3::KVDtype kind, int H, int D) {
#if defined(M3_KERNELS_AVX2)
  return H % 4 == 0 && D % 16 == 0 && (kind == m3::KVDtype::FP8 || kind == m3::KVDtype::NVFP4);
#else
  (void)kind, (void)H, (void)D;
  return false;
#endif
}

void attn_block_rows_impl(m3::KVDtype kind, const float* q, int64_t qs, int H, const uint8_t* K, int64_t kb,
                          const uint8_t* V, int64_t vb, int64_t n, int D, float scale, float* m, float* l, float* acc,
                          float* scratch, const uint8_t* K_next, int64_t kb_next, int64_t n_next) {
#if defined(M3_KERNELS_AVX2)
  if (attn_block_rows_in_registers_impl(kind, H, D)) {
    if (kind == m3::KVDtype::FP8)
      return attn_block_quant<Fp8Rows>(q, qs, H, K, kb, V, vb, n, D, scale, m, l, acc, scratch, K_next, kb_next,
                                       n_next);
    if (kind == m3::KVDtype::NVFP4)
      return attn_block_quant<Nvfp4Rows>(q, qs, H, K, kb, V, vb, n, D, scale, m, l, acc, scratch, K_next, kb_next,
                                         n_next);
  }
#else
  (void)K_next, (void)kb_next, (void)n_next;
#endif
  thread_local std::vector<float> kf, vf;  // other shapes: decode, then the fp32 block
  if (kf.size() < size_t(n) * size_t(D)) kf.resize(size_t(n) * size_t(D)), vf.resize(size_t(n) * size_t(D));
  decode_kv_rows_impl(kind, K, kb, n, D, kf.data());
  decode_kv_rows_impl(kind, V, vb, n, D, vf.data());
  attn_block_t<float>(q, qs, H, kf.data(), D, vf.data(), D, n, D, scale, m, l, acc, scratch, nullptr, 0, 0);
}

void max_dots_rows_impl(m3::KVDtype kind, const float* q, int64_t qs, int H, const uint8_t* k, int64_t kb, int64_t n, int D,
                        float* m) {
#if defined(M3_KERNELS_AVX2)
  if (attn_block_rows_in_registers_impl(kind, H, D)) {
    if (kind == m3::KVDtype::FP8) {
      q = unit_q<Fp8Rows>(q, qs, H, D);
#ifdef M3_KERNELS_AVX512
      if (D <= 256) {
        for (int h0 = 0; h0 < H; h0 += 4) max_dots4_rows512<Fp8Rows512>(q + h0 * qs, qs, k, kb, n, D, m + h0);
        return;
      }
#endif
      for (int h0 = 0; h0 < H; h0 += 4) max_dots4_rows<Fp8Rows>(q + h0 * qs, qs, k, kb, n, D, m + h0);
    } else {
#ifdef M3_KERNELS_AVX512
      if (D <= 256) {
        for (int h0 = 0; h0 < H; h0 += 4) max_dots4_rows512<Nvfp4Rows512>(q + h0 * qs, qs, k, kb, n, D, m + h0);
        return;
      }
#endif
      for (int h0 = 0; h0 < H; h0 += 4) max_dots4_rows<Nvfp4Rows>(q + h0 * qs, qs, k, kb, n, D, m + h0);
    }
    return;
  }
#endif
  thread_local std::vector<float> rows;  // other shapes: decode, then the fp32 scan
  if (rows.size() < size_t(n) * size_t(D)) rows.resize(size_t(n) * size_t(D));
  decode_kv_rows_impl(kind, k, kb, n, D, rows.data());
  max_dots_t<float>(q, qs, H, rows.data(), D, n, D, m);
}

void attn_block_impl(const float* q, int64_t qs, int H, const float* K, int64_t ks, const float* V, int64_t vs,
                     int64_t n, int D, float scale, float* m, float* l, float* acc, float* scratch,
                     const float* K_next, int64_t ks_next, int64_t n_next) {
  attn_block_t<float>(q, qs, H, K, ks, V, vs, n, D, scale, m, l, acc, scratch, K_next, ks_next, n_next);
}

// BF16 rows read in place (the paged cache's default dtype): the vector builds widen inside the
// loads; the generic build widens the rows into a buffer first. Same results either way.
#if defined(M3_KERNELS_AVX2)
void max_dots_bf16_impl(const float* q, int64_t qs, int H, const uint16_t* k, int64_t ks, int64_t n, int D, float* m) {
  max_dots_t<uint16_t>(q, qs, H, k, ks, n, D, m);
}

void attn_block_bf16_impl(const float* q, int64_t qs, int H, const uint16_t* K, int64_t ks, const uint16_t* V,
                          int64_t vs, int64_t n, int D, float scale, float* m, float* l, float* acc, float* scratch,
                          const uint16_t* K_next, int64_t ks_next, int64_t n_next) {
  attn_block_t<uint16_t>(q, qs, H, K, ks, V, vs, n, D, scale, m, l, acc, scratch, K_next, ks_next, n_next);
}
#else
inline const float* widen_rows(const uint16_t* src, int64_t stride, int64_t n, int D, std::vector<float>& buf) {
  buf.resize(size_t(n) * size_t(D));
  for (int64_t j = 0; j < n; ++j)
    for (int d = 0; d < D; ++d) buf[size_t(j * D + d)] = m3::bf16_to_float(src[j * stride + d]);
  return buf.data();
}

void max_dots_bf16_impl(const float* q, int64_t qs, int H, const uint16_t* k, int64_t ks, int64_t n, int D, float* m) {
  thread_local std::vector<float> kb;
  max_dots_t<float>(q, qs, H, widen_rows(k, ks, n, D, kb), D, n, D, m);
}

void attn_block_bf16_impl(const float* q, int64_t qs, int H, const uint16_t* K, int64_t ks, const uint16_t* V,
                          int64_t vs, int64_t n, int D, float scale, float* m, float* l, float* acc, float* scratch,
                          const uint16_t*, int64_t, int64_t) {
  thread_local std::vector<float> kb, vb;
  attn_block_t<float>(q, qs, H, widen_rows(K, ks, n, D, kb), D, widen_rows(V, vs, n, D, vb), D, n, D, scale, m, l,
                      acc, scratch, nullptr, 0, 0);
}
#endif

// max_dots_rows for Q query tokens over the same n quantised rows (q[i], m[i] as max_dots_bf16_multi):
// each token's results are those of max_dots_rows on its own (the avx512 build decodes NVFP4 and FP8
// rows once per pass of up to four tokens; the other builds call it per token).
void max_dots_rows_multi_impl(m3::KVDtype kind, int Q, const float* const* q, int64_t qs, int H, const uint8_t* k, int64_t kb,
                              int64_t n, int D, float* const* m) {
#ifdef M3_KERNELS_AVX512
  if (attn_block_rows_in_registers_impl(kind, H, D) && D <= 256) {
    if (kind == m3::KVDtype::FP8)  // the queries carry Fp8Rows::kUnit, as unit_q
      multi_token_passes(Q, q, qs, H, D, Fp8Rows::kUnit, m, [&](auto nq, const float* const* qp, float* const* mp) {
        max_dots4_rows_multi512<decltype(nq)::value, Fp8Rows512>(qp, k, kb, n, D, mp);
      });
    else
      multi_token_passes(Q, q, qs, H, D, 1.0f, m, [&](auto nq, const float* const* qp, float* const* mp) {
        max_dots4_rows_multi512<decltype(nq)::value, Nvfp4Rows512>(qp, k, kb, n, D, mp);
      });
    return;
  }
#endif
  for (int i = 0; i < Q; ++i) max_dots_rows_impl(kind, q[i], qs, H, k, kb, n, D, m[i]);
}

// max_dots_bf16 for Q query tokens over the same n keys: q[i] the i-th token's H heads (qs apart),
// m[i] its H running maxima. Each token's results are those of max_dots_bf16 on its own (the
// avx512 build scores up to four tokens per pass over the keys; the others call it per token).
void max_dots_bf16_multi_impl(int Q, const float* const* q, int64_t qs, int H, const uint16_t* k, int64_t ks,
                              int64_t n, int D, float* const* m) {
#ifdef M3_KERNELS_AVX512
  if (H % 4 == 0 && D % 8 == 0 && D <= 256) {
    multi_token_passes(Q, q, qs, H, D, 1.0f, m, [&](auto nq, const float* const* qp, float* const* mp) {
      max_dots4_multi512<decltype(nq)::value>(qp, k, ks, n, D, mp);
    });
    return;
  }
#endif
  for (int i = 0; i < Q; ++i) max_dots_bf16_impl(q[i], qs, H, k, ks, n, D, m[i]);
}

// This build's part of the kernel table (exported by attention_<isa>.cpp under its ISA's name).
constexpr AttentionOps kAttentionTable = {
    .max_dots = max_dots_impl,
    .attn_block = attn_block_impl,
    .max_dots_bf16 = max_dots_bf16_impl,
    .attn_block_bf16 = attn_block_bf16_impl,
    .decode_kv_rows = decode_kv_rows_impl,
    .max_dots_rows = max_dots_rows_impl,
    .attn_block_rows = attn_block_rows_impl,
    .attn_block_rows_in_registers = attn_block_rows_in_registers_impl,
    .max_dots_bf16_multi = max_dots_bf16_multi_impl,
    .max_dots_rows_multi = max_dots_rows_multi_impl,
};

}  // namespace
}  // namespace m3::cpu
