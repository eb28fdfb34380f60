"""Rollouter: one actor per rollout worker, generating continuously into the MessageQueue.

Threads inside the actor (created with ``max_concurrency`` >= 6):

* the **generation loop** (started by ``start``): resume unfinished groups first, otherwise ask the
  queue to admit one unit (``prompts_per_call * n`` samples) for the current weights version, draw
  the prompts of this rollouter's slice of the stream, generate, score finished groups and put them
  on the queue. It never waits on the driver: weight updates come to it, not the other way round
  (a driver that handed out fixed chunks could deadlock). Prompts admitted while a control call
  arrives are *parked* (one unit per thread) and generated next; control calls wait for threads
  between admission and parking, so a checkpoint sees every admitted slot.
* **control calls** (``update_weights``, ``pause``/``unpause``, ``evaluate``, ``health``, ``stop``) run
  on the actor's other threads. ``update_weights`` with partial rollout interrupts the running call at
  the next chunk boundary: unfinished responses keep their prefix and behaviour log-probs and are
  continued on the new weights, so the sample spans ``param_version_start..param_version_end``.
* **the worker-exclusive section**: ``update_weights``, ``receive_weights``, ``pause`` (until ``unpause``)
  and each chunk of an evaluation take the worker one at a time, in arrival order, and hold the loop
  off meanwhile. So a weight update lands between two evaluation chunks, never inside one, and between
  chunks the evaluation lets a loop thread take a turn (training generation interleaves with it).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from typing import Any

import ray

from rl_engine.config import ExperimentConfig
from rl_engine.pipeline.components import Components
from rl_engine.pipeline.knobs import Knobs
from rl_engine.rewards.base import score_samples
from rl_engine.rollout.heap import fix_mmap_threshold
from rl_engine.types import (
    EvalSummary,
    PauseState,
    Prompt,
    RolloutHealth,
    RolloutStopped,
    Sample,
    TransferGroup,
    WeightLoadTiming,
    split_groups,
)

_ADMIT_POLL_S = 0.02  # re-ask the queue this often while gated (drops may free capacity)
# Between evaluation chunks, wait at most this long for a loop thread to take its turn (it normally
# does within milliseconds; the bound only matters when the loop cannot run, e.g. held by a pause).
_EVAL_YIELD_MAX_S = 5.0


class EvaluationCancelled(Exception):
    """The run is stopping: the evaluation ends at its next chunk boundary, unreported."""


class Rollouter:
    """Owns a rollout worker, a slice of the prompt stream and a reward function."""

    def __init__(
        self, cfg: ExperimentConfig, knobs: Knobs, index: int, count: int, queue: Any, components: Components
    ) -> None:
        self.cfg, self.knobs, self.index, self.count, self.queue = cfg, knobs, index, count, queue
        # before the worker allocates: freed decode buffers go back to the OS (rl_engine.rollout.heap)
        self.heap = fix_mmap_threshold()
        self.worker = components.worker.build(cfg, index=index)
        self.prompts = components.prompts.build(cfg, index=index)
        self.reward_fn = components.reward.build(cfg, index=index)
        self._pending: list[list[Sample]] = []  # admitted groups with unfinished ("abort") samples
        # admitted units of prompts not started yet (a control call came): one entry per loop thread
        # that parked, so several threads (rollout_concurrency > 1) never overwrite each other
        self._parked: list[list[Prompt]] = []
        self._cv = threading.Condition()
        self._busy: dict[int, float] = {}  # loop thread -> start of its running worker call (monotonic)
        # loop threads between admission and starting (or parking) their prompts: the admitted slots
        # are in no list yet, so a pause/update must wait for them or a checkpoint would miss them
        self._admitting = 0
        self._draw_lock = threading.Lock()  # the prompt stream is not thread-safe
        self._hold = 0  # control calls that need the worker (update, pause) — the loop waits
        # the worker-exclusive section: one entry per control call waiting for or owning (the head) it
        self._worker_turns: deque[object] = deque()
        self._turns = 0  # loop-thread turns (a call started, or admission refused)
        self._eval_yield_mark: int | None = None  # ``_turns`` when the last evaluation chunk ended
        self._eval_holding = False  # an evaluation chunk owns the worker
        self._eval_cancel = threading.Event()  # sticky: set when the run stops
        self._stop = threading.Event()
        self._error: str | None = None
        self._threads: list[threading.Thread] = []
        self.concurrency = cfg.pipeline.rollout_concurrency
        if self.concurrency > 1 and not getattr(self.worker, "supports_concurrent_calls", False):
            raise ValueError(
                f"pipeline.rollout_concurrency={self.concurrency} needs a worker that accepts concurrent "
                f"generate calls; {type(self.worker).__name__} does not: set it to 1"
            )
        self._busy_s = 0.0  # accumulated time inside worker calls
        self._samples_out = 0
        self._tokens_out = 0
        self._last_progress = time.monotonic()
        # rollouter 0 evaluates (one evaluator per run); its own reward instance keeps reward/* counters
        # about training samples only
        self.evaluator = self._build_evaluator(components) if index == 0 and cfg.eval.enabled else None

    def _build_evaluator(self, components: Components) -> Any:
        from rl_engine.evaluation import Evaluator

        tokenizer = getattr(self.worker, "tokenizer", None)
        if tokenizer is None:
            from rl_engine.models import load_tokenizer

            tokenizer = load_tokenizer(self.cfg.model)
        return Evaluator.from_config(self.cfg, tokenizer, components.reward.build(self.cfg, index=self.index))

    # --- generation loop ----------------------------------------------------------------------------
    def start(self) -> None:
        for k in range(self.concurrency):
            t = threading.Thread(target=self._loop, name=f"rollouter-{self.index}-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                job = self._next_job()
                if job is None:
                    continue
                kind, payload = job
                t0 = time.monotonic()
                try:
                    if kind == "resume":
                        self._run_resume(payload)
                    else:
                        self._run_generate(payload)
                finally:
                    with self._cv:
                        self._busy_s += time.monotonic() - t0
                        self._busy.pop(threading.get_ident(), None)
                        self._last_progress = time.monotonic()
                        self._cv.notify_all()
        except BaseException as exc:  # report any failure to the queue: the trainer and driver raise it
            self._error = f"rollouter {self.index}: {type(exc).__name__}: {exc}"
            traceback.print_exc()
            with contextlib.suppress(Exception):
                ray.get(self.queue.fail.remote(self._error))

    def _next_job(self) -> tuple[str, Any] | None:
        """Wait until no control call holds the worker, then pick the next call (or None: retry)."""
        with self._cv:
            while self._hold and not self._stop.is_set():
                self._cv.wait(0.5)
            if self._stop.is_set():
                return None
            if self._pending:
                self._mark_busy()
                return "resume", self._take_resumable()
            if self._parked:
                self._mark_busy()
                return "generate", self._parked.pop(0)
            version = self.worker.version
            self._admitting += 1  # from here until the prompts are started or parked
        prompts: list[Prompt] | None = None
        try:
            unit = self.knobs.prompts_per_call * self.knobs.group_size
            if ray.get(self.queue.try_admit.remote(unit, version)):
                prompts = self._next_prompts()
        finally:
            with self._cv:
                self._admitting -= 1
                self._cv.notify_all()
                started = prompts is not None and self._start_or_park(prompts, version)
        if prompts is None:
            with self._cv:  # gated by the staleness bound: wake up early on a weight update
                self._turns += 1
                self._cv.notify_all()
                self._cv.wait(_ADMIT_POLL_S)
        return ("generate", prompts) if started else None

    def _start_or_park(self, prompts: list[Prompt], version: int) -> bool:
        """(Lock held.) Mark this thread busy with ``prompts`` (True), or park them (False) when a
        weight update or pause arrived since they were admitted for ``version``: they stay counted in
        flight and are generated next, on the fresh weights."""
        if self._hold or self._stop.is_set() or self.worker.version != version:
            self._parked.append(prompts)
            return False
        self._mark_busy()
        return True

    def _mark_busy(self) -> None:
        """(Lock held.) This loop thread starts a worker call: one turn."""
        self._busy[threading.get_ident()] = time.monotonic()
        self._turns += 1
        self._cv.notify_all()

    def _next_prompts(self) -> list[Any]:
        """This rollouter's slice: unit j of the shared stream goes to rollouter ``j % count``."""
        mine: list[Any] = []
        with self._draw_lock:
            for j in range(self.count):
                batch = self.prompts.next_batch(self.knobs.prompts_per_call)
                if j == self.index:
                    mine = batch
        return mine

    def _take_resumable(self) -> list[list[Sample]]:
        """Pop pending groups; drop (and report) those that can no longer meet the staleness bound."""
        groups, self._pending = self._pending, []
        keep: list[list[Sample]] = []
        dropped: list[str] = []
        for g in groups:
            if self.knobs.is_stale(self.worker.version, min(s.param_version_start for s in g)):
                dropped.extend(f"{s.group_id}/{i}" for i, s in enumerate(g))
            else:
                keep.append(g)
        if dropped:
            ray.get(self.queue.report_dropped.remote(dropped))
        return keep

    def _run_generate(self, prompts: list[Any]) -> None:
        samples = self.worker.generate(prompts, self.knobs.group_size)
        self._dispatch(split_groups(samples))

    def _run_resume(self, groups: list[list[Sample]]) -> None:
        unfinished = [s for g in groups for s in g if s.finish_reason == "abort"]
        if unfinished:
            resumed = iter(self.worker.resume(unfinished))
            groups = [[next(resumed) if s.finish_reason == "abort" else s for s in g] for g in groups]
        self._dispatch(groups)

    def _dispatch(self, groups: list[list[Sample]]) -> None:
        """Score finished groups and queue them; keep groups with unfinished samples for resume."""
        done, unfinished = [], []
        for g in groups:
            (unfinished if any(s.finish_reason == "abort" for s in g) else done).append(g)
        # one call for the lot: a remote reward service scores them in batches (unscored ones marked)
        score_samples(self.reward_fn, [s for g in done for s in g])
        with self._cv:  # another loop thread may be taking the pending list right now
            self._pending.extend(unfinished)
        if done:  # one call for all finished groups of this generate call
            ray.get(self.queue.put_many.remote(done))
        with self._cv:
            self._samples_out += sum(len(g) for g in done)
            self._tokens_out += sum(s.response_length for g in done for s in g)

    # --- control calls (other threads) --------------------------------------------------------------
    def _acquire_worker(self, interrupt: bool, cancel: threading.Event | None = None) -> None:
        """Enter the worker-exclusive section (after the control calls that came first); stop the loop
        from starting calls; interrupt the running ones if allowed; wait for them and for threads
        between admission and parking (their slots must be recorded before we return). ``cancel``
        (evaluation only): give up waiting with ``EvaluationCancelled`` once it is set (so a stop never
        waits behind an evaluation that waits for a stuck call)."""
        # A GPU engine's interrupted call returns within its control timeout, or the engine is broken:
        # fail. An in-process worker (HF) stops at its next chunk of decode steps, and a call we may not
        # interrupt takes as long as it takes: the driver's watchdog reports a stuck one.
        limit = getattr(self.cfg.rollout, "control_timeout_s", None)
        with self._cv:
            self._wait_worker_turn(cancel)
            deadline = time.monotonic() + limit if interrupt and limit else float("inf")
            self._hold += 1
            if interrupt and self._busy:
                self.worker.interrupt()
            while self._busy or self._admitting:
                if cancel is not None and (cancel.is_set() or self._stop.is_set()):
                    self._leave_section()
                    raise EvaluationCancelled
                if time.monotonic() > deadline:
                    self._leave_section()
                    raise RuntimeError(
                        f"rollouter {self.index}: the running call did not return within {limit:.0f} s "
                        "of interrupt()"
                    )
                self._cv.wait(0.5)

    def _wait_worker_turn(self, cancel: threading.Event | None) -> None:
        """(Lock held.) Queue for the worker-exclusive section and wait until this call heads the queue."""
        token = object()
        self._worker_turns.append(token)
        while self._worker_turns[0] is not token:
            if cancel is not None and (cancel.is_set() or self._stop.is_set()):
                self._worker_turns.remove(token)
                self._cv.notify_all()
                raise EvaluationCancelled
            self._cv.wait(0.5)

    def _leave_section(self) -> None:
        """(Lock held.) Let the loop run again and hand the worker to the next control call."""
        self._hold -= 1
        self._worker_turns.popleft()
        self._cv.notify_all()

    def _release_worker(self) -> None:
        try:
            self.worker.clear_interrupt()  # engines wait for their abort here: it may time out
        finally:
            with self._cv:
                self._leave_section()

    def update_weights(self, ref_box: list[Any], version: int) -> WeightLoadTiming:
        """Object store sync: load ``[ObjectRef]`` (of an ``ObjectStoreWeights`` stream, or of named
        arrays) as ``version``; the buckets are fetched one at a time while the worker loads them."""
        t0 = time.monotonic()
        self._acquire_worker(interrupt=self.knobs.partial_rollout)
        t_wait = time.monotonic() - t0
        try:
            weights = ray.get(ref_box[0])  # numpy arrays map the object store: no copy here
            t_get = time.monotonic() - t0 - t_wait
            self._load(lambda: self.worker.update_weights(weights, version), version)
        finally:
            self._release_worker()
        return WeightLoadTiming(wait_s=t_wait, total_s=time.monotonic() - t0, get_s=t_get)

    def weight_transfer_ranks(self) -> int:
        """Ranks this rollouter's worker takes in a broadcast weight group (one per engine GPU)."""
        return int(getattr(self.worker, "weight_transfer_ranks", 1))

    def init_weight_transfer(self, group: TransferGroup) -> None:
        """Join the broadcast weight group (once, before ``start``; the trainer joins as rank 0 at the
        same time)."""
        self.worker.init_weight_transfer(group)

    def receive_weights(self, manifest: Any, version: int) -> WeightLoadTiming:
        """Broadcast sync: receive the buckets of ``manifest`` (a ``WeightManifest``) while the trainer
        sends them, and record ``version`` once all of them loaded."""
        t0 = time.monotonic()
        self._acquire_worker(interrupt=self.knobs.partial_rollout)
        t_wait = time.monotonic() - t0
        try:
            self._load(lambda: self.worker.receive_weights(manifest, version), version)
        finally:
            self._release_worker()
        return WeightLoadTiming(wait_s=t_wait, total_s=time.monotonic() - t0)

    def _load(self, load: Any, version: int) -> None:
        """Run a weight load (worker section held); a failure is one clear line naming this rollouter."""
        try:
            load()
        except Exception as exc:
            raise RuntimeError(
                f"rollouter {self.index}: loading weights version {version} failed: {type(exc).__name__}: {exc}"
            ) from exc
        if self.worker.version != version:
            raise RuntimeError(
                f"rollouter {self.index}: the worker holds version {self.worker.version} after loading {version}"
            )

    # --- held-out evaluation (rollouter 0; a control thread) -----------------------------------------------
    def evaluate(self, step: int, min_version: int = 0) -> EvalSummary | None:
        """Run the held-out evaluation once the worker holds weights ``min_version`` or newer (the sync
        the driver started before asking); None when cancelled or not configured. ``step`` only names
        the request in errors."""
        if self.evaluator is None:
            return None
        with self._cv:
            while self.worker.version < min_version:
                if self._eval_cancel.is_set() or self._stop.is_set():
                    return None
                self._cv.wait(0.5)
            self._eval_yield_mark = None  # the first chunk waits for no loop turn
        try:
            return self.evaluator.run(self.worker, hold=self._eval_hold).summary
        except EvaluationCancelled:
            return None
        except Exception as exc:
            raise RuntimeError(
                f"rollouter {self.index}: evaluation for step {step}: {type(exc).__name__}: {exc}"
            ) from exc

    @contextlib.contextmanager
    def _eval_hold(self) -> Iterator[None]:
        """One evaluation chunk owns the worker (the loop's running calls finish first, uninterrupted);
        before it, a loop thread gets a turn, so training generation goes on between chunks."""
        self._yield_to_loop()
        self._acquire_worker(interrupt=False, cancel=self._eval_cancel)
        try:
            with self._cv:
                if self._eval_cancel.is_set() or self._stop.is_set():
                    raise EvaluationCancelled
                self._eval_holding = True
            yield
        finally:
            with self._cv:
                self._eval_holding = False
                self._eval_yield_mark = self._turns
            self._release_worker()

    def _yield_to_loop(self) -> None:
        """Wait (bounded) until a loop thread took a turn since the last chunk: started a call, or
        found admission closed. Without it the next chunk would take the worker back at once."""
        with self._cv:
            mark = self._eval_yield_mark
            if mark is None or not self._threads:
                return
            deadline = time.monotonic() + _EVAL_YIELD_MAX_S
            while self._turns == mark and not (
                self._eval_cancel.is_set() or self._stop.is_set() or self._error
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cv.wait(left)

    def cancel_evaluation(self) -> None:
        """The run is stopping: end the running evaluation (its chunk is interrupted) and start none."""
        with self._cv:
            self._eval_cancel.set()
            if self._eval_holding:  # only then: an interrupt outside an evaluation chunk hits training calls
                self.worker.interrupt()
            self._cv.notify_all()

    def pause(self) -> PauseState:
        """Hold the loop (in-flight calls interrupted with partial rollout) and return the state."""
        self._acquire_worker(interrupt=self.knobs.partial_rollout)
        with self._cv:  # a snapshot: once unpaused the loop continues these samples in place
            return PauseState(
                pending=copy.deepcopy(self._pending),
                parked=[list(unit) for unit in self._parked],
                prompts=self.prompts.state_dict(),
                in_flight=self.in_flight(),
                sampler=self.worker.sampler_state(),
            )

    def unpause(self) -> None:
        self._release_worker()

    def restore(self, state: PauseState) -> None:
        """Before ``start``: pending groups, parked prompts, the stream position and the worker's sampling
        random numbers from a checkpoint."""
        self.prompts.load_state_dict(state.prompts)
        self._pending = [list(g) for g in state.pending]
        self._parked = [list(unit) for unit in state.parked]
        if state.sampler is not None:
            self.worker.load_sampler_state(state.sampler)

    def in_flight(self) -> int:
        """Admitted samples not yet on the queue (pending groups + parked prompts)."""
        with self._cv:
            parked = sum(len(unit) for unit in self._parked) * self.knobs.group_size
            return sum(len(g) for g in self._pending) + parked

    def health(self) -> RolloutHealth:
        """Raise the loop's error, if any; else progress figures for metrics and the watchdog."""
        if self._error:
            raise RuntimeError(self._error)
        now = time.monotonic()
        with self._cv:
            busy_for = now - min(self._busy.values()) if self._busy else 0.0
            running = sum(now - t for t in self._busy.values())
            return RolloutHealth(
                version=self.worker.version,
                busy_s=(self._busy_s + running) / self.concurrency,
                call_running_s=busy_for,
                samples_out=self._samples_out,
                tokens_out=self._tokens_out,
                since_progress_s=now - self._last_progress,
                now=now,
                counters=self.counters(),
            )

    def counters(self) -> dict[str, float]:
        """Cumulative counters for the step metrics: the reward's (``reward/errors``, ``reward/calls``) and,
        on rollouter 0 only, the prompt stream's (``data/overlong_prompts``, ``data/epoch``): every
        rollouter's stream walks all positions (``_next_prompts``), so one stream counts for the run."""
        out: dict[str, float] = {}
        if hasattr(self.reward_fn, "stats"):
            out.update(self.reward_fn.stats())
        if self.index == 0 and hasattr(self.prompts, "stats"):
            out.update(self.prompts.stats())
        return out

    def stop(self, timeout_s: float = 10.0) -> RolloutStopped:
        """End the loop (interrupting a running call) and report what is still in flight."""
        self._stop.set()
        self.worker.interrupt()
        with self._cv:
            self._cv.notify_all()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(Exception):
            self.worker.close()
        return RolloutStopped(in_flight=self.in_flight(), alive=any(t.is_alive() for t in self._threads))
