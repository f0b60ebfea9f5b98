#!/usr/bin/env bash
# One call on a GPU host that checks and measures the CUDA backend in one go, with every figure
# from the same run: the op tests (small mode) and the whole-model tests, then `dsinfer bench` on
# the 4-layer real-width V4-Flash checkpoint, transformers eager on the same checkpoint and the
# comparison table. Logs and JSON go to OUT_DIR; one "rc <code> t <seconds>" line ends each log.
#
# Usage: tools/bench/device_check.sh [BIN_DIR] [OUT_DIR] [OPS_FILTER]
#   BIN_DIR     dsinfer, gpu_ops_test, gpu_model_test (default build/bin)
#   OUT_DIR     default $OUT or /tmp
#   OPS_FILTER  gtest filter for gpu_ops_test (default: every op test)
# Environment: DSINFER_CHECK_CKPT (default /tmp/flash4, made when missing).
set -uo pipefail
BIN=${1:-build/bin}
OUTDIR=${2:-${OUT:-/tmp}}
FILTER=${3:-*}
CKPT=${DSINFER_CHECK_CKPT:-/tmp/flash4}
export DSINFER_SOURCE_DIR=${DSINFER_SOURCE_DIR:-$PWD}
T0=$(date +%s)
stamp() { echo "rc $1 t $(($(date +%s) - T0))"; }

DSINFER_GPU_TEST_SMALL=1 timeout 300 "$BIN/gpu_ops_test" --gtest_filter="$FILTER" \
  >"$OUTDIR/ops.log" 2>&1
stamp $? >>"$OUTDIR/ops.log"
timeout 300 "$BIN/gpu_model_test" >"$OUTDIR/model.log" 2>&1
stamp $? >>"$OUTDIR/model.log"
[ -f "$CKPT/config.json" ] ||
  "$BIN/dsinfer" make-checkpoint --preset v4-flash --layers 4 --out "$CKPT" >/dev/null 2>&1
timeout 180 "$BIN/dsinfer" bench --model "$CKPT" --repeats 3 --decode-steps 16 \
  --output "$OUTDIR/bench.json" >"$OUTDIR/bench.log" 2>&1
stamp $? >>"$OUTDIR/bench.log"
timeout 120 python3 tools/bench/transformers_eager.py --model "$CKPT" --dsinfer "$BIN/dsinfer" \
  --output "$OUTDIR/eager.json" >"$OUTDIR/eager.log" 2>&1
stamp $? >>"$OUTDIR/eager.log"
python3 tools/bench/compare.py "$OUTDIR/bench.json" "$OUTDIR/eager.json" >>"$OUTDIR/bench.log" 2>&1
for f in ops model bench eager; do
  printf '%-6s %s\n' "$f" "$(tail -1 "$OUTDIR/$f.log")"
done
