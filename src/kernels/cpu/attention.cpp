// Attention over stored KV rows, dispatched on their format (see attention.h).
#include "kernels/cpu/attention.h"

#include "kernels/cpu/dispatch.h"

namespace m3 {

namespace {
const float* f32(const KVRows& r) { return reinterpret_cast<const float*>(r.data); }
const uint16_t* bf16(const KVRows& r) { return reinterpret_cast<const uint16_t*>(r.data); }
// The rows' stride in elements of their own type (fp32 or BF16).
int64_t f32_stride(const KVRows& r) { return r.stride_bytes / 4; }
int64_t bf16_stride(const KVRows& r) { return r.stride_bytes / 2; }
}  // namespace

const float* kv_rows_f32(const KVRows& rows, int64_t n, int dim, float* scratch, int64_t* stride) {
  if (rows.dtype == KVDtype::F32) {
    *stride = f32_stride(rows);
    return f32(rows);
  }
  *stride = dim;
  cpu_ops().decode_kv_rows(rows.dtype, rows.data, rows.stride_bytes, n, dim, scratch);
  return scratch;
}

void attention_max_dots(const float* q, int64_t qs, int H, const KVRows& k, int64_t n, int D, float* m) {
  const CpuOps& ops = cpu_ops();
  switch (k.dtype) {
    case KVDtype::F32: return ops.max_dots(q, qs, H, f32(k), f32_stride(k), n, D, m);
    case KVDtype::BF16: return ops.max_dots_bf16(q, qs, H, bf16(k), bf16_stride(k), n, D, m);
    case KVDtype::FP8:
    case KVDtype::NVFP4: return ops.max_dots_rows(k.dtype, q, qs, H, k.data, k.stride_bytes, n, D, m);
  }
}

void attention_max_dots_multi(int Q, const float* const* q, int64_t qs, int H, const KVRows& k, int64_t n, int D,
                              float* const* m) {
  if (Q > 1) {
    const CpuOps& ops = cpu_ops();
    switch (k.dtype) {
      case KVDtype::F32: break;
      case KVDtype::BF16: return ops.max_dots_bf16_multi(Q, q, qs, H, bf16(k), bf16_stride(k), n, D, m);
      case KVDtype::FP8:
      case KVDtype::NVFP4: return ops.max_dots_rows_multi(k.dtype, Q, q, qs, H, k.data, k.stride_bytes, n, D, m);
    }
  }
  for (int i = 0; i < Q; ++i) attention_max_dots(q[i], qs, H, k, n, D, m[i]);
}

bool attention_reads_in_place(KVDtype dtype, int H, int D) {
  return dtype == KVDtype::F32 || dtype == KVDtype::BF16 || cpu_ops().attn_block_rows_in_registers(dtype, H, D);
}

void attention_block(const float* q, int64_t qs, int H, const KVRows& K, const KVRows& V, int64_t n, int D, float scale,
                     float* m, float* l, float* acc, float* scratch, const KVRows& K_next, int64_t n_next) {
  const CpuOps& ops = cpu_ops();
  const bool next = n_next > 0 && K_next.data;
  switch (K.dtype) {
    case KVDtype::F32:
      return ops.attn_block(q, qs, H, f32(K), f32_stride(K), f32(V), f32_stride(V), n, D, scale, m, l, acc, scratch,
                            next ? f32(K_next) : nullptr, next ? f32_stride(K_next) : 0, next ? n_next : 0);
    case KVDtype::BF16:
      return ops.attn_block_bf16(q, qs, H, bf16(K), bf16_stride(K), bf16(V), bf16_stride(V), n, D, scale, m, l, acc,
                                 scratch, next ? bf16(K_next) : nullptr, next ? bf16_stride(K_next) : 0,
                                 next ? n_next : 0);
    case KVDtype::FP8:
    case KVDtype::NVFP4:
      return ops.attn_block_rows(K.dtype, q, qs, H, K.data, K.stride_bytes, V.data, V.stride_bytes, n, D, scale, m, l,
                                 acc, scratch, next ? K_next.data : nullptr, next ? K_next.stride_bytes : 0,
                                 next ? n_next : 0);
  }
}

}  // namespace m3
