"""The engine side of benchmarks/live_load.py's ``sinks`` mode: runs in a process of its own (spawned
with the source tree under test first on its path, so an older commit brings its own sink).

Each of ``len(tokens)`` threads drives one real ``HttpSink`` the way the demo run logs: a step every
``step_s`` (30 keys), four samples every second, heartbeats as configured. Every request the sink
sends is timed (the sink's request observer; in an older tree, its own method wrapped): the first time a request carrying a step was sent is
that step's POST time. Returns, per run: the steps logged, their POST times, requests and failed
requests by endpoint, and the spool left undelivered after ``close``; under ``_cpu_s`` the CPU seconds
this process used.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from typing import Any

KEYS = 30


def _drive(sink_cls: type, url: str, token: str, run_id: int, spool: str, stop_at: float, step_s: float,
           out: dict[str, Any]) -> None:  # fmt: skip
    sent: dict[int, float] = {}
    counts: dict[str, int] = {}
    failed: dict[str, int] = {}

    def observe(endpoint: str, body: dict[str, Any], sent_at: float, error: BaseException | None) -> None:
        for p in body.get("points", ()):
            sent.setdefault(p["step"], sent_at)
        counts[endpoint] = counts.get(endpoint, 0) + 1
        if error is not None:
            kind = f"{endpoint}: {type(error).__name__} {str(error)[:80]}"
            failed[kind] = failed.get(kind, 0) + 1

    if "observer" in inspect.signature(sink_cls).parameters:
        sink = sink_cls(url, token, run_id, spool_dir=spool, observer=observe)
    else:  # a tree from before the sink had an observer (a side-by-side with an older commit)

        class TimedSink(sink_cls):  # type: ignore[misc,valid-type]
            def _post_once(self, *args: Any) -> Any:  # (endpoint, body, token), after it (pool, ...)
                endpoint, body, now = args[-3], args[-2], time.time()
                try:
                    answer = super()._post_once(*args)
                except Exception as exc:
                    observe(endpoint, body, now, exc)
                    raise
                observe(endpoint, body, now, None)
                return answer

        sink = TimedSink(url, token, run_id, spool_dir=spool)
    step, t0 = 0, time.monotonic()
    while time.monotonic() < stop_at:
        sink.log_metrics(step, {f"load/k{k:02d}": float((step * 31 + k) % 97) for k in range(KEYS)})
        if step % max(1, round(1 / step_s)) == 0:
            sink.log_samples(step, [{"prompt": f"q{step}.{i}", "response": "r" * 200, "reward": 1.0}
                                    for i in range(4)])  # fmt: skip
        step += 1
        time.sleep(max(0.0, t0 + step * step_s - time.monotonic()))
    sink.close()
    out[str(run_id)] = {
        "steps": step,
        "sent": sent,
        "requests": counts,
        "failed": failed,
        "undelivered_bytes": sink.backlog() if hasattr(sink, "backlog") else sink._spool_backlog(),
    }


def run_sinks(root: str, url: str, runs: list[int], tokens: list[str], seconds: float, step_s: float,
              spool: str) -> dict[str, Any]:  # fmt: skip
    """Drive one sink per run for ``seconds``; everything closed (drained) before it returns."""
    sys.path.insert(0, root)
    from rl_engine.sinks.http import HttpSink

    out: dict[str, Any] = {}
    cpu0 = time.process_time()
    stop_at = time.monotonic() + seconds
    threads = [threading.Thread(target=_drive, args=(HttpSink, url, tok, run, spool, stop_at, step_s, out))
               for run, tok in zip(runs, tokens, strict=True)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["_cpu_s"] = time.process_time() - cpu0  # this process's CPU: the load generator's own share
    return out
