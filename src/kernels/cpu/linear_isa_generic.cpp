// The kernel table compiled for generic (flags set per file in CMakeLists.txt).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>
#include <immintrin.h>

#include "formats/dtype.h"
#include "kernels/cpu/aligned_vector.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/element_tables.h"

#define M3_ISA_NAME "generic"
namespace m3::isa_generic {
#include "kernels/cpu/linear_impl.inc"
}  // namespace m3::isa_generic
