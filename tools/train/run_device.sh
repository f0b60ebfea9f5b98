#!/usr/bin/env bash
# One device call (<= 10 min on one H200): corpus -> tokenizer -> training -> export -> evaluation.
# Usage (repo root, on the GPU machine):  OUT=/some/dir tools/train/run_device.sh [TOTAL_SECONDS]
# Work files (corpus, token streams, resumable checkpoint) go to build/train_work/ (ignored; it
# survives between calls while the machine stays warm). What comes back is under $OUT:
#   $OUT/model/   exported official-layout model + tokenizer (-> models/dsv4-mini)
#   $OUT/run.log  full log;  $OUT/extras.tgz  metrics, corpus/token meta, training state,
#                 val_sample.safetensors (for the C++ check), unigram_counts.npy
# RESUME=1 skips corpus/tokenizer (reuses build/train_work) and continues training from the
# checkpoint for EXTEND steps (default 0: just re-export / re-evaluate).
set -uo pipefail
T0=$(date +%s)
TOTAL=${1:-590}                  # the whole command must end before this many seconds
RESERVE=${RESERVE:-110}          # seconds kept for export + evaluation after training
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
REPO=$(pwd)
W=$REPO/build/train_work
OUT=${OUT:?OUT must be set}
mkdir -p "$W" "$OUT/model"
LOG=$OUT/run.log
PY=python3
cd "$REPO/tools/train"
{
  echo "== $(date -u) host $(hostname) python $($PY -c 'import sys;print(sys.version.split()[0])')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  $PY -c 'import torch,transformers,tokenizers;print("torch",torch.__version__,"transformers",transformers.__version__,"tokenizers",tokenizers.__version__)'
} 2>&1 | tee -a "$LOG"

if [ "${RESUME:-0}" != 1 ]; then
  rm -rf "$W/corpus" "$W/tok" "$W/ckpt"
  echo "== corpus $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
  $PY data.py --out "$W/corpus" --max-train-mb "${MAX_TRAIN_MB:-400}" --chat-files "${CHAT_FILES:-40000}" 2>&1 | tee -a "$LOG" || exit 1
  echo "== tokenizer $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
  $PY tokenizer.py --corpus "$W/corpus" --out "$W/tok" --sample-mb "${TOK_SAMPLE_MB:-40}" 2>&1 | tee -a "$LOG" || exit 1
  NOW=$(date +%s)
  BUDGET=$(( T0 + TOTAL - RESERVE - NOW - 25 ))
  echo "== train $(( NOW - T0 ))s, training budget ${BUDGET}s" | tee -a "$LOG"
  $PY train.py --data "$W/tok" --ckpt "$W/ckpt" --time-budget "$BUDGET" \
      --deadline $(( T0 + TOTAL - RESERVE )) --batch "${BATCH:-64}" --lr "${LR:-2e-3}" ${TRAIN_EXTRA:-} 2>&1 | tee -a "$LOG" || exit 1
elif [ "${EXTEND:-0}" != 0 ]; then
  NOW=$(date +%s)
  $PY train.py --data "$W/tok" --ckpt "$W/ckpt" --resume --extend-steps "$EXTEND" --time-budget $(( T0 + TOTAL - RESERVE - NOW - 25 )) \
      --deadline $(( T0 + TOTAL - RESERVE )) --batch "${BATCH:-64}" --lr "${LR:-2e-3}" ${TRAIN_EXTRA:-} 2>&1 | tee -a "$LOG" || exit 1
fi

echo "== export $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
$PY export.py --ckpt "$W/ckpt/ckpt.pt" --tokenizer "$W/tok/tokenizer.json" --out "$OUT/model" --shards 2 2>&1 | tee -a "$LOG" || exit 1
echo "== evaluate $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
$PY evaluate.py --model "$OUT/model" --val "$W/tok/val.bin" --train "$W/tok/train.bin" \
    --out "$W/metrics.json" --save-dir "$W/evsave" --windows 256 --sample-new 64 ${EVAL_EXTRA:-} 2>&1 | tee -a "$LOG"
cp "$W/corpus/corpus_meta.json" "$W/tok/tokens_meta.json" "$W/ckpt/train_state.json" "$W/ckpt/train_log.txt" "$W/evsave/"* "$W/" 2>/dev/null
( cd "$W" && tar czf "$OUT/extras.tgz" metrics.json corpus_meta.json tokens_meta.json train_state.json train_log.txt \
    val_sample.safetensors unigram_counts.npy 2>/dev/null )
echo "== done $(( $(date +%s) - T0 ))s" | tee -a "$LOG"
ls -la "$OUT" "$OUT/model" | tee -a "$LOG"
