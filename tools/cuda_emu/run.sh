#!/usr/bin/env bash
# Checks the CUDA sampling kernels' logic on the CPU (no GPU needed): builds
# kernels/cuda/sampling.cu against emu_shim.h (launch_sample cut off; an emu_sample driver
# appended) with the host sampler's libraries from an existing build, then runs
# sampling_emu_test. Slow (one OS thread per CUDA thread): small vocabularies take minutes.
#   tools/cuda_emu/run.sh [BUILD_DIR] [SEED] [VOCAB...]   (defaults: build 5 7 50 129 733)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
seed=${2:-5}
shift $(( $# > 2 ? 2 : $# ))
vocabs=${*:-7 50 129 733}
out=$(mktemp -d)
python3 - "$root/src/kernels/cuda/sampling.cu" "$out/sampling_emu.cc" <<'PY'
import sys
s = open(sys.argv[1]).read()
s = s.replace('#include "kernels/cuda/launch_util.h"\n', '')
cut = s.index('Status launch_sample(const SampleParams& p, cudaStream_t stream) {')
s = '#include "emu_shim.h"\n' + s[:cut] + '''
void emu_sample(const SampleParams& p, int grid) {
  if (p.full_sort)
    emu_launch(sample_sort_kernel, grid, kThreads, p);
  else
    emu_launch(sample_select_kernel, grid, kSelThreads, p);
}
}  // namespace dsinfer::cuda
'''
open(sys.argv[2], 'w').write(s)
PY
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
g++ -std=c++20 -O1 -w -I"$root/tools/cuda_emu" -I"$root/src" -I"$root/tests" -I"$cuda_inc" "$out/sampling_emu.cc" \
  "$root/tools/cuda_emu/sampling_emu_test.cc" "$build/src/sampling/libdsinfer_sampling.a" \
  "$build/src/numeric/libdsinfer_numeric.a" "$build/src/base/libdsinfer_base.a" -lpthread \
  -o "$out/sampling_emu_test"
# shellcheck disable=SC2086
"$out/sampling_emu_test" "$seed" $vocabs
