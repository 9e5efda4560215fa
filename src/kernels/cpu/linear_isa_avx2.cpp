// The kernel table compiled for avx2 (flags set per file in CMakeLists.txt).
#include <algorithm>
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

#define M3_ISA_NAME "avx2"
namespace m3::isa_avx2 {
#include "kernels/cpu/linear_impl.inc"
}  // namespace m3::isa_avx2
