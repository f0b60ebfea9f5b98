#!/usr/bin/env bash
# Kernel-level profile of the 4-layer real-width V4-Flash checkpoint on a GPU host, one Nsight
# Systems capture (or, where nsys is missing, one Nsight Compute pass timing every kernel) per run
# kind (the timed prefill of 8192 tokens, and of 1024 with DSINFER_PROFILE_KINDS=prefill1k; the
# timed decode steps at batch 1 and 64 with 8192 tokens of context), each reduced to a per-kernel CSV (total time, instances)
# and, on stdout, the top-15 kernels and the time by part of the model (kernel_parts.py). Under ncu,
# DSINFER_PROFILE_CACHE=none keeps the caches warm between kernels (default: flushed).
#
# Usage: tools/bench/device_profile.sh [BIN_DIR] [OUT_DIR]   (defaults: build/bin, $OUT or /tmp)
# Needs nsys (the CUDA toolkit ships it) and python3; writes OUT_DIR/kern_<kind>.csv.
set -uo pipefail
BIN=${1:-build/bin}
OUTDIR=${2:-${OUT:-/tmp}}
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys \
  /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
CKPT=${DSINFER_PROFILE_CKPT:-/tmp/flash4}
[ -f "$CKPT/config.json" ] ||
  "$BIN/dsinfer" make-checkpoint --preset v4-flash --layers 4 --out "$CKPT" >/dev/null
summarize() {  # CSV (nsys kernel summary or ncu gpu__time_duration) -> top-15 and per-part tables
  python3 "$(dirname "$0")/kernel_parts.py" "$1" --label "$2"
}
if [ -z "$NSYS" ]; then
  # ncu replays each kernel (slow, and without clock control short kernels read long): one
  # timed run per kind, every kernel's duration as CSV.
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  [ -n "$NCU" ] || { echo "[profile] neither nsys nor ncu found" >&2; exit 2; }
  echo "[profile] nsys not found: ncu" >&2
  for kind in ${DSINFER_PROFILE_KINDS:-decode1 decode64 prefill}; do
    case $kind in
      prefill) args=(--prefill 8192 --decode-batch 1 --context 256 --decode-steps 1
                     --profile-range prefill) ;;
      prefill1k) args=(--prefill 1024 --decode-batch 1 --context 256 --decode-steps 1
                       --profile-range prefill) ;;
      decode1) args=(--prefill 128 --decode-batch 1 --context 8192 --decode-steps 1
                     --profile-range decode) ;;
      decode64) args=(--prefill 128 --decode-batch 64 --context 8192 --decode-steps 1
                      --profile-range decode) ;;
    esac
    # DSINFER_PROFILE_CACHE=none keeps the caches between kernels (closer to a graph replay's
    # times for short kernels; the default flushes them before each kernel, as ncu does).
    "$NCU" --profile-from-start off --clock-control none \
      --cache-control "${DSINFER_PROFILE_CACHE:-all}" --metrics gpu__time_duration.sum --csv \
      "$BIN/dsinfer" bench --model "$CKPT" --no-ceilings --repeats 1 "${args[@]}" \
      >"$OUTDIR/ncu_$kind.csv" 2>"$OUTDIR/ncu_$kind.err" ||
      { echo "[profile] $kind failed:"; tail -5 "$OUTDIR/ncu_$kind.err"; continue; }
    grep -E '^"' "$OUTDIR/ncu_$kind.csv" >"$OUTDIR/kern_$kind.csv"
    summarize "$OUTDIR/kern_$kind.csv" "$kind"
  done
  exit 0
fi
for kind in ${DSINFER_PROFILE_KINDS:-prefill decode1 decode64}; do
  case $kind in
    prefill) args=(--prefill 8192 --decode-batch 1 --context 256 --decode-steps 1 --repeats 1
                   --profile-range prefill) ;;
    prefill1k) args=(--prefill 1024 --decode-batch 1 --context 256 --decode-steps 1 --repeats 1
                     --profile-range prefill) ;;
    decode1) args=(--prefill 128 --decode-batch 1 --context 8192 --decode-steps 8 --repeats 1
                   --profile-range decode) ;;
    decode64) args=(--prefill 128 --decode-batch 64 --context 8192 --decode-steps 4 --repeats 1
                    --profile-range decode) ;;
  esac
  "$NSYS" profile -o "/tmp/dsi_$kind" --force-overwrite true --capture-range=cudaProfilerApi \
    --capture-range-end=stop --cuda-graph-trace=node --trace=cuda \
    "$BIN/dsinfer" bench --model "$CKPT" --no-ceilings "${args[@]}" >"/tmp/dsi_$kind.log" 2>&1 ||
    { echo "[profile] $kind failed:"; tail -5 "/tmp/dsi_$kind.log"; continue; }
  "$NSYS" stats --report cuda_gpu_kern_sum --format csv --force-export=true \
    --output "/tmp/dsi_$kind" "/tmp/dsi_$kind.nsys-rep" >/dev/null 2>&1
  cp "/tmp/dsi_${kind}_cuda_gpu_kern_sum.csv" "$OUTDIR/kern_$kind.csv" 2>/dev/null ||
    { echo "[profile] $kind: no kernel summary"; continue; }
  summarize "$OUTDIR/kern_$kind.csv" "$kind"
done
