"""The standalone rollout worker contract, shared by every backend (hf, vllm, sglang) and by the
simulated worker of the benchmarks.

A worker is built from (rollout config, model config) alone — no trainer in the same process. It
generates ``n`` responses per prompt with **behaviour log-probs** of the sampled tokens under the
sampling distribution (logits / temperature), records which policy version produced them, takes new
weights in place, and supports **partial rollout**: ``interrupt()`` (thread-safe, called from another
thread while ``generate``/``resume`` runs) makes the running call return at the next chunk boundary;
unfinished responses come back with ``finish_reason == "abort"`` and keep their tokens and log-probs,
and ``resume(samples)`` continues them — typically on new weights, extending ``param_version_end``.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from rl_engine.types import Prompt, Sample


class RolloutWorker(ABC):
    """Abstract rollout worker. Subclasses: ``HFRolloutWorker``, ``VLLMRolloutWorker``, ``SGLangRolloutWorker``."""

    def __init__(self) -> None:
        self._version = 0
        self._interrupt = threading.Event()

    # --- policy version ---------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Policy version of the weights currently loaded (0 = initial weights)."""
        return self._version

    # --- generation ---------------------------------------------------------------------------------
    @abstractmethod
    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        """Answer each prompt ``n`` times; returns ``len(prompts) * n`` samples, grouped by prompt.

        Samples of one prompt share ``group_id``. Interrupted responses have ``finish_reason="abort"``.
        """

    @abstractmethod
    def resume(self, samples: list[Sample]) -> list[Sample]:
        """Continue aborted samples from their prefix on the current weights (same order, same count)."""

    # --- partial rollout hooks ---------------------------------------------------------------------
    def interrupt(self) -> None:
        """Ask the running ``generate``/``resume`` to stop at the next chunk boundary (thread-safe)."""
        self._interrupt.set()

    def clear_interrupt(self) -> None:
        self._interrupt.clear()

    @property
    def interrupted(self) -> bool:
        return self._interrupt.is_set()

    # --- weights ------------------------------------------------------------------------------------
    @abstractmethod
    def update_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        """Load new weights in place (numpy arrays or torch tensors by parameter name); record ``version``."""

    def close(self) -> None:  # noqa: B027 - optional hook, most workers hold nothing to release
        """Release engine resources (GPU memory, processes)."""
