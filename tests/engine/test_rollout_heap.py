"""The rollout process's heap setting (rl_engine.rollout.heap): what the environment asks for, and that it
keeps a decode-like allocation pattern from growing the heap in a non-main thread, as it grew before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_engine.rollout.heap import (
    DEFAULT_MMAP_THRESHOLD,
    MMAP_THRESHOLD_ENV,
    fix_mmap_threshold,
    mmap_threshold_from_env,
)

ROOT = Path(__file__).resolve().parents[2]

# One decode step's allocations, stripped to their sizes: [16, 151,936] float32 buffers made and
# dropped (the logits, the sampling temporaries) around two KV-cache-like tensors that grow by a token a
# step (torch.cat), in a thread of its own, as in a Ray actor. Prints the peak RSS rise in MB.
_PATTERN = """
import json, sys, threading
from pathlib import Path
import torch

def mb(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024

if sys.argv[1] == "fixed":
    from rl_engine.rollout.heap import fix_mmap_threshold
    assert fix_mmap_threshold().applied

def decode():
    kv = [torch.zeros(64, 1024) for _ in range(2)]
    for _ in range(64):
        logits = torch.ones(16, 151936)
        probs = logits * 2.0
        kv = [torch.cat([k, torch.zeros(64, 64)], dim=1) for k in kv]
        del logits, probs

Path("/proc/self/clear_refs").write_text("5")
base = mb("VmRSS")
t = threading.Thread(target=decode)
t.start()
t.join()
print(json.dumps(mb("VmHWM") - base))
"""


def _peak_mb(mode: str) -> float:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}  # no MALLOC_* variable: glibc's defaults
    out = subprocess.run(
        [sys.executable, "-c", _PATTERN, mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_threshold_comes_from_the_environment_and_a_bad_value_names_the_variable():
    assert mmap_threshold_from_env({}) == DEFAULT_MMAP_THRESHOLD == 1 << 20
    assert mmap_threshold_from_env({MMAP_THRESHOLD_ENV: "262144"}) == 262144
    assert mmap_threshold_from_env({MMAP_THRESHOLD_ENV: "0"}) == 0
    for bad in ("1MB", "-1", str(64 << 20)):
        with pytest.raises(ValueError, match=MMAP_THRESHOLD_ENV):
            mmap_threshold_from_env({MMAP_THRESHOLD_ENV: bad})
    off = fix_mmap_threshold(0)
    assert (off.threshold, off.applied) == (0, False)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_a_fixed_mmap_threshold_keeps_a_decode_loop_heap_flat():
    # 64 steps x two 9.7 MB buffers: live memory stays ~20 MB; glibc's dynamic threshold let the heap
    # grow by about a buffer every few steps (measured: 80 MB vs 33 MB)
    default, fixed = _peak_mb("default"), _peak_mb("fixed")
    assert fixed < 45, fixed
    assert default > 1.5 * fixed, (default, fixed)  # the pattern does grow without the setting
