// Instantiations of the GEMM kernel for chunks of 8 and 16 rows (see marlin_kernel.cuh).
#include "marlin_kernel.cuh"

namespace marlin_cli {
namespace detail {

MARLIN_DEFINE_LAUNCHER(1)

}  // namespace detail
}  // namespace marlin_cli
