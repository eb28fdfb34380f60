"""The rollout process's C heap: a fixed glibc mmap threshold, so that memory a decode loop frees goes
back to the OS instead of piling up in the heap.

A decode loop that allocates and frees buffers of a vocabulary's size every step (9.7 MB at B = 16 and a
151,936 vocabulary: the HF loop's logits and sampling temporaries before it kept them in buffers,
top-p's sort scratch still) between smaller ones that grow by a token a step (the KV cache, the
attention mask) makes glibc grow its heap: its *dynamic* mmap threshold rises to the largest block
freed (up to 32 MB), so such blocks are served from the decoding thread's heap from then on, the
growing small blocks split the holes they leave, and the next large block no longer fits any hole
(measured in a Rollouter actor over 256 steps: +1.76 GB in one run, flat in another; which one depends
on the order of the first frees). A fixed threshold (``mallopt(M_MMAP_THRESHOLD)``, which also turns the
dynamic one off) gives every block over it its own mapping, returned to the OS when freed: the heap
holds only the small blocks and stays flat (docs/benchmarks.md, "Rollout memory").

``RL_ENGINE_MALLOC_MMAP_THRESHOLD`` (bytes; default 1 MiB; 0 leaves glibc's dynamic threshold) is read
in the process the rollout runs in. Not glibc (musl, macOS): nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass

MMAP_THRESHOLD_ENV = "RL_ENGINE_MALLOC_MMAP_THRESHOLD"
DEFAULT_MMAP_THRESHOLD = 1 << 20
# glibc's bound on the threshold: HEAP_MAX_SIZE / 2 on 64-bit (mallopt refuses more)
MAX_MMAP_THRESHOLD = 32 << 20
_M_MMAP_THRESHOLD = -3  # <malloc.h>


@dataclass(frozen=True)
class HeapSetting:
    """What ``fix_mmap_threshold`` did: the threshold asked for (0: none) and whether glibc took it."""

    threshold: int
    applied: bool
    reason: str = ""


def mmap_threshold_from_env(env: Mapping[str, str] = os.environ) -> int:
    """The threshold ``RL_ENGINE_MALLOC_MMAP_THRESHOLD`` asks for (bytes), else the default; a value that
    is not an integer in [0, 32 MiB] is a ``ValueError`` naming the variable."""
    raw = env.get(MMAP_THRESHOLD_ENV, "").strip()
    if not raw:
        return DEFAULT_MMAP_THRESHOLD
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_MMAP_THRESHOLD:
        raise ValueError(
            f"{MMAP_THRESHOLD_ENV}={raw!r}: expected bytes, an integer from 0 to {MAX_MMAP_THRESHOLD}"
        )
    return value


def fix_mmap_threshold(threshold: int | None = None) -> HeapSetting:
    """Set glibc's mmap threshold of this process to ``threshold`` bytes (None: from the environment,
    ``mmap_threshold_from_env``). Process-wide and for every thread; call it once, at the start of the
    process that decodes (the Rollouter actor does)."""
    value = mmap_threshold_from_env() if threshold is None else threshold
    if value == 0:
        return HeapSetting(0, False, f"{MMAP_THRESHOLD_ENV}=0: glibc's dynamic threshold kept")
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return HeapSetting(value, False, "not glibc: the allocator is left as it is")
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if libc.mallopt(_M_MMAP_THRESHOLD, value) != 1:
        return HeapSetting(value, False, f"glibc refused mallopt(M_MMAP_THRESHOLD, {value})")
    return HeapSetting(value, True)


__all__ = [
    "DEFAULT_MMAP_THRESHOLD",
    "MMAP_THRESHOLD_ENV",
    "HeapSetting",
    "fix_mmap_threshold",
    "mmap_threshold_from_env",
]
