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
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/gpu_check.py "$@"
# The trainer group (FSDP2 over NCCL) on every GPU of this machine against one rank; one GPU: world size
# 1 through the group's code. One more JSON line. GPU_CHECK_GROUP=0 skips it.
if [ "${GPU_CHECK_GROUP:-1}" = 1 ]; then
  group_args=()
  for a in "$@"; do case "$a" in --quick) group_args+=(--quick);; cpu) group_args+=(--device cpu);; esac; done
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/gpu_check_group.py "${group_args[@]}"
fi
