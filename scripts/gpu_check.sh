#!/usr/bin/env bash
# GPU check, under 8 minutes (every step has a time limit: 7.3 minutes together, with the set-up): a fresh
# virtual environment with the project's packages, then on CUDA: the CPU golden couplets re-run on the GPU
# (float32), the engine's tests on the GPU, the serving benchmark with the embedded model and
# with a random model of Qwen2.5-0.5B's shape (at the default KV budget), per-step costs, and the
# 0.5B-shaped model's weights in bf16 / int8 / nf4 (bitsandbytes). Prints the package versions and
# Markdown tables with real torch.cuda memory figures; everything also lands in OUT_DIR.
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# Offline GPU machines (no package index): the wheels of what the machine lacks go in .whl/ (or
# $GPU_CHECK_WHEELS; `bash scripts/gpu_wheels.sh` downloads them where an index is reachable) and are
# installed from there, no index asked; otherwise requirements.txt is installed from the index. The
# machine's own CUDA torch is always kept. GPU_CHECK_ONLY / GPU_CHECK_MODES / GPU_CHECK_MODES_05B /
# GPU_CHECK_MIN_WAVE choose steps, modes and the engine's admission rule (a second run in the time left,
# as on 2026-12-04: README, "GPU check (H200)").
# GPU_CHECK_DEVICE=cpu GPU_CHECK_QUICK=1 runs the same steps on CPU at toy sizes (to test this script).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-/tmp/gpu_check}}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
QUICK="${GPU_CHECK_QUICK:-0}"
WHEELS="${GPU_CHECK_WHEELS:-.whl}"
VENV="${GPU_CHECK_VENV:-/tmp/gpu_check_venv}"  # not under OUT_DIR: only results go there
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
T0=$SECONDS
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

ONLY="${GPU_CHECK_ONLY:-}"  # e.g. "serve,weights": only these steps (keys: golden tests serve 05b steps weights;
# cb runs only when named)
# step KEY NAME SECONDS CMD...: runs CMD under a time limit; a failure is reported and the next step still runs
step() {
  local key=$1 name=$2 limit=$3
  shift 3
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$key,"* ]]; then echo; echo "=== $name: skipped (GPU_CHECK_ONLY)"; return; fi
  echo; echo "=== $name (limit ${limit}s, at +$((SECONDS - T0))s)"
  timeout -k 10 "$limit" "$@"
  local rc=$?
  [ "$rc" -eq 0 ] || echo "!!! $name: exit $rc$([ "$rc" -eq 124 ] && echo ' (time limit)')"
}

# --- the environment ---------------------------------------------------------------------------------
source scripts/gpu_env.sh
$PY -c "import torch, transformers, couplet.serving.engine" || { echo "!!! the environment cannot import the project; stopping"; exit 1; }
$PY - "$DEVICE" <<'PY'
import importlib, sys, torch
names = ["torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "pypinyin", "plotly", "bitsandbytes"]
vers = []
for n in names:
    try:
        vers.append(f"{n} {importlib.import_module(n).__version__}")
    except Exception as e:  # noqa: BLE001
        vers.append(f"{n} missing ({type(e).__name__})")
print("python", sys.version.split()[0], "|", " | ".join(vers))
if sys.argv[1] == "cuda":
    p = torch.cuda.get_device_properties(0)
    print(f"cuda {torch.version.cuda} | {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
PY
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv

if [ "$QUICK" = 1 ]; then V1=12; V2=6; LIMIT=2; SHAPE=small; else V1=150; V2=48; LIMIT=12; SHAPE=qwen2.5-0.5b; fi
MODES="${GPU_CHECK_MODES:-all}"                               # the embedded model's serving benchmark
MODES_05B="${GPU_CHECK_MODES_05B:-full,int8,int4,shared,combo}"  # the 0.5B shape's (retention modes: see README)
DT=bfloat16; [ "$DEVICE" = cpu ] && DT=float32
# rows in one wave (the engine's default): a GPU forward costs about the same for 16 rows as for 64
# (launch-bound at this size), so the waves are as wide as the budget lets `combo` go
MB_ROWS=64
# the engine's min_wave (default: half of the wave): GPU_CHECK_MIN_WAVE=1 for the A/B against admitting
# whatever fits (the 2026-12-04 runs predate the rule)
WAVE_ARGS=(); [ -n "${GPU_CHECK_MIN_WAVE:-}" ] && WAVE_ARGS=(--min-wave "$GPU_CHECK_MIN_WAVE")

# --- 1. correctness: the CPU golden couplets (float32) re-run on this device, every mode ----------------
step golden "golden couplets, float32 on $DEVICE against the CPU golden file ($LIMIT phrases x 8 modes)" 40 \
  $PY scripts/golden_modes.py --check tests/golden/modes.json --limit "$LIMIT" --device "$DEVICE"

# --- 1b. the engine's own tests on this device: a left-padded wave writes what each request writes alone,
#         every mode (padding rows must stay finite in CUDA's fused attention), admission, cancellation
step tests "engine tests, embedded model float32 on $DEVICE" 45 \
  env COUPLET_TEST_DEVICE="$DEVICE" $PY -m pytest tests/test_engine.py -q -x -p no:cacheprovider

# --- 2. the serving benchmark, embedded model, at the default budget (8 `full` requests + the pool) -------
step serve "serve bench, embedded model, $DT, $V1 visitors, modes $MODES, default budget, waves of $MB_ROWS" 140 \
  $PY -m couplet.bench serve --device "$DEVICE" --dtype "$DT" --visitors "$V1" --modes "$MODES" \
  --max-batch "$MB_ROWS" "${WAVE_ARGS[@]}" --json "$OUT/serve_embedded.json" --plot "$OUT/serve_embedded.html"

# --- 3. the same at a realistic scale: a random model of Qwen2.5-0.5B's shape (our vocabulary) ---------
CK=/tmp/gpu_check_${SHAPE}
step 05b "random checkpoint at $SHAPE's shape" 25 $PY scripts/random_checkpoint.py --shape "$SHAPE" --out "$CK"
step 05b "serve bench, $SHAPE shape, $DT, $V2 visitors, modes $MODES_05B, default budget, waves of $MB_ROWS" 100 \
  $PY -m couplet.bench serve --model "$CK" --device "$DEVICE" --dtype "$DT" --visitors "$V2" --modes "$MODES_05B" \
  --max-batch "$MB_ROWS" "${WAVE_ARGS[@]}" --json "$OUT/serve_05b.json"

# --- 3b. continuous batching against waves, `full`, Poisson arrivals: only with GPU_CHECK_ONLY=cb (a second run;
# the default run's 8 minutes are spent). On CPU it cut forwards per step from 1.8-3.2 to 1.0-1.3 (README); on a
# GPU, where a forward costs about the same for 1 row as for 64, that is the whole saving.
if [[ ",$ONLY," == *",cb,"* ]]; then
  for SCHED in --no-continuous --continuous; do
    step cb "serve bench, embedded model, $DT, full, $V1 visitors at 40/s, 42 MB, $SCHED" 60 \
      $PY -m couplet.bench serve --device "$DEVICE" --dtype "$DT" --visitors "$V1" --rate 40 --budgets 42 \
      --modes full "$SCHED" --json "$OUT/serve_cb${SCHED}.json"
  done
fi

# --- 4. device memory per mode from the JSONs ------------------------------------------------------------
step memory "device memory above the weights" 10 $PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path
for name in ("serve_embedded", "serve_05b"):
    path = Path(sys.argv[1]) / f"{name}.json"
    if not path.exists():
        print(f"\n{name}: no JSON (the step failed)"); continue
    out = json.loads(path.read_text(encoding="utf-8"))
    print(f"\n{name} ({out['model']}, {out['dtype']}): torch.cuda.max_memory_allocated above the weights, "
          "against what the KV accounting says was resident\n")
    print("| budget MB | mode | device peak MiB | resident KV peak MiB | KV per request KiB | concurrency mean / peak "
          "| tok/s | vs full | identical |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for run in out["runs"]:
        for mode, r in run["modes"].items():
            dev = "n/a" if r.get("device_peak_bytes") is None else f"{r['device_peak_bytes'] / 2**20:.1f}"
            print(f"| {run['budget_mb']} | {mode} | {dev} | {r['resident_kv_peak_bytes'] / 2**20:.2f} | "
                  f"{r['kv_per_request_bytes'] / 1024:.0f} | {r['admitted_concurrency']:.1f} / "
                  f"{r['admitted_concurrency_peak']} | {r['throughput_tok_s']:.0f} | {r['throughput_ratio']:.2f}x | "
                  f"{r['identical_rate']:.0%} |")
PY

# --- 5. per-step decode cost and KV bytes, batch 1, embedded model ---------------------------------------
step steps "per-step bench, embedded model, $DT, batch 1" 40 \
  $PY -m couplet.bench --modes full,window,int8,int4,combo --reps 1 --device "$DEVICE" --dtype "$DT"

# --- 6. weights against KV: the 0.5B-shaped model in bf16, int8 and nf4 (bitsandbytes; CUDA only) -------
if [ "$DEVICE" = cuda ]; then
step weights "weights bf16 / int8 / nf4 ($SHAPE shape)" 40 $PY - "$CK" <<'PY'
import gc, sys, torch
from couplet.writing import hengpi
from couplet.serving.generate import CoupletRequest, generate
from couplet.models.loading import load_model
print("| weights | weight memory MiB | couplet KV peak KiB | device peak above the weights MiB | couplet |\n"
      "| --- | ---: | ---: | ---: | --- |")
for weights in (None, "int8", "nf4"):
    try:
        lm = load_model(sys.argv[1], device="cuda", dtype="bfloat16", weights=weights)
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
        r = generate(lm, CoupletRequest("龙马精神"))
        print(f"| {weights or 'bf16'} | {lm.weight_bytes / 2**20:.1f} | {r.peak_bytes / 1024:.1f} | "
              f"{(torch.cuda.max_memory_allocated() - base) / 2**20:.1f} | {r.upper} / {r.lower} |", flush=True)
    except Exception as e:  # noqa: BLE001 - report and go on to the next
        print(f"| {weights} | failed: {type(e).__name__}: {str(e)[:200]} | | | |", flush=True)
    # the 横批 caches are keyed on the model: cleared, or they keep it on the device
    hengpi.clear_cache(); hengpi._phrase_embeddings.cache_clear()
    lm = r = None; gc.collect(); torch.cuda.empty_cache()
PY
fi
echo; echo "=== done in $((SECONDS - T0))s"
