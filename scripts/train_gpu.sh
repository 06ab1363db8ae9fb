#!/usr/bin/env bash
# Train the embedded model on one GPU in about 10 minutes, from a clean copy of the tree: stage 2 (the long
# prompt; the project's own 春联 with their 横批, `couplet.training.context`) continued from assets/model, then
# a short check of the result. Writes the model, the resumable state and the log to OUT_DIR.
#   bash scripts/train_gpu.sh [OUT_DIR]          # default $OUT, else runs/train_gpu
# The corpus is read by path: $DATA, else ../shared/data/couplets_train.tsv.xz, else
# checkpoints/data/couplets_train.tsv.xz (git-ignored: copy it there and carry it to a device machine).
# TRAIN_GPU_MINUTES (default 8) is the training's wall time; TRAIN_GPU_RESUME=1 continues OUT_DIR's state.
# TRAIN_GPU_DEVICE=cpu TRAIN_GPU_QUICK=1 runs the same steps on CPU at toy size (the rehearsal; a test runs it).
# Offline GPU machines: the packages come from the wheels in .whl/ (`scripts/gpu_wheels.sh`), as for
# scripts/gpu_check.sh (`scripts/gpu_env.sh`).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-runs/train_gpu}}"
DEVICE="${TRAIN_GPU_DEVICE:-cuda}"
QUICK="${TRAIN_GPU_QUICK:-0}"
MINUTES="${TRAIN_GPU_MINUTES:-8}"
WHEELS="${GPU_CHECK_WHEELS:-.whl}"
VENV="${GPU_CHECK_VENV:-/tmp/gpu_check_venv}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/train_gpu.log") 2>&1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
DATA="${DATA:-}"
for candidate in "$DATA" ../shared/data/couplets_train.tsv.xz checkpoints/data/couplets_train.tsv.xz; do
  [ -n "$candidate" ] && [ -f "$candidate" ] && { DATA=$candidate; break; }
done
[ -f "$DATA" ] || { echo "!!! no corpus: set DATA, or copy couplets_train.tsv.xz to checkpoints/data/"; exit 2; }

if [ "$DEVICE" = cpu ]; then
  PY=python3; export PYTHONPATH="$PWD"  # the rehearsal runs in the environment it was started from
else
  source scripts/gpu_env.sh
fi
$PY -c "import torch; assert '$DEVICE' == 'cpu' or torch.cuda.is_available(), 'no CUDA device'" \
  || { echo "!!! no $DEVICE device; stopping"; exit 1; }

ARGS=(--data "$DATA" --init assets/model --out "$OUT/model" --state "$OUT/state.pt" --device "$DEVICE"
      --minutes "$MINUTES" --save-every-min 1 --eval-every-min 2)
if [ "$QUICK" = 1 ]; then
  ARGS+=(--limit-rows 20000 --batch-size 4 --eval-pairs 8 --threads 2)
else
  # one GPU: 8x the CPU batch at bf16; the learning rate of a continued run (the model is trained already)
  ARGS+=(--batch-size 128 --lr 4e-4 --bf16 --eval-pairs 300)
fi
[ "${TRAIN_GPU_RESUME:-0}" = 1 ] && [ -f "$OUT/state.pt" ] && ARGS+=(--resume)
echo "=== train: ${ARGS[*]} (at $(date -u +%FT%TZ))"
$PY -m couplet.training.context "${ARGS[@]}" || { echo "!!! training failed"; exit 1; }

echo "=== check: a couplet and its 横批 from the new model"
$PY - "$OUT/model" "$DEVICE" <<'PY'
import sys
from couplet.serving.generate import CoupletRequest, generate
from couplet.models.loading import load_model
lm = load_model(sys.argv[1], device=sys.argv[2])
for keywords in ("龙马精神", "科技创新"):
    r = generate(lm, CoupletRequest(keywords=keywords, length=7), mode="full")
    print(keywords, r.upper, r.lower, r.hengpi, "passed" if r.checks["passed"] else r.checks["failures"])
PY
echo "=== done: $OUT/model (training.json holds the history), log $OUT/train_gpu.log"
