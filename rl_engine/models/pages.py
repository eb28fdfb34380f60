"""Give back the file-mapped pages of CPU tensors that are about to be released (Linux; a no-op elsewhere).

``from_pretrained`` maps each safetensors file into memory: a CPU parameter is a view of the mapping,
and its pages become resident (RSS) as they are read. The mapping is released only when every
tensor of that file is gone, so re-homing parameters one by one (``FlatParams.of``) would hold the
whole file resident next to the new buffer until the last copy: twice the model. ``FileMappedPages``
drops a released tensor's pages from this process at once (``madvise(MADV_DONTNEED)`` on the pages
that lie entirely inside it); a later read of those bytes would fault them back in from the file.

Only tensors inside a file-backed mapping and overlapping no other tensor of the module are touched:
anonymous (heap) memory and shared bytes are left alone.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import sys
from collections.abc import Iterable
from pathlib import Path

import torch

_MADV_DONTNEED = 4


def _file_mappings() -> list[tuple[int, int]]:
    """Sorted (start, end) address ranges of this process's file-backed mappings."""
    out = []
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return sorted(out)


class FileMappedPages:
    """Built once over every tensor of a module (``tensors``: parameters and buffers); then
    ``release(t)`` for each tensor whose storage is being let go. Returns the bytes dropped."""

    def __init__(self, tensors: Iterable[torch.Tensor]) -> None:
        self._maps = _file_mappings() if sys.platform == "linux" else []
        self._ranges = sorted(_span(t) for t in tensors if t.device.type == "cpu" and t.numel())
        self._libc = ctypes.CDLL(None, use_errno=True) if self._maps else None
        self._page = mmap.PAGESIZE

    def _mapped(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self._maps, (lo, float("inf"))) - 1
        return i >= 0 and self._maps[i][0] <= lo and hi <= self._maps[i][1]

    def _shared(self, lo: int, hi: int) -> bool:
        """Whether another tensor's bytes overlap [lo, hi) (its own span is in the list once)."""
        return sum(a < hi and lo < b for a, b in self._ranges) > 1

    def release(self, t: torch.Tensor) -> int:
        if self._libc is None or t.device.type != "cpu" or not t.numel():
            return 0
        lo, hi = _span(t)
        if not self._mapped(lo, hi) or self._shared(lo, hi):
            return 0
        start = -(-lo // self._page) * self._page
        end = hi // self._page * self._page
        if end <= start:
            return 0
        if self._libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED):
            return 0
        return end - start


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


__all__ = ["FileMappedPages"]
