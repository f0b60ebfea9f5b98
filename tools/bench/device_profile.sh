#!/usr/bin/env bash
# Kernel-level profile of the 4-layer real-width V4-Flash checkpoint on a GPU host, one Nsight
# Systems capture (or, where nsys is missing, one Nsight Compute pass timing every kernel) per run
# kind (the timed prefill of 8192 tokens; the timed decode steps at batch
# 1 and 64 with 8192 tokens of context), each reduced to a per-kernel CSV (total time, instances)
# and a top-15 table on stdout.
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
summarize() {  # CSV (nsys kernel summary or ncu gpu__time_duration) -> top-15 table on stdout
  python3 - "$1" "$2" <<'PY'
import csv, collections, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if not l.startswith("=")))
head, rows = rows[0], rows[1:]
agg = collections.defaultdict(lambda: [0.0, 0])
if "Total Time (ns)" in head:  # nsys
    t, n, k = head.index("Total Time (ns)"), head.index("Instances"), head.index("Name")
    for r in rows:
        agg[r[k]][0] += float(r[t]); agg[r[k]][1] += int(r[n])
else:  # ncu: one row per kernel and metric
    k, u, v = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
    scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}
    for r in rows:
        if len(r) > v and r[u] in scale:
            agg[r[k]][0] += float(r[v].replace(",", "")) * scale[r[u]]; agg[r[k]][1] += 1
total = sum(a[0] for a in agg.values()) or 1.0
launches = sum(a[1] for a in agg.values())
print(f"[profile] {sys.argv[2]}: {total / 1e6:.3f} ms of kernels in {launches} launches")
for name, (ns, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:15]:
    name = name.replace("(anonymous namespace)::", "").replace("dsinfer::", "")[:90]
    print(f"  {ns / 1e6:9.3f} ms {100 * ns / total:5.1f}%  x{n:>6}  {name}")
PY
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
      decode1) args=(--prefill 128 --decode-batch 1 --context 8192 --decode-steps 1
                     --profile-range decode) ;;
      decode64) args=(--prefill 128 --decode-batch 64 --context 8192 --decode-steps 1
                      --profile-range decode) ;;
    esac
    "$NCU" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
      "$BIN/dsinfer" bench --model "$CKPT" --no-ceilings --repeats 1 "${args[@]}" \
      >"$OUTDIR/ncu_$kind.csv" 2>"$OUTDIR/ncu_$kind.err" ||
      { echo "[profile] $kind failed:"; tail -5 "$OUTDIR/ncu_$kind.err"; continue; }
    grep -E '^"' "$OUTDIR/ncu_$kind.csv" >"$OUTDIR/kern_$kind.csv"
    summarize "$OUTDIR/kern_$kind.csv" "$kind"
  done
  exit 0
fi
for kind in prefill decode1 decode64; do
  case $kind in
    prefill) args=(--prefill 8192 --decode-batch 1 --context 256 --decode-steps 1 --repeats 1
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
