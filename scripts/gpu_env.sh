# Sourced by scripts/gpu_check.sh and scripts/train_gpu.sh (with WHEELS and VENV set): a fresh virtual
# environment with the project's packages on a GPU machine, from the wheels in $WHEELS where it has no
# package index. Sets PY (the interpreter to run) and exports PATH and PYTHONPATH.
# --- the environment ----------------------------------------------------------------------------------
# python3 may itself be a virtual environment that holds the CUDA torch (`--system-site-packages` would
# then see the base interpreter's packages, not its own): a .pth in the fresh environment adds python3's
# site-packages after the fresh one's, so what is installed here wins and the rest is python3's.
HOST_SITE=$(python3 -c 'import site; print(":".join(site.getsitepackages()))')
rm -rf "$VENV"
if python3 -m venv --without-pip "$VENV"; then
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf 'import site; list(map(site.addsitedir, "%s".split(":")))\n' "$HOST_SITE" > "$SITE/zz_host_site.pth"
  PY="$VENV/bin/python"
else  # no venv module: a plain folder ahead of python3's own packages on PYTHONPATH
  echo "!!! python3 -m venv failed; installing into $VENV/site on PYTHONPATH instead"
  SITE="$VENV/site"; mkdir -p "$SITE"; PY=python3
fi
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check --target "$SITE" \
    "$WHEELS"/*.whl || echo "!!! installing the wheels failed"
else
  # pip works on the fresh environment (--python), which sees python3's packages: what is there is kept
  $PY -c "import torch" 2>/dev/null || python3 -m pip --python "$PY" install -q "torch<=2.14.1"
  python3 -m pip --python "$PY" install -q --disable-pip-version-check -r requirements.txt \
    || echo "!!! pip install -r requirements.txt failed"
fi
export PATH="$VENV/bin:$PATH" PYTHONPATH="$PWD"
[ "$PY" = python3 ] && export PYTHONPATH="$PWD:$SITE"
