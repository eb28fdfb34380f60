"""The one driver: ``run_experiment(cfg, sink, placement=...)`` builds the actors and runs any mode to the end.

Reads top to bottom like the training loop it orchestrates: (restore) → (evaluate) → start rollouters
→ per step: train on a batch pulled from the queue → sync weights every ``trigger_parameter_sync_step``
steps → start an evaluation when due → log → checkpoint. Every wait is a short poll so a stop request,
an actor failure or a stall is seen within a second (``Waiter``); nothing blocks on an actor without a
timeout, and evaluations run beside training (``EvalSchedule``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from rl_engine.config import ExperimentConfig
from rl_engine.jobspec import Placement
from rl_engine.pipeline import checkpoint as ckpt
from rl_engine.pipeline.components import Components
from rl_engine.pipeline.eval_schedule import EvalSchedule
from rl_engine.pipeline.knobs import Knobs, knobs_from_config
from rl_engine.pipeline.metrics import step_metrics, sum_counters
from rl_engine.pipeline.pauses import RolloutPauses
from rl_engine.pipeline.queue import MessageQueue
from rl_engine.pipeline.reward_alarm import UnscoredAlarm
from rl_engine.pipeline.rollouter import Rollouter
from rl_engine.pipeline.stop_grace import StopGrace
from rl_engine.pipeline.trainer_group import build_trainer_group
from rl_engine.pipeline.watch import StopWaitAbandoned, Waiter
from rl_engine.types import (
    QueueSnapshot,
    QueueStats,
    RolloutHealth,
    RolloutStopped,
    StepCancelled,
    StepResult,
    WeightLoadTiming,
)
from rl_engine.weights.sync import PendingSync, build_sync
from rl_engine.wire import EventKind


@dataclass
class RunSummary:
    """What a run did. ``samples_trained`` counts every sample trained since step 0 (across resumes)."""

    steps_done: int
    start_step: int
    samples_trained: int
    final_reward_mean: float | None
    wall_time_s: float
    stopped: bool
    last_checkpoint: str | None
    dropped_stale: int
    queued: int
    in_flight: int
    admitted: int
    max_queued: int = 0  # deepest the queue got, in samples (bounded by pipeline.queue_max_size when set)
    sync_times_s: list[float] = field(default_factory=list)
    trained_uids: list[str] = field(default_factory=list, repr=False)
    dropped_uids: list[str] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain figures for a one-line JSON report (uid lists left out)."""
        out = {k: v for k, v in self.__dict__.items() if not k.endswith("_uids")}
        out["sync_s_median"] = (
            sorted(self.sync_times_s)[len(self.sync_times_s) // 2] if self.sync_times_s else None
        )
        del out["sync_times_s"]
        return out


@dataclass
class _StepLog:
    """A trained step whose metrics are logged while the next step runs (its figures are in flight)."""

    step: int
    result: StepResult
    wall_s: float
    queue_stats: Any  # ObjectRef of QueueStats
    health: list[Any]  # [num_rollouters] ObjectRefs of RolloutHealth
    sync_s: float | None = None  # a blocking sync done after the step


@dataclass
class _Final:
    """What the actors reported at shutdown, for the summary."""

    in_flight: int = 0
    queue: QueueStats | None = None
    dropped_uids: list[str] = field(default_factory=list)


def run_experiment(
    cfg: ExperimentConfig,
    sink: Any,
    *,
    placement: Placement | None = None,
    stop_event: threading.Event | None = None,
    components: Components | None = None,
) -> RunSummary:
    """Run ``cfg`` until ``trainer.total_steps`` or a stop request (``stop_event`` or SIGTERM), where
    ``placement`` says (checkpoint folder, resume checkpoint, cluster; default: none of them).

    Raises ``PipelineError`` (one-line message naming the failing actor and its error) when an actor fails.
    """
    knobs = knobs_from_config(cfg)
    place = placement or Placement()
    components = components or Components()
    stop = stop_event or threading.Event()
    # ray.init installs its own fatal SIGTERM handler: ours must be installed after it to win.
    with _ray_session(cfg, place.ray_address, sink), _sigterm_sets(stop):
        if components.prepare is not None:
            components.prepare.build(cfg)
        run = _Run(cfg, place, knobs, sink, stop, components)
        try:
            return run.execute()
        finally:
            run.shutdown()


@contextlib.contextmanager
def _sigterm_sets(stop: threading.Event) -> Iterator[None]:
    """SIGTERM (Ray Job stop, platform cancel) requests a graceful stop instead of killing the driver."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


RAY_START_ATTEMPTS = 3  # a private Ray whose start timed out is started again, this many times in all
_RAY_START_TIMEOUT = "timed out during startup"  # ray/_private/node.py: its raylet did not register in time


def _ray_start_timed_out(exc: BaseException) -> bool:
    """Ray's own error when the node it starts does not register with its GCS in time (a plain
    ``Exception`` with this text, raised by ``ray.init``): on a loaded machine, a next try may start."""
    return type(exc) is Exception and _RAY_START_TIMEOUT in str(exc)


@contextlib.contextmanager
def _ray_session(cfg: ExperimentConfig, ray_address: str | None, sink: Any = None) -> Iterator[None]:
    """Join an initialised Ray, an address (the placement's or RAY_ADDRESS of a Ray Job), or start a
    private one in a temporary folder of its own, removed on every exit (a start that failed included).
    A private start that timed out is tried again, ``RAY_START_ATTEMPTS`` times in all, each retry told
    as a ``log`` event."""
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = ray_address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        try:
            yield
        finally:
            ray.shutdown()
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    need = cfg.pipeline.num_rollouters + cfg.resources.trainer_world_size(cfg.trainer.world_size)
    attempt = 0
    while True:
        attempt += 1
        tmp = tempfile.mkdtemp(prefix="rle_", dir="/tmp")  # short: Ray's socket paths have a length limit
        try:
            ray.init(
                num_cpus=max(os.cpu_count() or 1, int(need * cfg.resources.cpus_per_actor + 0.999)),
                include_dashboard=False,
                _temp_dir=tmp,
                runtime_env={
                    "env_vars": {
                        "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])
                    }
                },
            )
        except BaseException as exc:
            _discard_private_ray(tmp)
            if attempt >= RAY_START_ATTEMPTS or not _ray_start_timed_out(exc):
                raise
            if sink is not None:
                sink.log_event(
                    EventKind.LOG,
                    f"Ray's start timed out (attempt {attempt} of {RAY_START_ATTEMPTS}): starting it again",
                    {"source": "driver", "error": str(exc)[:500]},
                )
            continue
        break
    try:
        yield
    finally:
        _discard_private_ray(tmp)


def _discard_private_ray(tmp: str) -> None:
    """Shut the private Ray down and remove its folder. After a start that failed, Ray has no node to
    shut down, but the processes it started (its GCS, its raylet: this process's children, their command
    lines naming the folder) may run on: they are killed first."""
    ray.shutdown()
    for pid in _children_naming(tmp):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    shutil.rmtree(tmp, ignore_errors=True)


def _children_naming(text: str) -> list[int]:
    """This process's children whose command line contains ``text`` (read from /proc; none elsewhere)."""
    me, found = os.getpid(), []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
                if ppid != me:
                    continue
                with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


class _Run:
    """State of one run in the driver: actor handles, counters, the pending log line."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        placement: Placement,
        knobs: Knobs,
        sink: Any,
        stop: threading.Event,
        components: Components,
    ) -> None:
        self.cfg, self.knobs, self.sink, self.stop, self.components = cfg, knobs, sink, stop, components
        self.placement = placement
        self.t_start = time.monotonic()
        self.rewards: list[float] = []
        reward_name = "+".join(name for _, name in cfg.reward.named())
        self.unscored_alarm = UnscoredAlarm(cfg.reward.unscored_alert_ratio, reward_name)
        self.trained_uids: list[str] = []
        self.last_ckpt: str | None = None
        self.last_ckpt_step = -1
        self.start_step = 0
        self.step = 0
        self.stopped = False
        self.actors: list[Any] = []
        self.final = _Final()
        self.grace = StopGrace()

    # --- build ------------------------------------------------------------------------------------------
    def _build(self) -> None:
        cfg, res = self.cfg, self.cfg.resources
        self.queue = (
            ray.remote(MessageQueue).options(num_cpus=0).remote(self.knobs, cfg.pipeline.queue_max_size)
        )
        self.trainer_group = build_trainer_group(cfg, self.knobs, self.queue, self.components)
        self.trainer = self.trainer_group.leader  # the driver talks to rank 0 only
        count = cfg.pipeline.num_rollouters
        # control threads: health, update_weights/pause, unpause, stop, and on rollouter 0 a long
        # evaluate plus its cancel_evaluation
        self.rollouters = [
            ray.remote(Rollouter)
            .options(
                num_cpus=res.cpus_per_actor,
                num_gpus=res.rollout_gpus,
                resources=dict(res.rollout_node_resources) or None,
                max_concurrency=6,
            )
            .remote(cfg, self.knobs, i, count, self.queue, self.components)
            for i in range(count)
        ]
        self.actors = [self.queue, *self.trainer_group.ranks, *self.rollouters]
        self.waiter = Waiter(self)
        # constructors run asynchronously: surface their errors (model load, bad data) now
        self.waiter.wait_all(
            [*self.trainer_group.joined, self.trainer.get_version.remote()]
            + [r.in_flight.remote() for r in self.rollouters],
            "build",
            check_health=False,
        )
        self.syncer = build_sync(cfg, self.trainer, self.rollouters)
        self.syncer.setup(self.waiter.wait_all)  # a broadcast transport joins its group here
        self._pending_sync: PendingSync | None = None
        self.synced_version = 0  # the weights the rollouters hold (or are loading) after the last sync
        self.evals = EvalSchedule(cfg, self.rollouters[0], self.sink, self.waiter)
        self.pauses = RolloutPauses(self.rollouters, self.waiter)

    # --- main loop ----------------------------------------------------------------------------------------
    def execute(self) -> RunSummary:
        self._build()
        self._maybe_resume()
        self.sink.log_event(
            EventKind.STATUS,
            f"pipeline running ({self.knobs.mode}) from step {self.start_step}",
            {"step": self.start_step, "mode": self.knobs.mode, "max_staleness": self.knobs.max_staleness},
        )
        self.grace.state_bytes = self.waiter.wait_one(self.trainer.state_bytes.remote(), "build")
        self._report_grace()
        self._quietly(lambda: self.evals.before_training(self.start_step), "an evaluation")
        ray.get([r.start.remote() for r in self.rollouters])
        total, every = self.cfg.trainer.total_steps, self.cfg.trainer.checkpoint_every
        pending_log: _StepLog | None = None
        t_last = time.monotonic()
        while self.step < total and not self.stop.is_set():
            nxt = self.step + 1
            publish = self.syncer.publishes_with_step and self._syncs_after(nxt)
            ref = self.trainer.train_step.remote(self.cfg.logging.samples_per_step, publish)
            if pending_log is not None:
                self._log(pending_log)  # overlaps with the running step
                pending_log = None
            result: StepResult | StepCancelled = self.waiter.wait_one(ref, "train")
            if isinstance(result, StepCancelled):
                if result.abandoned:
                    self.sink.log_event(
                        EventKind.LOG,
                        f"step {self.step + 1} abandoned after {result.train_s:.1f} s of training: the stop "
                        f"keeps step {self.step} (its samples went back to the queue)",
                        {"step": self.step, "abandoned_s": round(result.train_s, 3)},
                    )
                break
            self.step = result.version
            sync_s = None
            try:
                if result.weights_box:
                    self._finish_sync()  # the previous sync, normally long done
                    self._start_sync(result.version, result.weights_box, result.publish_s)
                elif not self.syncer.publishes_with_step and self._syncs_after(self.step):
                    sync_s = self._sync(self.step)  # blocking: the trainer sends it
            except StopWaitAbandoned as exc:
                self.sink.log_event(
                    EventKind.ALERT, f"stopping without finishing a weight sync: {exc}", {"step": self.step}
                )
                self.trained_uids.extend(result.uids)
                break
            self.evals.after_step(self.step, self.synced_version)
            self._measured_step(result, sync_s)
            now = time.monotonic()
            health = [r.health.remote() for r in self.rollouters]
            pending_log = _StepLog(self.step, result, now - t_last, self.queue.stats.remote(), health, sync_s)
            t_last = now
            if every and self.step % every == 0 and self.step < total:
                self._log(pending_log)
                pending_log = None
                self._checkpoint(self.step)
        if pending_log is not None:
            self._log(pending_log)
        self._finish_sync_quietly()
        self.stopped = self.step < total
        stopping = self.stop.is_set()
        self._quietly(lambda: self.evals.finish(self.step, self.synced_version, stopping), "an evaluation")
        if self.placement.checkpoint_dir and self.last_ckpt_step != self.step:
            self._checkpoint(self.step)
        self.sink.log_event(
            EventKind.STATUS,
            ("stopped" if self.stopped else "finished") + f" at step {self.step}",
            {"step": self.step, "stopped": self.stopped, "checkpoint": self.last_ckpt},
        )
        return self._summary()

    def _measured_step(self, result: StepResult, sync_s: float | None) -> None:
        """Fold a step's stop-relevant timings into the grace estimate (module ``stop_grace``)."""
        m = result.trainer_metrics
        self.grace.longest_gap_s = max(self.grace.longest_gap_s, float(m.get("timing/stop_gap_max_s", 0.0)))
        self.grace.tail_s = max(self.grace.tail_s, float(m.get("timing/step_tail_s", 0.0)))
        if sync_s is not None:
            self.grace.sync_s = max(self.grace.sync_s, sync_s)
        self._report_grace()

    def _report_grace(self) -> None:
        need = self.grace.update()
        if need is not None:
            self.sink.log_event(
                EventKind.STATUS,
                f"a graceful stop needs about {need:.0f} s (the rest of a step, a checkpoint, teardown)",
                {"stop_grace_s": need},
            )

    def _quietly(self, fn: Any, what: str) -> None:
        """Run ``fn``; a wait it abandons after a stop request becomes an alert, not an error."""
        try:
            fn()
        except StopWaitAbandoned as exc:
            self.sink.log_event(
                EventKind.ALERT, f"stopping without finishing {what}: {exc}", {"step": self.step}
            )

    # --- weight sync ------------------------------------------------------------------------------------
    def _syncs_after(self, step: int) -> bool:
        """Whether ``step`` ends with a weight sync: every ``trigger`` steps, and after the last step only
        when the final weights are evaluated (otherwise no rollouter needs them)."""
        total = self.cfg.trainer.total_steps
        if step == total:
            return self.evals.final_due()
        return step % self.knobs.trigger == 0

    # Object store: the trainer publishes right after the step that triggers a sync (and marks the
    # proximal policy); the driver sends the ref to the rollouters and does not wait, so the next
    # step starts at once. The sync is awaited (watchdog included) when that step is logged, before
    # the next sync and before a checkpoint. Admission still gates on the rollouter's version, so the
    # staleness bound and sync/on-policy parity are unaffected.
    def _start_sync(self, version: int, box: list[Any], publish_s: float) -> None:
        self._pending_sync = self.syncer.dispatch(version, box, publish_s)
        self.synced_version = version

    def _finish_sync(self) -> float | None:
        pending = getattr(self, "_pending_sync", None)
        if pending is None:
            return None
        results = self.waiter.wait_all(pending.loads + pending.trainer_refs, "weight sync")
        self._pending_sync = None
        loads: list[WeightLoadTiming] = results[: len(pending.loads)]
        return self.syncer.finish(pending, loads).total_s

    def _finish_sync_quietly(self) -> float | None:
        try:
            return self._finish_sync()
        except StopWaitAbandoned as exc:
            self._pending_sync = None
            self.sink.log_event(
                EventKind.ALERT, f"stopping without finishing a weight sync: {exc}", {"step": self.step}
            )
            return None

    def _sync(self, version: int) -> float | None:
        """Blocking sync: at resume, and for transports where the trainer takes part (gloo, nccl)."""
        self._finish_sync()
        self._pending_sync = self.syncer.start(version)
        self.synced_version = version
        return self._finish_sync()

    def _log(self, entry: _StepLog) -> None:
        step, result = entry.step, entry.result
        pending = getattr(self, "_pending_sync", None)
        sync_s = (
            self._finish_sync_quietly() if pending is not None and pending.version == step else entry.sync_s
        )
        qstats: QueueStats = self.waiter.get(entry.queue_stats, "queue")
        health: list[RolloutHealth] = [
            self.waiter.get(h, f"rollouter {i}") for i, h in enumerate(entry.health)
        ]
        prev = getattr(self, "_prev_busy", None)
        busy = [h.busy_s for h in health]
        deltas = [b - p for b, p in zip(busy, prev, strict=True)] if prev else busy
        self._prev_busy = busy
        metrics = step_metrics(
            result,
            step_wall_s=entry.wall_s,
            sync_s=sync_s,
            queue_stats=qstats,
            rollout_busy_delta_s=deltas,
            gen_window_s=entry.wall_s,
            counters=sum_counters([h.counters for h in health]),
        )
        if "reward/mean" in metrics:
            self.rewards.append(metrics["reward/mean"])
        alert = self.unscored_alarm.check(step, metrics["reward/unscored_ratio"])
        if alert is not None:
            self.sink.log_event(EventKind.ALERT, alert.message, alert.data)
        self.trained_uids.extend(result.uids)
        if step % self.cfg.logging.log_every == 0 or step == self.cfg.trainer.total_steps:
            self.sink.log_metrics(step, metrics)
        if result.examples:
            self.sink.log_samples(step, [e.to_dict() for e in result.examples])

    # --- checkpoint / resume -------------------------------------------------------------------------------
    def _checkpoint(self, step: int) -> None:
        directory = self.placement.checkpoint_dir
        if not directory:
            return
        t0 = time.monotonic()
        try:
            self._finish_sync()
            with self.pauses.held("checkpoint pause") as states:
                qsnap: QueueSnapshot = self.waiter.wait_one(self.queue.snapshot.remote(), "checkpoint")
                extra = ckpt.pipeline_extra(step, qsnap, states)
                path = ckpt.checkpoint_path(directory, step)
                size = self.waiter.wait_one(
                    self.trainer.save_checkpoint.remote(str(path), extra), "checkpoint"
                )
        except StopWaitAbandoned as exc:
            self.sink.log_event(EventKind.ALERT, f"checkpoint at step {step} skipped: {exc}", {"step": step})
            return
        self.grace.checkpoint_s = time.monotonic() - t0
        self.last_ckpt, self.last_ckpt_step = str(path), step
        pruned = ckpt.prune(directory, self.cfg.trainer.keep_checkpoints)
        self.sink.log_event(
            EventKind.CHECKPOINT,
            f"checkpoint at step {step}",
            # pruned: the checkpoints this one replaced (removed from disk: nothing to export or fork)
            {"step": step, "path": str(path), "size_bytes": int(size), "pruned": [str(p) for p in pruned]},
        )
        if not self.stop.is_set():
            self._report_grace()

    def _maybe_resume(self) -> None:
        src = self.placement.resume_from
        if not src:
            return
        extra = self.waiter.wait_one(self.trainer.load_checkpoint.remote(src), "resume")
        qstate, rstates = ckpt.restore_parts(extra, len(self.rollouters))
        self.waiter.wait_all(
            [self.queue.restore.remote(qstate)]
            + [r.restore.remote(s) for r, s in zip(self.rollouters, rstates, strict=True)],
            "resume",
        )
        self.start_step = self.step = ray.get(self.trainer.get_version.remote())
        self._sync(self.step)  # rollouters start from the checkpointed weights
        self.sink.log_event(
            EventKind.STATUS,
            f"resumed from {src} at step {self.step}",
            {"step": self.step, "path": src, "queued": len(qstate.groups)},
        )

    # --- teardown --------------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop rollouters (report what is in flight), then kill every actor of this run."""
        if not self.actors:
            return
        with contextlib.suppress(Exception):
            ready, _ = ray.wait(
                [r.stop.remote(2.0) for r in self.rollouters], num_returns=len(self.rollouters), timeout=5.0
            )
            stops: list[RolloutStopped] = [ray.get(x) for x in ready]
            self.final.in_flight = sum(s.in_flight for s in stops)
        with contextlib.suppress(Exception):
            self.final.queue = ray.get(self.queue.stats.remote(), timeout=5.0)
            self.final.dropped_uids = ray.get(self.queue.dropped_uids.remote(), timeout=5.0)
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        self.trainer_group.release()  # and its placement group
        self.actors = []

    def _summary(self) -> RunSummary:
        self.shutdown()
        # the queue's stats are missing only when it did not answer at shutdown: report zeros
        q = self.final.queue or QueueStats(0, 0, 0, 0, 0, 0, None)
        tail = self.rewards[-5:]
        return RunSummary(
            steps_done=self.step,
            start_step=self.start_step,
            samples_trained=q.consumed,
            final_reward_mean=sum(tail) / len(tail) if tail else None,
            wall_time_s=time.monotonic() - self.t_start,
            stopped=self.stopped,
            last_checkpoint=self.last_ckpt,
            dropped_stale=q.dropped_stale,
            queued=q.queued,
            in_flight=self.final.in_flight,
            admitted=q.admitted,
            max_queued=q.max_depth,
            sync_times_s=[s.total_s for s in self.syncer.history],
            trained_uids=self.trained_uids,
            dropped_uids=list(self.final.dropped_uids),
        )
