"""Simulated rollout worker, prompt stream, reward and trainer whose *costs* follow a seeded model.

Used by the orchestration tests and the long-tail benchmark (``benchmarks/async_speedup.py`` imports it
from here; it is no part of the engine): GPU inference engines cannot run on this machine, so these
stand in for the engine and the optimizer only; the actors, queue, admission gate, weight sync, partial
rollout, checkpointing around them are the production code.

Cost model (documented in docs/pipeline.md):

* **Response lengths**: log-normal with median ``len_median`` and ``len_sigma`` (sigma = 0.99 gives
  p99/p50 ≈ 10), capped at ``len_cap``; drawn from a generator seeded by (seed, prompt index,
  response index), so a response has the same length whatever the schedule.
* **Decoding**: a continuous-batching engine with ``slots`` concurrent sequences shared by all
  concurrent ``generate``/``resume`` calls (``supports_concurrent_calls``); one decode step
  advances every active sequence by one token and costs ``decode_step_s`` whatever the number of
  active sequences (memory-bound decoding). A freed slot takes the next waiting sequence at the next
  chunk of ``chunk_steps`` steps, where interruption is also checked (partial rollout granularity).
* **Training**: ``train_token_s`` seconds per response token, divided by ``devices``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rl_engine.config import ExperimentConfig
from rl_engine.rollout.base import RolloutWorker
from rl_engine.types import Prompt, Sample, StepAborted


def response_length(seed: int, prompt_index: int, j: int, median: float, sigma: float, cap: int) -> int:
    rng = np.random.default_rng([seed, prompt_index, j])
    return int(min(cap, max(1, round(median * float(np.exp(sigma * rng.standard_normal()))))))


class SimPromptStream:
    """Deterministic infinite prompt stream with the ``PromptStream`` interface."""

    def __init__(self, cfg: ExperimentConfig, index: int = 0, prompt_len: int = 16) -> None:
        self.next_index = 0
        self.prompt_len = prompt_len

    def next_batch(self, k: int) -> list[Prompt]:
        out = []
        for i in range(self.next_index, self.next_index + k):
            ids = [(i * 7 + t) % 50 + 3 for t in range(self.prompt_len)]
            out.append(Prompt(uid=f"p{i}", token_ids=ids, text=f"prompt {i}", answer=str(i % 10), index=i))
        self.next_index += k
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"next_index": self.next_index}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.next_index = int(d["next_index"])


def sim_reward(cfg: ExperimentConfig, index: int = 0) -> Any:
    """Reward 1 when the (simulated) answer digit matches the response length's last digit."""

    def fn(sample: Sample) -> float:
        return float(str(sample.response_length % 10) == sample.answer)

    return fn


def sim_prompts(cfg: ExperimentConfig, index: int = 0, prompt_len: int = 16) -> SimPromptStream:
    return SimPromptStream(cfg, index, prompt_len)


class _Engine:
    """Shared state of the simulated decode engine: waiting and active sequences, one condition."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.waiting: collections.deque = collections.deque()
        self.active: list = []
        self.thread: threading.Thread | None = None


class SimRolloutWorker(RolloutWorker):
    """A continuous-batching decode engine whose costs are simulated (see the module docstring)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        index: int = 0,
        *,
        slots: int = 64,
        decode_step_s: float = 0.0005,
        chunk_steps: int = 8,
        len_median: float = 16,
        len_sigma: float = 0.99,
        len_cap: int = 256,
        fail_at_call: int | None = None,
        hang_at_call: int | None = None,
        update_hang_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.seed, self.index = cfg.seed, index
        self.slots, self.decode_step_s, self.chunk_steps = slots, decode_step_s, chunk_steps
        self.len_args = (len_median, len_sigma, len_cap)
        self.fail_at_call, self.hang_at_call, self.update_hang_s = fail_at_call, hang_at_call, update_hang_s
        self.calls = 0
        self.weights: dict[str, np.ndarray] = {}
        self._engine = _Engine()

    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        self._fault_points()
        samples = [
            Sample(
                prompt_uid=p.uid,
                group_id=p.uid,
                prompt_ids=list(p.token_ids),
                response_ids=[],
                logprobs=[],
                finish_reason="abort",
                param_version_start=self.version,
                param_version_end=self.version,
                prompt_text=p.text,
                answer=p.answer,
                extra={"target_len": float(response_length(self.seed, p.index, j, *self.len_args))},
            )
            for p in prompts
            for j in range(n)
        ]
        return self._decode(samples)

    def resume(self, samples: list[Sample]) -> list[Sample]:
        self._fault_points()
        for s in samples:
            s.num_interruptions += 1
        return self._decode(samples)

    def _fault_points(self) -> None:
        with self._engine.cv:
            self.calls += 1
        if self.fail_at_call is not None and self.calls >= self.fail_at_call:
            raise RuntimeError(f"simulated rollout failure at call {self.calls}")
        if self.hang_at_call is not None and self.calls >= self.hang_at_call:
            threading.Event().wait(3600)  # a stuck engine that ignores interrupts

    supports_concurrent_calls = True  # calls share one slot pool, like an async continuous-batching engine

    def _decode(self, samples: list[Sample]) -> list[Sample]:
        """Run ``samples`` through the shared slot engine until done or interrupted (chunk granularity)."""
        eng = self._engine
        todo = [s for s in samples if s.finish_reason == "abort"]
        with eng.cv:
            left = [len(todo)]
            eng.waiting.extend((left, s) for s in todo)
            if eng.thread is None:
                eng.thread = threading.Thread(target=self._engine_loop, daemon=True)
                eng.thread.start()
            eng.cv.notify_all()
            while left[0] > 0:
                if self.interrupted:  # take this call's sequences out of the engine; they stay "abort"
                    eng.waiting = collections.deque(x for x in eng.waiting if x[0] is not left)
                    eng.active = [x for x in eng.active if x[0] is not left]
                    break
                eng.cv.wait(0.02)
        for s in samples:
            s.response_text = "x" * len(s.response_ids)
        return samples

    def _engine_loop(self) -> None:
        """One decode chunk per iteration: every active sequence advances ``chunk_steps`` tokens."""
        eng = self._engine
        while True:
            with eng.cv:
                while len(eng.active) < self.slots and eng.waiting:
                    eng.active.append(eng.waiting.popleft())
                if not eng.active:
                    eng.cv.wait(0.05)
                    continue
            time.sleep(self.chunk_steps * self.decode_step_s)
            with eng.cv:
                still = []
                for left, s in eng.active:
                    target = int(s.extra["target_len"])
                    take = min(self.chunk_steps, target - len(s.response_ids))
                    s.response_ids.extend([5] * take)
                    s.logprobs.extend([-1.0] * take)
                    s.param_version_end = self.version
                    if len(s.response_ids) >= target:
                        s.finish_reason = "stop"
                        left[0] -= 1
                    else:
                        still.append((left, s))
                eng.active = still
                eng.cv.notify_all()

    def update_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        if self.update_hang_s:
            time.sleep(self.update_hang_s)
        self.weights = {k: np.asarray(v) for k, v in named_tensors.items()}
        self._version = version


STOP_SLICE_S = 0.05  # the simulated trainer's stop points, as a real step's micro-batches


class SimTrainer:
    """``PolicyTrainer`` stand-in: sleeps the modelled cost, updates a deterministic weight vector."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        *,
        train_token_s: float = 0.0,
        devices: int = 1,
        weight_mb: float = 1.0,
        fail_at_step: int | None = None,
    ) -> None:
        self.cfg, self.train_token_s = cfg, train_token_s
        self.devices, self.fail_at_step = devices, fail_at_step
        size = max(1, int(weight_mb * 2**20 / 4))
        self.params = {"w": np.zeros(size, dtype=np.float32), "b": np.zeros(8, dtype=np.float32)}
        self.version = 0
        self.synced_version = 0
        # uids of every sample trained on so far (what a real model would have learned from); saved
        # with the checkpoint, so tests can tell which samples a resumed run had already trained
        self.trained_uids: list[str] = []

    def train_step(self, samples: list[Sample], stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """The modelled cost, slept in ``STOP_SLICE_S`` slices: like ``PolicyTrainer``, a ``stop`` that
        says yes between slices abandons the step with nothing applied (``StepAborted``)."""
        if len(samples) != self.cfg.trainer.batch_size:
            raise ValueError(f"train_step needs {self.cfg.trainer.batch_size} samples, got {len(samples)}")
        if self.fail_at_step is not None and self.version + 1 >= self.fail_at_step:
            raise RuntimeError(f"simulated trainer failure at step {self.version + 1}")
        tokens = sum(s.response_length for s in samples)
        end = time.monotonic() + tokens * self.train_token_s / self.devices
        while (left := end - time.monotonic()) > 0:
            if stop is not None and stop():
                raise StepAborted(f"step {self.version + 1} abandoned")
            time.sleep(min(left, STOP_SLICE_S))
        mean_r = float(np.mean([s.reward for s in samples]))
        self.params["b"] += np.float32(mean_r)
        self.params["w"][self.version % self.params["w"].size] += 1.0
        n = self.cfg.rollout.n
        self.trained_uids.extend(f"{s.group_id}/{i % n}" for i, s in enumerate(samples))
        self.version += 1
        lag = self.version - 1 - self.synced_version
        return {
            "actor/pg_loss": -mean_r,
            "off_policy/is_ratio_mean": 1.0,
            "off_policy/is_ratio_max": 1.0,
            "off_policy/tis_clipfrac": 0.0,
            "actor/clipfrac": 0.0,
            "sim/proximal_lag": float(lag),
        }

    def weights_numpy(self) -> dict[str, np.ndarray]:
        return {k: np.ascontiguousarray(v) for k, v in self.params.items()}

    def stop_timings(self) -> tuple[float, float]:
        return STOP_SLICE_S, 0.0

    def mark_synced(self) -> None:
        self.synced_version = self.version

    def save_checkpoint(self, path: Path, extra: dict[str, Any]) -> None:
        path = Path(path)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        np.savez(tmp / "params.npz", **self.params)
        (tmp / "state.json").write_text(
            json.dumps({"version": self.version, "trained_uids": self.trained_uids, "extra": extra})
        )
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        path = Path(path)
        with np.load(path / "params.npz") as z:
            self.params = {k: z[k].copy() for k in z.files}
        state = json.loads((path / "state.json").read_text())
        self.version = self.synced_version = int(state["version"])
        self.trained_uids = list(state.get("trained_uids", []))
        return state["extra"]


def sim_worker(
    cfg: ExperimentConfig, index: int = 0, per_index: dict[int, dict[str, Any]] | None = None, **kw: Any
) -> SimRolloutWorker:
    """``per_index``: overrides for one rollouter (e.g. a straggler: ``{1: {"decode_step_s": 30}}``)."""
    return SimRolloutWorker(cfg, index, **{**kw, **(per_index or {}).get(index, {})})


def sim_trainer(cfg: ExperimentConfig, **kw: Any) -> SimTrainer:
    return SimTrainer(cfg, **kw)
