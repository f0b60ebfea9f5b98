// moe_sm90_grouped.h's GEMMs with one weight scale per 128 rows and 128-wide K block.
#include "kernels/cuda/moe_sm90_grouped.cuh"

namespace dsinfer::cuda::moe_sm90_detail {
template struct Grouped<128>;
}  // namespace dsinfer::cuda::moe_sm90_detail
