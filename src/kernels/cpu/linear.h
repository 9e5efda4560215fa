// Linear: a weight matrix [N, K] (y = x W^T) in its checkpoint encoding, and the multithreaded
// matmul over it. Quantised formats are decoded tile by tile inside the kernel; no fp32 copy of a
// whole matrix is ever made.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "base/aligned_vector.h"

namespace m3 {

// MXFP4: OCP MX FP4 (AMD Quark exports): packed E2M1 [N, K/2] as NVFP4, one E8M0 scale per 32 along K,
// no global scale (docs/formats.md section 4).
enum class LinearKind { None, F32, BF16, F16, MXFP8, NVFP4, MXFP4 };
const char* linear_kind_name(LinearKind k);

struct Linear {
  LinearKind kind = LinearKind::None;
  int64_t N = 0, K = 0;
  const uint8_t* w = nullptr;       // elements (row-major [N, K] or packed [N, K/2])
  const uint8_t* scales = nullptr;  // MXFP8, MXFP4: E8M0 [N, K/32]; NVFP4: E4M3 [N, K/16]
  float global_div = 1.0f;          // NVFP4 compressed-tensors weight_global_scale (a divisor)
  // NVFP4 only, opt-in: activations rounded to int8 per 16 elements for the integer dot products
  // (linear_nvfp4_q8.h; faster, not exact). Requires K % 128 == 0 (see enable_int8_activations).
  bool act_int8 = false;
  // MXFP8 and NVFP4, opt-in: activations rounded to BF16 (round_to_bf16 in linear_kernels.h) before
  // the products, which then run as BF16 dot products where the CPU has them (linear_bf16_dot.h;
  // faster, not exact). Set by enable_bf16_activations.
  bool act_bf16 = false;
  // MXFP4 only: dynamic MXFP4 activations (W4A4, Quark's OCP-MX scheme): each token's x is quantised per
  // 32 elements to E2M1 with an E8M0 scale (mxfp4_qdq_row, scale rule act_mxfp4_mode: 0 even, 1 floor)
  // before the products, which then multiply exactly the values an MXFP4 x MXFP4 GEMM would. Off: the
  // exact fp32 activations against the dequantised weights. Set at load from quantization_config
  // (input_tensors) and --mxfp4-activations.
  bool act_mxfp4 = false;
  uint8_t act_mxfp4_mode = 0;
  // MXFP8 and MXFP4: the smallest and largest E8M0 scale code of the matrix (set_scale_range). The decode
  // step moves the block scales onto the activations when the range is narrow (kMxfp8PrescaleCodes);
  // the defaults (0, 255) keep the plain path.
  uint8_t scale_lo = 0, scale_hi = 255;
  // Element bytes of each full 4-row tile (rows 4t..4t+3, t < N / 4) interleaved in chunks of
  // tile_chunk_bytes: chunk c of row 0, of row 1, of row 2, of row 3, then chunk c + 1 ... Rows past the
  // last full tile stay row-major; scales always do. NVFP4 chunks (32 elements) also hold their nibbles
  // block-major: byte j's low nibble is element j, its high nibble element 16 + j (the checkpoint's
  // order is element 2j low, 2j + 1 high), so the decode step reads each block's codes without
  // interleaving them (nvfp4_chunk_nibbles). Set by tile_rows on weights read into memory
  // (speed: the decode step then reads each tile as one sequential stream, which memory delivers faster
  // than four streams a row apart; see tile_rows).
  bool tiled = false;
  // BF16 matrices tiled for decode, avx512 build: the same values packed losslessly in about 12.3 bits
  // per weight (pack_bf16_tiles), read by steps of few tokens instead of the tiled bytes, which stay for
  // panels (many tokens). nullptr when not packed.
  const uint8_t* bf16_packed = nullptr;
  size_t bf16_packed_bytes = 0;
  // The same for the AVX2 build's one-token step: pack_bf16_nibbles' slots, or nullptr.
  const uint8_t* bf16_nibbles = nullptr;
  size_t bf16_nibbles_bytes = 0;
  std::string name;

  bool empty() const { return kind == LinearKind::None; }
  size_t bytes() const;  // bytes read for one full pass over the matrix
  // Bytes a one-token step reads: the packed BF16 form where the matrix has one, else bytes().
  size_t decode_bytes() const {
    return bf16_packed ? bf16_packed_bytes : bf16_nibbles ? bf16_nibbles_bytes : bytes();
  }
  size_t row_bytes() const { return N ? bytes() / size_t(N) : 0; }
  size_t element_row_bytes() const;  // one row's element bytes (no scales)
};

// Records an MXFP8 or MXFP4 matrix's scale-code range (scale_lo, scale_hi); other formats are left as they are.
void set_scale_range(Linear& W);

// MXFP8 decode step: the block scales are applied to the activations (one copy of x per scale code,
// x * 2^120 * 2^(code - 127), the 2^120 undoing the kernel's placement of E4M3 bits in FP32 fields)
// instead of to every decoded weight, when the matrix uses at most kMxfp8PrescaleCodes codes, none
// above kMxfp8PrescaleMaxCode (2^(code - 7) must be a finite float), and every such copy of x is exact
// (mxfp8_prescale_exact).
constexpr int kMxfp8PrescaleCodes = 16;
constexpr int kMxfp8PrescaleMaxCode = 134;
// Whether x[0, K) times 2^(c - 7) is exact (no overflow, no result below the normal range, no
// NaN) for every code c in [lo, hi].
bool mxfp8_prescale_exact(const float* x, int64_t K, int lo, int hi);
// The same decision from x's extreme exponent fields: emax over all elements (255 when one is inf or
// NaN), emin over the nonzero ones (255 when every element is zero). The decode kernels find both with
// a vector scan (speed: a scalar scan, once per matrix and thread, was a visible share of a decode step).
bool mxfp8_prescale_exact_fields(uint32_t emin, uint32_t emax, int lo, int hi);
// The 512-bit decode step of one token adds the scale's exponent offset (c - 7) << 23 to the bits of x
// instead of multiplying each decoded weight by 2^(c - 7): the same value exactly when every x[k] is
// normal (no zero: its bits plus an offset are no longer zero) and x[k] * 2^(c - 7) stays normal for
// every code c in [lo, hi] (lo <= hi <= kMxfp8PrescaleMaxCode).
bool mxfp8_x_shift_exact(const float* x, int64_t K, int lo, int hi);
// The same from the extreme exponent fields (as mxfp8_prescale_exact_fields) and whether some x is zero.
bool mxfp8_x_shift_exact_fields(uint32_t emin, uint32_t emax, bool zero, int lo, int hi);
// How the avx512 one-token MXFP8 step places the E4M3 bytes (same bits either way): -1 (default) by
// CPU vendor, two-source byte permutes on AMD (one instruction there, two or more cycles on Intel's
// AVX-512 cores), 0 a lane shuffle and a one-source permute, 1 the two-source permute (tests take both).
void set_mxfp8_permute_form(int form);
bool mxfp8_two_source_permute();

// Bytes per chunk of the tiled layout for this matrix, 0 when it is not tiled (F32 / F16, int8
// activations, or in-features the decode kernels would not read in whole chunks): MXFP8 32 (one
// block, K % 32 == 0), NVFP4 16 (two blocks, K % 32 == 0), MXFP4 16 (one block, the NVFP4 nibble order),
// BF16 16 (eight elements, K % 8 == 0).
int64_t tile_chunk_bytes(const Linear& W);
// Rewrites W's element bytes (`bytes` is W.w, writable) into the tiled layout and sets W.tiled;
// returns false and leaves both alone when tile_chunk_bytes is 0, W has fewer than 4 rows, or W is
// already tiled. Results of every kernel stay bit-identical. Why: one sequential stream per thread
// reads faster than four streams a row apart. It pays where the stream sets the pace (the BF16
// lm_head) and for NVFP4 through its block-major nibbles; MXFP8 matrices, paced by their kernel, do not
// gain (figures: docs/benchmarks.md section 5).
bool tile_rows(Linear& W, uint8_t* bytes);
// One NVFP4 chunk (16 bytes, 32 elements) from the checkpoint's nibble order to the tiled one
// (to_tiled) or back.
void nvfp4_chunk_nibbles(const uint8_t* in, uint8_t* out, bool to_tiled);

// Switches an NVFP4 matrix to int8 activations when its K is a multiple of 128 and it is not tiled;
// returns whether it did (other formats and shapes keep the exact path).
bool enable_int8_activations(Linear& W);
// Switches an MXFP8 or NVFP4 matrix to BF16 activations (act_bf16); returns whether it did (other
// formats, and NVFP4 matrices already on int8 activations, keep their path).
bool enable_bf16_activations(Linear& W);
// Whether this CPU multiplies act_bf16 matrices with BF16 dot products (AVX512-BF16 and the avx512
// kernels chosen); elsewhere the rounded activations go through the fp32 kernels (same values, slower).
bool bf16_dot_products();

// Lossless packing of a tiled BF16 matrix for the decode step (speed: the step is bound by memory, and a
// BF16 weight's top byte, sign and seven exponent bits, takes few values within 32 weights of a row).
// Per full 4-row tile and 32-element chunk, a 192-byte slot: the four rows' low bytes (rows 0, 1 in bytes
// 0..63, rows 2, 3 in 64..127), then one nibble per weight (byte b: low nibble for weight b of bytes
// 0..63, high nibble for weight b of 64..127), nibble = sign << 3 | (base_row - top seven exponent bits);
// after all slots, each chunk's four row bases (uint32, row 0 in the low byte). A chunk whose rows do not
// fit (a weight more than 7 steps of 4x below its row's largest in the chunk: zeros, tiny values) has
// bases 0xffffffff and the index of its raw 256 tiled bytes in the slot's first 4 bytes; the raw chunks
// follow the bases. Fills `out`, sets W.bf16_packed; false (nothing done) unless W is tiled BF16 with
// K % 32 == 0.
bool pack_bf16_tiles(Linear& W, AlignedVector<uint8_t>& out);
constexpr uint32_t kBf16PackedEscape = 0xffffffffu;

// Lossless packing of a tiled BF16 matrix for the AVX2 build's one-token step (the form of
// pack_bf16_tiles that AVX2's 32-byte shuffles decode in each row's accumulation order), about 76.6%
// of the bytes. Per full 4-row tile and 32-element chunk, a 196-byte slot: 4 bytes, one per row,
// 0x7f - the row's base (its largest top seven exponent bits in the chunk) or kBf16NibblesEscape when
// a weight of the row is more than 7 steps below it; then per row 48 bytes: the 32 low bytes, then 16
// bytes of nibbles (byte b: low nibble for low byte b, high nibble for low byte 16 + b), nibble =
// sign << 3 | (base - top seven exponent bits). Low byte p holds element 8 (p / 4) + p % 4 for p < 16
// and 8 ((p - 16) / 4) + 4 + p % 4 above (what two byte and two word interleaves put in lane order). An
// escaped row's chunk is read from the tiled bytes, which stay. Fills `out`, sets W.bf16_nibbles; false
// (nothing done) unless W is tiled BF16 with K % 32 == 0 and at least one tile.
bool pack_bf16_nibbles(Linear& W, AlignedVector<uint8_t>& out);
// The packing the dispatched one-token kernels read: pack_bf16_tiles where cpu_ops() is the avx512 build,
// pack_bf16_nibbles where it is the avx2 one; false (nothing done) elsewhere or where W does not pack.
bool pack_bf16_for_decode(Linear& W, AlignedVector<uint8_t>& out);
constexpr uint8_t kBf16NibblesEscape = 0x80;
constexpr int64_t kBf16NibbleSlot = 196;

// y[T, N] = x[T, K] · Wᵀ, rows of W split over the OpenMP threads (as one job of linear_forward_many).
void linear_forward(const Linear& W, const float* x, int64_t T, float* y);

// Several independent products in one OpenMP region (one fork/join instead of one per matrix):
// the 4-row tiles of all jobs, in chunks, start split over the threads by estimated cost, and a
// thread that finishes its share takes chunks left in another's. Each row's result is the one
// linear_forward gives, whichever thread computes it (tiles are aligned to each matrix's own rows).
struct LinearJob {
  const Linear* W;
  const float* x;  // [T, W->K]
  int64_t T;
  float* y;        // [T, W->N]
};
void linear_forward_many(const LinearJob* jobs, int njobs);

// Reference path: decode rows [r0, r0+n) of W to fp32 (row-major [n, K]). Tests and oracles only.
void linear_decode_rows(const Linear& W, int64_t r0, int64_t n, float* out);

}  // namespace m3
