#!/usr/bin/env bash
# One command to check the engine on a GPU: a Qwen2.5-0.5B-shaped random model in bf16, trainer and HF
# rollout worker on CUDA in one process (no Ray). Prints one JSON summary (docs/benchmarks.md).
#   scripts/gpu_check.sh                     # on CUDA (a few minutes on one GPU)
#   scripts/gpu_check.sh --device cpu --quick   # the same code paths on a small shape, on CPU
# Needs only torch, transformers, pydantic, numpy and pyyaml. PYTHON picks the interpreter.
# On a bare, offline machine (torch, transformers, numpy, pyyaml but no pydantic): run `make gpu-wheels`
# where there is a network, bring .gpu-wheels/ with the tree, and this installs pydantic from it with
# pip --no-index into .gpu-wheels/site (put first on PYTHONPATH; the interpreter's packages untouched).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
WHEELS="${GPU_WHEELS:-.gpu-wheels}"
case "$WHEELS" in /*) SITE="$WHEELS/site" ;; *) SITE="$PWD/$WHEELS/site" ;; esac
[ -d "$SITE" ] && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
missing() {
  "$PYTHON" - <<'PY'
import importlib.util
print(" ".join(m for m in ("torch", "transformers", "pydantic", "numpy", "yaml") if importlib.util.find_spec(m) is None))
PY
}
missing=$(missing)
if [ "$missing" = "pydantic" ] && compgen -G "$WHEELS/pydantic-*.whl" > /dev/null; then
  echo "gpu_check: installing pydantic from $WHEELS (offline) into $SITE" >&2
  if "$PYTHON" -m pip --version > /dev/null 2>&1; then
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --find-links "$WHEELS" \
      --target "$SITE" -r scripts/gpu-requirements.txt
  else  # no pip: these wheels need no build step, a wheel is a zip of the installed files
    "$PYTHON" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
      "$SITE" "$WHEELS"/*.whl
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  missing=$(missing)
fi
if [ -n "$missing" ]; then
  hint="pip install torch transformers pydantic numpy pyyaml"
  [ "$missing" = "pydantic" ] && hint="offline: run 'make gpu-wheels' on a machine with a network and bring $WHEELS/ along"
  echo "gpu_check: missing Python packages: $missing ($hint)" >&2
  exit 1
fi
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/gpu_check.py "$@"
# The trainer group (FSDP2 over NCCL) on every GPU of this machine against one rank; one GPU: world size
# 1 through the group's code. One more JSON line. GPU_CHECK_GROUP=0 skips it.
if [ "${GPU_CHECK_GROUP:-1}" = 1 ]; then
  group_args=()
  for a in "$@"; do case "$a" in --quick) group_args+=(--quick);; cpu) group_args+=(--device cpu);; esac; done
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/gpu_check_group.py "${group_args[@]}"
fi
