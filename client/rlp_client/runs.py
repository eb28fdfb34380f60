"""A run handle: its latest snapshot (``info``) and what can be done with it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from rlp_client.live import LiveStream
from rlp_client.models import (
    FINAL_STATES,
    Checkpoint,
    CheckpointExport,
    Event,
    MetricPoint,
    MetricSeries,
    RunInfo,
    Sample,
)

if TYPE_CHECKING:
    from rlp_client.transport import Transport


class HasTransport(Protocol):
    """What a run needs of its client (a :class:`rlp_client.client.Client`): its transport."""

    transport: Transport


class Run:
    """One run. ``info`` is the last snapshot read; :meth:`refresh` reads it again."""

    def __init__(self, client: HasTransport, info: RunInfo) -> None:
        self.client = client
        self.info = info

    def __repr__(self) -> str:
        return f"Run(id={self.id}, state={self.state!r}, experiment={self.info.experiment_name!r})"

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def _path(self) -> str:
        return f"/api/runs/{self.id}"

    def refresh(self) -> Run:
        """Read the run again; returns self."""
        self.info = RunInfo.from_api(self.client.transport.get(self._path))
        return self

    # --- lifecycle -------------------------------------------------------------------------------------

    def cancel(self) -> Run:
        """Ask the platform to stop the run (queued: cancelled at once; running: ``cancelling``).
        Raises :class:`~rlp_client.errors.Conflict` if it already finished."""
        self.info = RunInfo.from_api(self.client.transport.post(f"{self._path}/cancel"))
        return self

    def resume(self, priority: int | None = None) -> Run:
        """A new run of the same experiment continuing from this run's latest checkpoint."""
        body = {"priority": priority} if priority is not None else {}
        return Run(self.client, RunInfo.from_api(self.client.transport.post(f"{self._path}/resume", body)))

    def fork(
        self,
        checkpoint: int | None = None,
        config_overrides: dict[str, Any] | None = None,
        priority: int | None = None,
    ) -> Run:
        """A new run of the same experiment from one of this run's checkpoints (an id; default its
        latest) with this run's config and ``config_overrides`` (a nested partial config, e.g.
        ``{"trainer": {"lr": 5e-7}}``) merged in. Raises :class:`~rlp_client.errors.BadRequest` naming
        the field (``config_overrides.trainer.lr``, ``checkpoint``) or ``Conflict`` (the run is active)."""
        body: dict[str, Any] = {"config_overrides": config_overrides or {}}
        if checkpoint is not None:
            body["checkpoint"] = checkpoint
        if priority is not None:
            body["priority"] = priority
        return Run(self.client, RunInfo.from_api(self.client.transport.post(f"{self._path}/fork", body)))

    def wait(self, timeout_s: float | None = None, poll_s: float = 2.0) -> str:
        """Block until the run is in a final state and return it (``succeeded``, ``failed`` or
        ``cancelled``). Raises ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.refresh().info.is_final:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {self.id} still {self.state} after {timeout_s} s")
            time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))
        return self.state

    def follow(self, last_seq: int = 0, **options: Any) -> LiveStream:
        """Events and metric points as they are stored, each exactly once, until the run ends; reconnects
        after a disconnect (see :mod:`rlp_client.live`). Iterate the returned stream; ``stream.state``
        tells the run's state, the last event's seq and the reconnect count."""
        return LiveStream(self.client.transport, self.id, last_seq=last_seq, **options)

    # --- what it produced ------------------------------------------------------------------------------

    def metric_keys(self) -> list[str]:
        return list(self.client.transport.get(f"{self._path}/metrics/keys")["keys"])

    def metrics(
        self,
        keys: Iterable[str] | None = None,
        *,
        step_min: int | None = None,
        step_max: int | None = None,
        max_points: int | None = None,
    ) -> list[MetricSeries]:
        """Series per key, downsampled to ``max_points`` per key (server default 2000)."""
        params = {"keys": ",".join(keys) if keys else None, "step_min": step_min, "step_max": step_max,
                  "max_points": max_points}  # fmt: skip
        body = self.client.transport.get(f"{self._path}/metrics", params)
        return [MetricSeries.from_api(s) for s in body["series"]]

    def metric_points(self, keys: Iterable[str] | None = None) -> list[MetricPoint]:
        """Every stored point (never downsampled), in the export's order."""
        params = {"keys": ",".join(keys) if keys else None}
        body = self.client.transport.get(f"{self._path}/metrics/export/json", params)
        return [
            MetricPoint(p["key"], int(p["step"]), float(p["value"]), float(p["wall_time"]))
            for p in body["points"]
        ]

    def metrics_csv(self, keys: Iterable[str] | None = None) -> str:
        """Every stored point as CSV (``key,step,value,wall_time``), as the server writes it."""
        params = {"keys": ",".join(keys) if keys else None}
        return self.client.transport.request("GET", f"{self._path}/metrics/export/csv", params=params).text

    def events(self, after: int = 0, kinds: Iterable[str] | None = None) -> Iterator[Event]:
        """Every stored event after ``after``, in seq order (pages of 500 followed for you)."""
        params: dict[str, Any] = {"after": after, "limit": 500, "kind": ",".join(kinds) if kinds else None}
        while True:
            body = self.client.transport.get(f"{self._path}/events", params)
            events = body.get("events") or []
            yield from (Event.from_api(e) for e in events)
            if len(events) < 500:
                return
            params["after"] = body["last_seq"]

    def checkpoints(self) -> list[Checkpoint]:
        return [Checkpoint.from_api(c) for c in self.client.transport.get(f"{self._path}/checkpoints")]

    def samples(self, step: int | None = None, limit: int = 200) -> list[Sample]:
        body = self.client.transport.get(f"{self._path}/samples", {"step": step, "limit": limit})
        return [Sample.from_api(s) for s in body]

    def export_checkpoint(self, step: int) -> CheckpointExport:
        """Start (or join) the export of the checkpoint at ``step`` to a Hugging Face model directory."""
        return CheckpointExport.from_api(
            self.client.transport.post(f"{self._path}/checkpoints/{step}/export")
        )

    def exports(self) -> list[CheckpointExport]:
        return [CheckpointExport.from_api(e) for e in self.client.transport.get(f"{self._path}/exports")]


__all__ = ["FINAL_STATES", "Run"]
