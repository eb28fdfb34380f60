"""Typed objects of the API (read-only snapshots; ``raw`` keeps the full answer).

Runs are the one object with behaviour: :class:`rlp_client.runs.Run` wraps a :class:`RunInfo`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
ACTIVE_STATES = frozenset({"queued", "starting", "running", "cancelling"})


@dataclass(frozen=True)
class Project:
    id: int
    name: str
    description: str
    role: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Project:
        return cls(d["id"], d["name"], d.get("description", ""), d.get("role"), d)


@dataclass(frozen=True)
class NewToken:
    """A user token just created: ``secret`` is in this answer only (the platform keeps its hash)."""

    id: int
    name: str
    username: str | None
    expires_at: str | None
    secret: str = field(repr=False)
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> NewToken:
        return cls(d["id"], d["name"], d.get("username"), d.get("expires_at"), d["secret"], d)


@dataclass(frozen=True)
class Experiment:
    id: int
    project: int
    name: str
    description: str
    tags: list[str]
    config: dict[str, Any] | None  # absent from lists
    run_count: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Experiment:
        return cls(
            d["id"], d["project"], d["name"], d.get("description", ""), list(d.get("tags") or []),
            d.get("config"), d.get("run_count"), d,
        )  # fmt: skip


@dataclass(frozen=True)
class RunInfo:
    """One snapshot of a run as ``GET /api/runs/{id}`` returns it."""

    id: int
    experiment: int
    experiment_name: str
    project: int
    number: int
    state: str
    priority: int
    error: str
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    resumed_from: int | None
    config: dict[str, Any] | None  # absent from lists
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> RunInfo:
        return cls(
            d["id"], d["experiment"], d.get("experiment_name", ""), d["project"], d.get("number", 0),
            d["state"], d.get("priority", 0), d.get("error") or "", d.get("created_at"), d.get("started_at"),
            d.get("finished_at"), d.get("resumed_from"), d.get("config"), d,
        )  # fmt: skip


@dataclass(frozen=True)
class MetricPoint:
    """One stored metric value: unique per (run, key, step)."""

    key: str
    step: int
    value: float
    wall_time: float


@dataclass(frozen=True)
class MetricSeries:
    """One key's points as ``GET .../metrics`` returns them (``downsampled`` when cut to ``max_points``)."""

    key: str
    steps: list[int]
    values: list[float]
    wall_times: list[float]
    downsampled: bool = False

    def points(self) -> list[MetricPoint]:
        return [
            MetricPoint(self.key, s, v, w)
            for s, v, w in zip(self.steps, self.values, self.wall_times, strict=True)
        ]

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> MetricSeries:
        return cls(
            d["key"], list(d["steps"]), list(d["values"]), list(d["wall_times"]), bool(d.get("downsampled"))
        )


@dataclass(frozen=True)
class Event:
    """One run event; ``seq`` is 1, 2, ... without gaps per run."""

    seq: int
    kind: str  # log | status | alert | checkpoint
    message: str
    data: dict[str, Any]
    created: str | None

    @property
    def new_state(self) -> str | None:
        """For a platform status event, the state the run moved to."""
        to = self.data.get("to") if self.kind == "status" else None
        return to if isinstance(to, str) else None

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Event:
        return cls(
            int(d["seq"]), d["kind"], d.get("message", ""), dict(d.get("data") or {}), d.get("created")
        )


@dataclass(frozen=True)
class Checkpoint:
    id: int
    step: int
    path: str
    size_bytes: int | None
    created: str | None

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Checkpoint:
        return cls(d["id"], d["step"], d["path"], d.get("size_bytes"), d.get("created"))


@dataclass(frozen=True)
class Sample:
    step: int
    prompt: str
    response: str
    answer: str
    reward: float | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Sample:
        return cls(d.get("step", 0), d.get("prompt", ""), d.get("response", ""), d.get("answer", ""),
                   d.get("reward"), d)  # fmt: skip


@dataclass(frozen=True)
class CheckpointExport:
    """A checkpoint's export to a Hugging Face model directory (``POST .../checkpoints/{step}/export``)."""

    step: int
    state: str  # queued | running | succeeded | failed
    out: str
    error: str
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> CheckpointExport:
        return cls(d["step"], d["state"], d.get("out") or "", d.get("error") or "", d)


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep, as ``GET /api/sweeps/{id}`` ranks it (``rank`` None: no value yet)."""

    id: int
    number: int
    state: str
    index: int
    params: dict[str, Any]
    seed: int
    value: float | None
    rank: int | None
    early_stopped: bool

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> SweepRun:
        return cls(
            d["id"], d["number"], d["state"], d["index"], dict(d.get("params") or {}), d["seed"], d.get("value"),
            d.get("rank"), bool(d.get("early_stopped_at")),
        )  # fmt: skip


@dataclass(frozen=True)
class Sweep:
    """A sweep (``/api/sweeps``): a grid or random search over config fields of an experiment."""

    id: int
    project: int
    experiment: int
    name: str
    method: str
    state: str
    metric: str
    goal: str
    max_runs: int
    max_concurrent: int
    seed: int
    params: list[str]
    run_states: dict[str, int]
    ranked_by: str | None
    runs: list[SweepRun]  # ranked, best first (empty in lists)
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls, d: dict[str, Any]) -> Sweep:
        return cls(
            d["id"], d["project"], d["experiment"], d["name"], d["method"], d["state"], d["metric"], d["goal"],
            d["max_runs"], d["max_concurrent"], d["seed"], list(d.get("params") or []),
            dict(d.get("run_states") or {}), d.get("ranked_by"),
            [SweepRun.from_api(r) for r in d.get("runs") or []], d,
        )  # fmt: skip
