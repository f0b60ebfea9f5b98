// moe_sm90_grouped.h's GEMMs with one weight scale per row and 128-wide K block.
#include "kernels/cuda/moe_sm90_grouped.cuh"

namespace dsinfer::cuda::moe_sm90_detail {
template struct Grouped<1>;
}  // namespace dsinfer::cuda::moe_sm90_detail
