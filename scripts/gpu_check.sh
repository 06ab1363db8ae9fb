#!/usr/bin/env bash
# GPU check, under 8 minutes: a fresh virtual environment with the project's packages, then the serving
# benchmark on CUDA with the embedded model and with a random model of Qwen2.5-0.5B's shape, every mode,
# a few KV budgets; prints the package versions and Markdown tables with real torch.cuda memory figures.
#   bash scripts/gpu_check.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-/tmp/gpu_check}}"
mkdir -p "$OUT"
# The machine's own CUDA torch is kept when it has one (--system-site-packages); the rest comes from
# requirements.txt (a CUDA torch wheel is only downloaded where none is installed).
python3 -m venv --system-site-packages "$OUT/venv"
. "$OUT/venv/bin/activate"
python -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || python -m pip install -q "torch<=2.14.1"
python -m pip install -q -r requirements.txt
python - <<'PY'
import torch, transformers, gradio
print("torch", torch.__version__, "cuda", torch.version.cuda, "| transformers", transformers.__version__,
      "| gradio", gradio.__version__, "|", torch.cuda.get_device_name(0))
PY
python -m couplet.bench --modes all --reps 3 --device cuda --dtype bfloat16 | tee "$OUT/steps.txt"
python -m couplet.bench serve --device cuda --dtype bfloat16 --visitors 200 --budgets 8,32 \
  --json "$OUT/serve_embedded.json" --plot "$OUT/serve_embedded.html" | tee "$OUT/serve_embedded.md"
python scripts/random_checkpoint.py --shape qwen2.5-0.5b --out "$OUT/qwen-0.5b-shape"
python -m couplet.bench serve --model "$OUT/qwen-0.5b-shape" --device cuda --dtype bfloat16 --visitors 100 \
  --budgets 64 --json "$OUT/serve_05b.json" | tee "$OUT/serve_05b.md"
python - "$OUT" <<'PY'
import json, sys
for name in ("serve_embedded", "serve_05b"):
    out = json.load(open(f"{sys.argv[1]}/{name}.json"))
    print(f"\n{name}: device peak above the weights (torch.cuda.max_memory_allocated), per mode and budget")
    for run in out["runs"]:
        print(run["budget_mb"], {m: round((r["device_peak_bytes"] or 0) / 2**20, 1) for m, r in run["modes"].items()})
PY
# Weights against KV: the 0.5B-shaped model in bf16, int8 and nf4 (bitsandbytes), one couplet each
python - "$OUT" <<'PY'
import sys, torch
from couplet.generate import CoupletRequest, generate
from couplet.model import load_model
print("\n| weights | weight memory (MiB) | couplet KV peak (KiB) | device peak (MiB) |\n| --- | ---: | ---: | ---: |")
for weights in (None, "int8", "nf4"):
    torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    lm = load_model(f"{sys.argv[1]}/qwen-0.5b-shape", device="cuda", dtype="bfloat16", weights=weights)
    r = generate(lm, CoupletRequest("龙马精神"))
    print(f"| {weights or 'bf16'} | {lm.weight_bytes / 2**20:.1f} | {r.peak_bytes / 1024:.1f} | "
          f"{torch.cuda.max_memory_allocated() / 2**20:.1f} |")
    del lm
PY
