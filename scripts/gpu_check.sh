#!/usr/bin/env bash
# One command to check the engine on a GPU: a Qwen2.5-0.5B-shaped random model in bf16, trainer and HF
# rollout worker on CUDA in one process (no Ray). Prints one JSON summary (docs/benchmarks.md).
#   scripts/gpu_check.sh                     # on CUDA (a few minutes on one GPU)
#   scripts/gpu_check.sh --device cpu --quick   # the same code paths on a small shape, on CPU
# Needs only torch, transformers, pydantic, numpy and pyyaml. PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
missing=$("$PYTHON" - <<'PY'
import importlib.util
print(" ".join(m for m in ("torch", "transformers", "pydantic", "numpy", "yaml") if importlib.util.find_spec(m) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu_check: missing Python packages: $missing (pip install torch transformers pydantic numpy pyyaml)" >&2
  exit 1
fi
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" scripts/gpu_check.py "$@"
