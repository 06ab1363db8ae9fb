#!/usr/bin/env bash
# The one test command: installs the runtime and test extras, the browser for the UI tests and the separate
# vLLM environment, then lints, type-checks and runs the suite. Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -r requirements.txt -r requirements-test.txt
# Debian's Chromium for the Playwright tests (`playwright install` would download a browser).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: chromium could not be installed; browser tests will be skipped with a reason"
fi
# vLLM's CPU build in its own cached environment (~2.5 min and 3.5 GB the first time) for the integration tests;
# they must run, not skip, under this command; if the install fails, everything else still runs and those fail
bash scripts/vllm_serve.sh --setup-only >/dev/null \
  || echo "warning: the vLLM environment could not be set up; the vLLM integration tests will fail"
export COUPLET_VLLM_REQUIRED=1
python -m ruff check .
python -m mypy couplet app.py
python -m pytest -q "$@"
