"""The ingestion wire format: what the engine's HTTP sink posts to the platform, what the platform
accepts and what it answers (docs/api.md, "Ingestion"). One definition for both sides: the sink
(``rl_engine/sinks/http.py``) builds its bodies with the builders below, the platform's ingestion API
(``platform/tracking/api.py``) validates requests with the models and documents them in its OpenAPI
document from the same models. Pydantic only: no torch, ray or Django (a test checks it).

Also the messages of a run's live stream (the platform's websocket, docs/dashboard.md), described once
at the end: the platform's tracking services publish them and its consumer sends them, both through
the builders there.

Validation is fast on 5000-point batches (a point is a TypedDict: pydantic-core validates them without
a Python call each), and errors carry field paths like ``points[3].value``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal, NotRequired, TypeVar

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from typing_extensions import TypedDict

from rl_engine.config import validation_errors

# a multi-turn episode's sample (SampleIn.turns): at most MAX_SAMPLE_TURNS turns of MAX_TURN_TEXT characters
from rl_engine.types import MAX_SAMPLE_TURNS, MAX_TURN_TEXT

# Per request; a larger batch is refused with 413 before it is validated.
MAX_POINTS_PER_BATCH = 5000
MAX_EVENTS_PER_BATCH = 1000
MAX_SAMPLES_PER_BATCH = 1000
MAX_STEP = 2**62  # steps and sizes are stored as 64-bit integers
MAX_VERSION = 2**31 - 1
MAX_TEXT = 100_000  # characters of a message, prompt, response or answer
MAX_REWARD_PARTS = 32  # a sample's reward components (SampleIn.reward_parts)
MAX_REWARD_PART_KEY = 200  # characters of a component's label

# The paths of the ingestion endpoints under ``{platform}/api/runs/{run_id}/``.
METRICS, EVENTS, SAMPLES, HEARTBEAT = "metrics", "events", "samples", "heartbeat"
ITEMS = {METRICS: "points", EVENTS: "events", SAMPLES: "samples"}  # the list each body carries


class EventKind(StrEnum):
    LOG = "log"
    STATUS = "status"
    ALERT = "alert"
    CHECKPOINT = "checkpoint"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


# A TypedDict, not a model: 5000 points validate in pydantic-core without a Python call each, and the
# sink builds one as a plain dict. (Docstrings of the models here are their descriptions in the
# platform's OpenAPI document.)
class PointIn(TypedDict):
    """One metric point."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    key: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    step: Annotated[int, Field(ge=0, le=MAX_STEP)]
    value: Annotated[float, Field(allow_inf_nan=False, description="Finite.")]
    wall_time: Annotated[float, Field(allow_inf_nan=False, description="Unix seconds. Finite.")]


class EventIn(_Wire):
    kind: EventKind
    message: str = Field("", max_length=MAX_TEXT)
    data: dict[str, Any] = Field(
        default_factory=dict,
        description="Free-form JSON (rl_engine.safe_json): finite numbers, valid Unicode, no NUL, at most "
        "64 levels deep; anything else is a 400 naming the field.",
    )


class TurnIn(_Wire):
    """One turn of a multi-turn episode: the policy's (`assistant`) or the environment's message (`user`,
    `tool`)."""

    role: Literal["assistant", "user", "tool"]
    text: str = Field(max_length=MAX_TURN_TEXT)
    tokens: int = Field(ge=0, le=MAX_VERSION, description="Tokens of the turn in the episode's sequence.")
    logprob_mean: float | None = Field(
        None,
        description="A policy turn's mean behaviour log-prob per token; finite. None for the environment's.",
    )

    @field_validator("logprob_mean")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class SampleIn(_Wire):
    """One example. `param_version_start` and `param_version_end` (the engine's names of the weights'
    versions) are accepted for `version_start` and `version_end`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    step: int | None = Field(None, ge=0, le=MAX_STEP, description="Defaults to the body's step.")
    prompt: str = Field(max_length=MAX_TEXT)
    response: str = Field(max_length=MAX_TEXT)
    answer: str | None = Field(None, max_length=MAX_TEXT)
    reward: float | None = Field(None, description="Finite.")
    version_start: int | None = Field(
        None, ge=0, le=MAX_VERSION, validation_alias=AliasChoices("version_start", "param_version_start")
    )
    version_end: int | None = Field(
        None, ge=0, le=MAX_VERSION, validation_alias=AliasChoices("version_end", "param_version_end")
    )
    reward_parts: (
        dict[Annotated[str, StringConstraints(min_length=1, max_length=MAX_REWARD_PART_KEY)], float] | None
    ) = Field(
        None,
        max_length=MAX_REWARD_PARTS,
        description=(
            "Each reward component's score (a `reward.combine` label, or a plugin's `<name>/<figure>`): "
            f"at most {MAX_REWARD_PARTS} keys of at most {MAX_REWARD_PART_KEY} characters, finite values."
        ),
    )
    turns: list[TurnIn] | None = Field(
        None,
        max_length=MAX_SAMPLE_TURNS,
        description=(
            "A multi-turn episode's turns in order: the policy's and the environment's messages, at most "
            f"{MAX_SAMPLE_TURNS} of at most {MAX_TURN_TEXT} characters each."
        ),
    )

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("reward_parts")
    @classmethod
    def _finite_parts(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, value in (v or {}).items():
            if not math.isfinite(value):
                raise ValueError(f"{key!r}: must be a finite number")
        return v


class CheckpointData(BaseModel):
    """What a ``checkpoint`` event's data must hold for the platform to record the checkpoint (other
    keys are kept as they are). Strict integers: ``"12"`` or ``12.5`` is a mistake, not a step."""

    model_config = ConfigDict(extra="allow")
    step: Annotated[int, Field(strict=True, ge=0, le=MAX_STEP)]
    path: Annotated[str, StringConstraints(min_length=1, max_length=1000)]
    size_bytes: Annotated[int, Field(strict=True, ge=0, le=MAX_STEP)] | None = None
    pruned: list[Annotated[str, StringConstraints(min_length=1, max_length=1000)]] | None = Field(
        None, max_length=1000, description="Checkpoints of this run the engine removed for this one."
    )


CHECKPOINT_KEYS = frozenset({"step", "path", "size_bytes", "pruned"})


class StopGraceData(BaseModel):
    """A ``status`` event whose data holds ``stop_grace_s``: how long the engine says a graceful stop of
    the run needs (rl_engine.pipeline.stop_grace); the platform waits that long, within its maximum."""

    model_config = ConfigDict(extra="allow")
    stop_grace_s: Annotated[float, Field(strict=True, gt=0, le=86400, allow_inf_nan=False)]


STOP_GRACE_KEY = "stop_grace_s"
# Only the platform's own status events (a run's state changes) say which state a run entered; the
# dashboard's state badge follows them. Reported status events are informational.
RESERVED_STATUS_KEYS = ("from", "to")
# ``data.source`` values the platform's own events carry (the launcher's notes, export notices): a
# reported event may not pose as one (nothing reads them back, but a page shows them as the platform's).
RESERVED_SOURCES = frozenset({"export", "launcher", "platform"})

# Optional on event and sample batches: a re-sent batch with the same id is not stored twice.
BatchId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$"),
    Field(description="Optional id of this batch: a re-sent batch is not stored twice."),
]


class MetricsBody(_Wire):
    points: list[PointIn] = Field(
        max_length=MAX_POINTS_PER_BATCH,
        description=f"At most {MAX_POINTS_PER_BATCH} points (larger: 413).",
    )


class EventsBody(_Wire):
    events: list[EventIn] = Field(
        max_length=MAX_EVENTS_PER_BATCH, description=f"At most {MAX_EVENTS_PER_BATCH} events."
    )
    batch_id: BatchId | None = None


class SamplesBody(_Wire):
    step: int | None = Field(None, ge=0, le=MAX_STEP, description="Step of the samples that name none.")
    samples: list[SampleIn] = Field(
        max_length=MAX_SAMPLES_PER_BATCH, description=f"At most {MAX_SAMPLES_PER_BATCH} samples."
    )
    batch_id: BatchId | None = None

    @model_validator(mode="after")
    def _every_sample_has_a_step(self) -> SamplesBody:
        for i, sample in enumerate(self.samples):
            if sample.step is None:
                if self.step is None:
                    raise ValueError(f"samples[{i}] has no step and the body names none")
                sample.step = self.step
        return self


# Per endpoint: its body and the most items one request may carry.
BODIES: dict[str, type[BaseModel]] = {METRICS: MetricsBody, EVENTS: EventsBody, SAMPLES: SamplesBody}
LIMITS = {METRICS: MAX_POINTS_PER_BATCH, EVENTS: MAX_EVENTS_PER_BATCH, SAMPLES: MAX_SAMPLES_PER_BATCH}


# --- the platform's answers ----------------------------------------------------------------------------


class MetricsReply(BaseModel):
    received: int
    inserted: int = Field(description="New points; a retried batch inserts 0 (first value wins).")


class EventsReply(BaseModel):
    received: int
    last_seq: int | None = Field(description="Sequence number of the last event stored (none: no event).")


class SamplesReply(BaseModel):
    received: int
    stored: int = Field(description="Samples beyond the per-step cap are dropped.")


class HeartbeatReply(BaseModel):
    active: bool = Field(description="False: the run is no longer active; the engine should stop.")
    state: str = Field(description="The run's state.")


# --- builders (the engine's side) ------------------------------------------------------------------------
# They shape, they do not validate: the platform does, and what it refuses the sink keeps and reports
# (an engine must not die of a malformed log line).

# The engine's names of a sample's fields that the wire spells differently.
ENGINE_SAMPLE_NAMES = {"param_version_start": "version_start", "param_version_end": "version_end"}


def point(key: str, step: int, value: float, wall_time: float) -> PointIn:
    return PointIn(key=key, step=step, value=value, wall_time=wall_time)


def event(kind: EventKind, message: str, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An :class:`EventIn` as JSON."""
    return {"kind": str(kind), "message": message, "data": dict(data or {})}


def sample(fields: Mapping[str, Any], step: int) -> dict[str, Any]:
    """A :class:`SampleIn` as JSON from an engine sample's fields (renamed per ``ENGINE_SAMPLE_NAMES``;
    other fields as they are)."""
    return {**{ENGINE_SAMPLE_NAMES.get(k, k): v for k, v in fields.items()}, "step": int(step)}


# --- validation (the platform's side) ---------------------------------------------------------------------


def event_data_errors(events: list[EventIn]) -> dict[str, list[str]]:
    """Errors in the ``data`` of reported events, by field path (``events[2].data.step``)."""
    out: dict[str, list[str]] = {}
    for i, ev in enumerate(events):
        if ev.kind == EventKind.CHECKPOINT and CHECKPOINT_KEYS & ev.data.keys():
            try:
                CheckpointData.model_validate(ev.data)
            except ValidationError as exc:
                for path, msg in validation_errors(exc, CheckpointData):
                    out.setdefault(f"events[{i}].data.{path}", []).append(msg)
        source = ev.data.get("source")
        if isinstance(source, str) and source.strip().lower() in RESERVED_SOURCES:
            out.setdefault(f"events[{i}].data.source", []).append(
                f"{source!r} is reserved for the platform's own events (one of "
                f"{', '.join(sorted(RESERVED_SOURCES))}): use another source"
            )
        if ev.kind == EventKind.STATUS and STOP_GRACE_KEY in ev.data:
            try:
                StopGraceData.model_validate(ev.data)
            except ValidationError as exc:
                for path, msg in validation_errors(exc, StopGraceData):
                    out.setdefault(f"events[{i}].data.{path}", []).append(msg)
        if ev.kind == EventKind.STATUS:
            for key in RESERVED_STATUS_KEYS:
                if key in ev.data:
                    out.setdefault(f"events[{i}].data.{key}", []).append(
                        "is reserved for the platform's own state changes: reported status events are "
                        "informational (rename the key)"
                    )
    return out


M = TypeVar("M", bound=BaseModel)


class WireError(Exception):
    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__(str(errors))


def parse(model: type[M], data: Any) -> M:
    """Validate a parsed JSON body; raises WireError({"points[3].value": ["..."]})."""
    if not isinstance(data, dict):
        raise WireError({"body": [f"must be a JSON object, got {type(data).__name__}"]})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        out: dict[str, list[str]] = {}
        for path, msg in validation_errors(exc, model)[:50]:  # a 5000-point garbage batch needs no 5000 lines
            out.setdefault(path or "body", []).append(msg)
        raise WireError(out) from None


def batch_length(data: Any, field: str) -> int | None:
    """Length of the list under ``field`` before full validation (to answer 413 cheaply)."""
    if isinstance(data, dict) and isinstance(data.get(field), list):
        return len(data[field])
    return None


# --- the live stream (the platform's websocket ws/runs/<id>/) ---------------------------------------------
# Server -> client messages, by their ``kind``. TypedDicts: a message is the plain dict the consumer
# sends as JSON (and the live bus carries as an envelope's text); tests validate what the
# consumer sends against ``LiveMessage``. The builders below are the only place these dicts are made.


class LiveKind(StrEnum):
    HELLO = "hello"  # first message of a connection: the run's summary
    EVENT = "event"  # one stored event (catch-up from the database, or live)
    METRICS = "metrics"  # stored metric points, columnar per key
    ERROR = "error"  # the client sent something the stream does not understand
    ALERT = "alert"  # an alert of the platform's about the run was opened, repeated or resolved


class _Live(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]


class LiveSeries(_Live):
    """One key's points, in step order for a live batch (database order for a poll's)."""

    steps: list[int]
    values: list[float]
    wall_times: list[float]


class LiveEventOut(_Live):
    seq: int
    kind: EventKind
    message: str
    data: dict[str, Any]
    created: str  # ISO 8601


class HelloMessage(_Live):
    kind: Literal[LiveKind.HELLO]
    run: dict[str, Any]  # the run's summary, as GET /api/runs/<id> has it


class EventMessage(_Live):
    kind: Literal[LiveKind.EVENT]
    event: LiveEventOut


class MetricsMessage(_Live):
    kind: Literal[LiveKind.METRICS]
    count: int  # points in the message
    series: dict[str, LiveSeries]
    source: NotRequired[Literal["poll"]]  # read by the consumer's database poll (not published)


class ErrorMessage(_Live):
    kind: Literal[LiveKind.ERROR]
    message: str


class LiveAlertOut(_Live):
    """An alert the platform raised about the run (the platform's alerts app; GET /api/alerts)."""

    id: int
    kind: Literal["engine", "run_failed", "rule"]
    message: str
    first_seen: str  # ISO 8601
    last_seen: str
    count: int
    resolved_at: str | None


class AlertMessage(_Live):
    kind: Literal[LiveKind.ALERT]
    alert: LiveAlertOut


LiveMessage = Annotated[
    HelloMessage | EventMessage | MetricsMessage | ErrorMessage | AlertMessage, Field(discriminator="kind")
]

MetricRow = tuple[str, int, float, float]  # key, step, value, wall_time


def live_hello(run: dict[str, Any]) -> HelloMessage:
    return HelloMessage(kind=LiveKind.HELLO, run=run)


def live_event(*, seq: int, kind: str, message: str, data: dict[str, Any], created: str) -> EventMessage:
    """An event as the stream sends it; ``kind`` as stored (a string that names an ``EventKind``)."""
    event = LiveEventOut(seq=seq, kind=EventKind(kind), message=message, data=data, created=created)
    return EventMessage(kind=LiveKind.EVENT, event=event)


def live_metrics(rows: Iterable[MetricRow], *, source: Literal["poll"] | None = None) -> MetricsMessage:
    """Points as the stream sends them: columnar per key, each key's points in the order of ``rows``."""
    series: dict[str, LiveSeries] = {}
    count = 0
    for key, step, value, wall_time in rows:
        s = series.setdefault(key, LiveSeries(steps=[], values=[], wall_times=[]))
        s["steps"].append(step)
        s["values"].append(value)
        s["wall_times"].append(wall_time)
        count += 1
    out = MetricsMessage(kind=LiveKind.METRICS, count=count, series=series)
    if source is not None:
        out["source"] = source
    return out


def live_error(message: str) -> ErrorMessage:
    return ErrorMessage(kind=LiveKind.ERROR, message=message)


def live_alert(alert: LiveAlertOut) -> AlertMessage:
    return AlertMessage(kind=LiveKind.ALERT, alert=alert)
