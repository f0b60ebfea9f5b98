#!/usr/bin/env bash
# ./run.sh: install what is missing, build, then run the main job on the bundled default model.
# The CUDA backend is built only where a GPU is present.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/deps.sh

dsi_install_deps
CUDA_FLAGS=(-DDSINFER_CUDA=OFF)
NVCC=$(dsi_find_nvcc || true)
if dsi_has_gpu && [ -n "$NVCC" ]; then
  CUDA_FLAGS=(-DDSINFER_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC")
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSINFER_TESTS=OFF "${CUDA_FLAGS[@]}" >/dev/null
ninja -C build -j "$(nproc)" dsinfer

DSI=build/bin/dsinfer
MODEL=${DSINFER_MODEL:-models/default-random}
if [ ! -f "$MODEL/config.json" ]; then
  # Until the bundled trained model exists, the default model is a small RANDOM-weight V4 model
  # that dsinfer generates itself (every layer type, FP8/MXFP4 weights, MTP block).
  echo "[run] generating the default random-weight model in $MODEL"
  "$DSI" make-checkpoint --preset tiny --seed 1 --out "$MODEL"
fi
echo "[run] model:"
"$DSI" inspect --model "$MODEL" | head -40
IDS=0,17,42,7,99,3,256,311,8,64,128,5,77,13,200,150
echo "[run] scoring $IDS (full forward and token by token, reference and deepseek numerics)"
"$DSI" score --model "$MODEL" --input-ids "$IDS" --output build/run_full.safetensors
"$DSI" score --model "$MODEL" --input-ids "$IDS" --chunk 1 --mtp --output build/run_chunk1.safetensors
"$DSI" score --model "$MODEL" --input-ids "$IDS" --numerics deepseek --output build/run_ds.safetensors
echo "[run] done: logits in build/run_*.safetensors"
