# CUTLASS/CuTe headers (header-only) for the Hopper wgmma GEMMs (src/kernels/cuda/fp8_gemm_sm90.cu;
# only with -DDSINFER_CUDA=ON). Not a distribution package: scripts/deps.sh (dsi_install_cutlass)
# unpacks the include tree of PyPI's nvidia-cutlass wheel into a cache directory and test.sh /
# run.sh pass it here. Searched, in order:
#   1. -DCUTLASS_INCLUDE_DIR=DIR (holds cutlass/cutlass.h and cute/tensor.hpp)
#   2. $CUTLASS_INCLUDE_DIR
# Found: DSINFER_HAVE_CUTLASS=ON. Not found: the dense FP8 linears run on the mma.sync kernels at
# every size (correct, slower at prefill). -DDSINFER_CUTLASS=OFF skips the search.
option(DSINFER_CUTLASS "Use CUTLASS for the Hopper wgmma GEMMs when found" ON)
set(CUTLASS_INCLUDE_DIR "" CACHE PATH "CUTLASS include directory (cutlass/, cute/)")

set(DSINFER_HAVE_CUTLASS OFF)
if(DSINFER_CUTLASS)
  set(_dsi_cutlass_dirs)
  if(CUTLASS_INCLUDE_DIR)
    list(APPEND _dsi_cutlass_dirs "${CUTLASS_INCLUDE_DIR}")
  endif()
  if(DEFINED ENV{CUTLASS_INCLUDE_DIR} AND NOT "$ENV{CUTLASS_INCLUDE_DIR}" STREQUAL "")
    list(APPEND _dsi_cutlass_dirs "$ENV{CUTLASS_INCLUDE_DIR}")
  endif()
  foreach(_d IN LISTS _dsi_cutlass_dirs)
    if(EXISTS "${_d}/cutlass/cutlass.h" AND EXISTS "${_d}/cute/tensor.hpp")
      set(DSINFER_HAVE_CUTLASS ON)
      set(DSINFER_CUTLASS_INCLUDE "${_d}")
      break()
    endif()
  endforeach()
endif()
if(DSINFER_HAVE_CUTLASS)
  message(STATUS "CUTLASS: ${DSINFER_CUTLASS_INCLUDE}")
else()
  message(STATUS "CUTLASS: not found (dense FP8 prefill GEMMs on the mma.sync kernels)")
endif()
