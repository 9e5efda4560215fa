// The kernel table compiled for avx512 (flags set per file in CMakeLists.txt).
// GCC 12 reports the _mm512_undefined_* operands inside its own AVX-512 intrinsics (broadcast,
// extract, the 512-to-256 cast) as (maybe-)uninitialized once inlined; they are the intrinsics'
// "don't care" inputs.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <type_traits>
#include <vector>
#include <immintrin.h>

#include "formats/dtype.h"
#include "formats/host_memory.h"
#include "kernels/cpu/aligned_vector.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/element_tables.h"

#define M3_ISA_NAME "avx512"
namespace m3::isa_avx512 {
#include "kernels/cpu/linear_impl.inc"
}  // namespace m3::isa_avx512
