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
from typing import TYPE_CHECKING, Any

from rl_engine.types import Prompt, Sample, TransferGroup

if TYPE_CHECKING:  # the one arrow between the two rooms: rollout reads weights' bucket types, never back
    from rl_engine.weights.buckets import WeightManifest, WeightStream


class RolloutWorker(ABC):
    """Abstract rollout worker. Subclasses: ``HFRolloutWorker``, ``VLLMRolloutWorker``, ``SGLangRolloutWorker``."""

    # A response may not end at eos before it has this many tokens: until then eos is masked out of the
    # sampling distribution (and so of the behaviour log-probs, which then differ from the trainer's
    # recomputation at those steps), as transformers' ``min_new_tokens``, vLLM's ``min_tokens`` and
    # SGLang's ``min_new_tokens`` do; counted over the whole response, across interrupts. 0: off. A
    # worker knob, not a config field: benchmarks set it to decode exactly ``max_new_tokens`` tokens.
    min_new_tokens: int = 0
    # Worker knob, set by a multi-turn episode's wrapper (rl_engine.envs): new tokens per turn of an
    # episode at most (a turn begins at ``Sample.turn_start``). None: only ``max_new_tokens`` bounds.
    max_turn_tokens: int | None = None

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

    # --- the sampling random numbers, for a checkpoint (docs/pipeline.md, "Checkpoint and lossless resume")
    def sampler_state(self) -> bytes | None:
        """The state of the random numbers the worker samples with, for a checkpoint: with it restored
        (``load_sampler_state``), the same weights and requests draw the same tokens as they would have
        in the run that wrote it. None where the engine keeps that state to itself (vLLM, SGLang): a
        resumed run then samples from its seed again."""
        return None

    def load_sampler_state(self, state: bytes) -> None:  # noqa: B027 - workers without one ignore it
        """Continue sampling from ``state`` (what ``sampler_state`` returned, in this or another process)."""

    # --- weights (docs/pipeline.md, "Weight sync") ---------------------------------------------------
    # One contract for every backend. A sync is the trainer's bucket stream (``rl_engine.weights.buckets``)
    # in the serving dtype; the version moves only once the whole of it loaded, a failed load raises.
    weight_transfer_ranks = 1  # ranks the worker takes in a broadcast weight group (one per engine GPU)

    @abstractmethod
    def update_weights(self, weights: WeightStream | Mapping[str, Any], version: int) -> None:
        """Load new weights in place and record ``version``: a ``WeightStream`` (of
        ``rl_engine.weights.buckets``: loaded bucket by bucket, in process or from the Ray object store)
        or named numpy arrays / tensors."""

    def init_weight_transfer(self, group: TransferGroup) -> None:
        """Join the trainer's broadcast weight group as ranks ``group.rank_offset ..`` (the trainer, rank
        0, joins at the same time). Workers without a broadcast path take the object store only."""
        raise NotImplementedError(f"{type(self).__name__} takes weights through the object store only")

    def receive_weights(self, manifest: WeightManifest, version: int) -> None:
        """Receive the buckets ``manifest`` (a ``WeightManifest``, ``rl_engine.weights.buckets``) lays out
        by broadcast (while the trainer sends them), load them and record ``version``."""
        raise NotImplementedError(f"{type(self).__name__} takes weights through the object store only")

    def close(self) -> None:  # noqa: B027 - optional hook, most workers hold nothing to release
        """Release engine resources (GPU memory, processes)."""
