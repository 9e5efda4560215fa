// Which kernel families the including translation unit may compile, from its compiler flags (set per
// file in CMakeLists.txt: *_avx2.cpp and *_avx512.cpp get the ISA's -m flags, *_generic.cpp none).
// Run-time dispatch (dispatch.cpp) only calls a table whose ISA this CPU has (cpu_features.h).
#pragma once

// The avx2 build, and the AVX2 kernels the avx512 build keeps for shapes its 512-bit forms do not take.
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define M3_KERNELS_AVX2 1
#endif

// The avx512 build's 512-bit kernels.
#if defined(M3_KERNELS_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__) && defined(__AVX512VBMI__)
#define M3_KERNELS_AVX512 1
// GCC 12 reports the _mm512_undefined_* operands inside its own AVX-512 intrinsics (broadcast,
// extract, the 512-to-256 cast) as (maybe-)uninitialized once inlined; they are the intrinsics'
// "don't care" inputs. (For the whole translation unit: the warnings surface where kernels inline.)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
