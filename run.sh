#!/usr/bin/env bash
# ./run.sh: install what is missing, build, then run the main job on the bundled default model
# (models/dsv4-mini, a small DeepSeek-V4-architecture model trained on Python sources).
# The CUDA backend is built only where a GPU is present. DSINFER_MODEL=DIR picks another model.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/deps.sh

dsi_install_deps
CUDA_FLAGS=(-DDSINFER_CUDA=OFF)
NVCC=$(dsi_find_nvcc || true)
if dsi_has_gpu && [ -n "$NVCC" ]; then
  CUDA_FLAGS=(-DDSINFER_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC")
  # NCCL for --ep N (src/comm; loaded at run time, so dsinfer runs without it), from PyPI.
  if NCCL_DIR=$(dsi_install_nccl); then
    CUDA_FLAGS+=(-DNCCL_ROOT="$NCCL_DIR")
  fi
  # CUTLASS headers for the Hopper wgmma GEMMs, from PyPI's nvidia-cutlass wheel.
  if CUTLASS_DIR=$(dsi_install_cutlass); then
    CUDA_FLAGS+=(-DCUTLASS_INCLUDE_DIR="$CUTLASS_DIR")
  fi
fi
# XGrammar (structured outputs) from its PyPI source distribution.
if XGRAMMAR_DIR=$(dsi_fetch_xgrammar); then
  CUDA_FLAGS+=(-DXGRAMMAR_SOURCE_DIR="$XGRAMMAR_DIR")
fi
# An existing build/ (./test.sh configures it with the tests, and CUDA where nvcc exists) is
# reused as it is: reconfiguring it here would rebuild what the other script built.
if [ -f build/CMakeCache.txt ] && [ -f build/build.ninja ]; then
  echo "[run] reusing the configuration of build/"
else
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSINFER_TESTS=OFF "${CUDA_FLAGS[@]}" \
    >/dev/null
fi
ninja -C build -j "$(nproc)" dsinfer

DSI=build/bin/dsinfer
MODEL=${DSINFER_MODEL:-models/dsv4-mini}
echo "[run] model $MODEL:"
"$DSI" inspect --model "$MODEL" | sed -n '1,12p'
echo
echo "[run] completing a Python function header (greedy, 64 tokens):"
PROMPT=$'def fibonacci(n):\n'
printf '%s' "$PROMPT"
"$DSI" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens 64 --temperature 0
echo
echo "[run] a small batch (JSONL in, JSONL out; sampled, seeded):"
cat > build/run_requests.jsonl <<'JSONL'
{"prompt": "import os\n\n\ndef list_python_files(root):\n", "max_tokens": 48, "temperature": 0.7, "seed": 1}
{"prompt": "class Stack:\n    def __init__(self):\n", "max_tokens": 48, "temperature": 0.7, "seed": 2}
{"messages": [{"role": "user", "content": "How do I read a file line by line in Python?"}], "max_tokens": 48, "temperature": 0}
JSONL
"$DSI" generate --model "$MODEL" --input build/run_requests.jsonl --output build/run_results.jsonl
cat build/run_results.jsonl
