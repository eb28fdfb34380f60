"""Held-out evaluation inside the pipeline, with the real HF worker and PolicyTrainer on the tiny model.

* The run reports ``val/`` metrics at the configured steps (before training, every N steps, at the end),
  on the weights of that step, while training goes on: the evaluation requested at step 2 cannot finish
  (its scoring waits on a gate, ``gated_reward.py``) before the driver has logged the last training
  step, and with ``staleness_threshold = 0`` those steps need samples generated during the evaluation.
* A stop does not wait for a running evaluation.
* On the Rollouter itself: a training call runs between evaluation chunks, a weight update lands between
  chunks (never inside one), and ``cancel_evaluation`` ends an evaluation mid-chunk.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from rl_engine.config import apply_overrides, parse_config
from rl_engine.jobspec import Placement
from rl_engine.pipeline import run_experiment
from rl_engine.pipeline.components import Components, Factory
from rl_engine.pipeline.knobs import knobs_from_config
from rl_engine.pipeline.queue import MessageQueue
from rl_engine.pipeline.rollouter import Rollouter
from rl_engine.presets import get_preset
from tests.pipeline.conftest import RecordingSink
from tests.pipeline.gated_reward import open_gate

pytestmark = pytest.mark.timeout(300)
_WAIT_S = 120.0  # generous bounds for a shared machine; nothing below is timed


def _cfg(model_dir: Path, *overrides: str):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    return parse_config(apply_overrides(data, [
        f"model.path={model_dir}", "rollout.n=4", "trainer.batch_size=16", "trainer.mini_batch_size=16",
        "data.num_validation_prompts=8", "eval.prompts_per_call=4", "logging.sinks=[]", "logging.log_every=1",
        *overrides]))  # fmt: skip


def _gated(tmp_path: Path) -> tuple[Components, Path]:
    gate = tmp_path / "gate"
    reward = Factory("tests.pipeline.gated_reward:gated_reward", {"gate": str(gate), "version": 2})
    return Components(reward=reward, prepare=None), gate


class _AtStep(RecordingSink):
    """Calls ``action`` once the training metrics of ``step`` are logged."""

    def __init__(self, step: int, action: Any) -> None:
        super().__init__()
        self.at, self.action = step, action

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        super().log_metrics(step, metrics)
        if "reward/mean" in metrics and step >= self.at:
            self.action()


def _val(sink: RecordingSink) -> dict[int, dict[str, float]]:
    return {s: m for s, m in sink.metrics if any(k.startswith("val/") for k in m)}


def test_val_metrics_arrive_at_their_steps_while_training_goes_on(ray_session, tiny_dir, tmp_path):
    components, gate = _gated(tmp_path)
    sink = _AtStep(4, lambda: open_gate(gate))
    cfg = _cfg(tiny_dir, "trainer.total_steps=4", "pipeline.staleness_threshold=0", "eval.every=2",
               "eval.before_training=true", "eval.at_end=true")  # fmt: skip
    summary = run_experiment(cfg, sink, components=components)
    assert summary.steps_done == 4 and not summary.stopped

    order = [(s, "val" if any(k.startswith("val/") for k in m) else "train") for s, m in sink.metrics]
    # the evaluation of step 2 finished only after the last training step was logged: the driver did
    # not wait for it, and the rollouter generated steps 3 and 4 while it ran (staleness 0: they need
    # batches generated on weights 2 and 3)
    assert order == [
        (0, "val"),
        (1, "train"),
        (2, "train"),
        (3, "train"),
        (4, "train"),
        (2, "val"),
        (4, "val"),
    ]
    val = _val(sink)
    for step, m in val.items():
        assert m["val/param_version"] == step, m  # the weights of the step it was requested for
        assert m["val/num_prompts"] == 8 and m["val/aborted_ratio"] == 0 and m["val/reward_errors"] == 0
        assert 0.0 <= m["val/reward_mean"] <= 1.0 and 0.0 <= m["val/pass@1"] <= 1.0
        assert 1.0 <= m["val/response_length"] <= 2.0  # rollout.max_new_tokens = 2
    assert val[0]["val/param_version_end"] == 0 and val[4]["val/param_version_end"] == 4
    logs = [e[1] for e in sink.kinds("log")]
    assert [m.split(":")[0] for m in logs if m.startswith("evaluation")] == [
        "evaluation at step 0", "evaluation at step 2", "evaluation at step 4"]  # fmt: skip

    # the data stream's and the reward's counters are in every step's metrics
    train = [m for _, m in sink.metrics if "reward/mean" in m]
    calls = [m["reward/calls"] for m in train]
    assert calls == sorted(calls) and calls[-1] >= 4 * 16
    assert all(
        m["reward/errors"] == 0 and m["data/overlong_prompts"] == 0 and m["data/epoch"] == 0 for m in train
    )


def test_a_stop_does_not_wait_for_a_running_evaluation(ray_session, tiny_dir, tmp_path):
    components, _gate = _gated(tmp_path)  # never opened: the evaluation of step 2 cannot finish
    stop = threading.Event()
    sink = _AtStep(3, stop.set)
    cfg = _cfg(tiny_dir, "trainer.total_steps=20", "eval.every=2", "eval.at_end=true")
    placement = Placement(checkpoint_dir=str(tmp_path / "ck"))
    summary = run_experiment(cfg, sink, placement=placement, stop_event=stop, components=components)
    assert summary.stopped and summary.last_checkpoint  # the final checkpoint was still written
    assert not _val(sink)  # neither awaited (it would finish when the gate gives up) nor evaluated at the end
    assert any(
        e[1] == "evaluation requested at step 2 cancelled: the run is stopping" for e in sink.kinds("log")
    )
    assert sink.kinds("status")[-1][1] == f"stopped at step {summary.steps_done}"


# --- the Rollouter alone (in this process, real MessageQueue actor) ----------------------------------------
def _rollouter(tiny_dir: Path) -> tuple[Rollouter, Any, list[tuple[str, str]]]:
    """Rollouter 0 with a record of its worker's calls: (kind, "start" | "end"), kind = eval / train / update."""
    cfg = _cfg(tiny_dir, "eval.every=1", "rollout.n=2", "trainer.batch_size=4", "trainer.mini_batch_size=4",
               "pipeline.prompts_per_call=1", "pipeline.staleness_threshold=1000", "eval.prompts_per_call=2")  # fmt: skip
    knobs = knobs_from_config(cfg)
    queue = ray.remote(MessageQueue).options(num_cpus=0).remote(knobs, 0)  # admission never closes here
    r = Rollouter(cfg, knobs, 0, 1, queue, Components(prepare=None))
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    worker = r.worker

    def recorded(fn: Any, kind_of: Any) -> Any:
        def call(*args: Any) -> Any:
            kind = kind_of(*args)
            with lock:
                log.append((kind, "start"))
            try:
                return fn(*args)
            finally:
                with lock:
                    log.append((kind, "end"))

        return call

    worker.generate = recorded(worker.generate, lambda p, n: "eval" if p[0].uid.startswith("v") else "train")
    worker.resume = recorded(worker.resume, lambda s: "eval" if s[0].prompt_uid.startswith("v") else "train")
    worker.update_weights = recorded(worker.update_weights, lambda w, v: "update")
    return r, queue, log


def _until(cond: Any) -> None:
    deadline = time.monotonic() + _WAIT_S
    while not cond():
        assert time.monotonic() < deadline, "condition never met"
        time.sleep(0.005)


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(result=fn()), daemon=True)
    t.start()
    return t, out


def test_training_calls_and_a_weight_update_land_between_evaluation_chunks(ray_session, tiny_dir):
    r, queue, log = _rollouter(tiny_dir)
    weights = ray.put({k: v.detach().numpy().copy() for k, v in r.worker.model.named_parameters()})
    try:
        r.start()
        first_chunk = threading.Event()
        generate = r.worker.generate

        def eval_generate(prompts: Any, n: int) -> Any:
            if prompts[0].uid == "v0":  # chunk 1 goes on once the update waits for the worker
                first_chunk.set()
                _until(lambda: len(r._worker_turns) == 2)
            return generate(prompts, n)

        r.worker.generate = eval_generate
        t, out = _in_thread(lambda: r.evaluate(1, 0))
        assert first_chunk.wait(_WAIT_S)
        r.update_weights([weights], 1)  # arrives while chunk 1 runs
        t.join(_WAIT_S)
        assert not t.is_alive() and r._error is None
    finally:
        r.stop(timeout_s=20.0)
        ray.get(queue.close.remote())
    m = out["result"]
    assert m.num_prompts == 8 and m.aborted_ratio == 0
    assert (m.param_version, m.param_version_end) == (0, 1)  # the update came between chunks
    # the worker is exclusive: nothing starts or ends inside an evaluation chunk
    chunks = [i for i, e in enumerate(log) if e == ("eval", "start")]
    assert len(chunks) == 4
    for i in chunks:
        assert log[i + 1] == ("eval", "end"), log
    assert ("update", "start") in log[chunks[0] + 2 : chunks[1]], log
    # and between any two chunks the loop ran a training call
    for a, b in itertools.pairwise(chunks):
        assert ("train", "start") in log[a + 2 : b], log


def test_cancel_evaluation_ends_it_mid_chunk_and_training_goes_on(ray_session, tiny_dir):
    r, queue, log = _rollouter(tiny_dir)
    try:
        r.start()
        chunk_started = threading.Event()
        generate = r.worker.generate

        def slow_eval_generate(prompts: Any, n: int) -> Any:
            if prompts[0].uid.startswith("v"):
                chunk_started.set()
                assert r.worker._interrupt.wait(_WAIT_S), "cancel_evaluation did not interrupt the chunk"
            return generate(prompts, n)

        r.worker.generate = slow_eval_generate
        t, out = _in_thread(lambda: r.evaluate(1, 0))
        assert chunk_started.wait(_WAIT_S)
        r.cancel_evaluation()
        t.join(_WAIT_S)
        assert not t.is_alive() and out["result"] is None
        assert not r.worker.interrupted  # cleared when the chunk gave the worker back
        trained = log.count(("train", "end"))
        _until(lambda: log.count(("train", "end")) >= trained + 2 or r._error)
        assert r._error is None, r._error
        assert r.evaluate(2, 0) is None  # cancelled for good: the run is stopping
    finally:
        r.stop(timeout_s=20.0)
        ray.get(queue.close.remote())
    assert log.count(("eval", "start")) == 1


def test_a_cancel_reaches_an_evaluation_waiting_for_a_stuck_training_call(ray_session, tiny_dir):
    r, queue, log = _rollouter(tiny_dir)
    stuck, release = threading.Event(), threading.Event()
    generate = r.worker.generate

    def stuck_train_generate(prompts: Any, n: int) -> Any:
        if not prompts[0].uid.startswith("v"):
            stuck.set()
            assert release.wait(3 * _WAIT_S)  # stuck well past the test's waits
        return generate(prompts, n)

    r.worker.generate = stuck_train_generate
    try:
        r.start()
        assert stuck.wait(_WAIT_S)
        t, out = _in_thread(lambda: r.evaluate(1, 0))
        _until(lambda: r._hold == 1)  # the chunk waits for the stuck call (it may not interrupt it)
        r.cancel_evaluation()
        t.join(_WAIT_S)
        assert not t.is_alive() and out["result"] is None
        assert r._hold == 0 and not r._worker_turns  # the section is free for a pause or an update
    finally:
        release.set()
        r.stop(timeout_s=20.0)
        ray.get(queue.close.remote())
    assert ("eval", "start") not in log
