"""The ingestion wire format (docs/api.md), validated with pydantic: fast on 5000-point batches, and
errors carry field paths like ``points[3].value``.

DRF serializers describe the same shapes for the OpenAPI document (tracking/serializers.py).
"""

from __future__ import annotations

import math
from typing import Annotated, Any

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
from tracking.models import EventKind
from tracking.services import MAX_EVENTS_PER_BATCH, MAX_POINTS_PER_BATCH, MAX_SAMPLES_PER_BATCH

MAX_STEP = 2**62


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PointIn(TypedDict):
    """A TypedDict, not a model: 5000 of them validate in pydantic-core without a Python call each."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    key: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    step: Annotated[int, Field(ge=0, le=MAX_STEP)]
    value: Annotated[float, Field(allow_inf_nan=False)]
    wall_time: Annotated[float, Field(allow_inf_nan=False)]


class EventIn(_Wire):
    kind: EventKind
    message: str = Field("", max_length=100_000)
    data: dict[str, Any] = Field(default_factory=dict)


class SampleIn(_Wire):
    """One example. The engine's names ``param_version_start/_end`` are accepted as aliases."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    step: int | None = Field(None, ge=0, le=MAX_STEP, description="Defaults to the body's step.")
    prompt: str = Field(max_length=100_000)
    response: str = Field(max_length=100_000)
    answer: str | None = Field(None, max_length=100_000)
    reward: float | None = None
    version_start: int | None = Field(
        None, ge=0, le=2**31 - 1, validation_alias=AliasChoices("version_start", "param_version_start")
    )
    version_end: int | None = Field(
        None, ge=0, le=2**31 - 1, validation_alias=AliasChoices("version_end", "param_version_end")
    )

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class CheckpointData(BaseModel):
    """What a ``checkpoint`` event's data must hold for the platform to record the checkpoint (other
    keys are kept as they are). Strict integers: ``"12"`` or ``12.5`` is a mistake, not a step."""

    model_config = ConfigDict(extra="allow")
    step: Annotated[int, Field(strict=True, ge=0, le=MAX_STEP)]
    path: Annotated[str, StringConstraints(min_length=1, max_length=1000)]
    size_bytes: Annotated[int, Field(strict=True, ge=0, le=MAX_STEP)] | None = None


CHECKPOINT_KEYS = frozenset({"step", "path", "size_bytes"})
# Only the platform's own status events (experiments.services.run_transition) say which state a run
# entered; the dashboard's state badge follows them. Reported status events are informational.
RESERVED_STATUS_KEYS = ("from", "to")


def event_data_errors(events: list[EventIn]) -> dict[str, list[str]]:
    """Errors in the ``data`` of reported events, by field path (``events[2].data.step``)."""
    out: dict[str, list[str]] = {}
    for i, event in enumerate(events):
        if event.kind == EventKind.CHECKPOINT and CHECKPOINT_KEYS & event.data.keys():
            try:
                CheckpointData.model_validate(event.data)
            except ValidationError as exc:
                for path, msg in validation_errors(exc):
                    out.setdefault(f"events[{i}].data.{path}", []).append(msg)
        elif event.kind == EventKind.STATUS:
            for key in RESERVED_STATUS_KEYS:
                if key in event.data:
                    out.setdefault(f"events[{i}].data.{key}", []).append(
                        "is reserved for the platform's own state changes: reported status events are "
                        "informational (rename the key)"
                    )
    return out


# Optional on event and sample batches: a re-sent batch with the same id is not stored twice.
BatchId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


class MetricsBody(_Wire):
    points: list[PointIn] = Field(max_length=MAX_POINTS_PER_BATCH)


class EventsBody(_Wire):
    events: list[EventIn] = Field(max_length=MAX_EVENTS_PER_BATCH)
    batch_id: BatchId | None = None


class SamplesBody(_Wire):
    step: int | None = Field(None, ge=0, le=MAX_STEP, description="Step of samples that name none.")
    samples: list[SampleIn] = Field(max_length=MAX_SAMPLES_PER_BATCH)
    batch_id: BatchId | None = None

    @model_validator(mode="after")
    def _every_sample_has_a_step(self) -> SamplesBody:
        for i, sample in enumerate(self.samples):
            if sample.step is None:
                if self.step is None:
                    raise ValueError(f"samples[{i}] has no step and the body names none")
                sample.step = self.step
        return self


class WireError(Exception):
    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__(str(errors))


def parse(model: type[_Wire], data: Any) -> Any:
    """Validate a parsed JSON body; raises WireError({"points[3].value": ["..."]})."""
    if not isinstance(data, dict):
        raise WireError({"body": [f"must be a JSON object, got {type(data).__name__}"]})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        out: dict[str, list[str]] = {}
        for path, msg in validation_errors(exc)[:50]:  # a 5000-point garbage batch needs no 5000 lines
            out.setdefault(path or "body", []).append(msg)
        raise WireError(out) from None


def batch_length(data: Any, field: str) -> int | None:
    """Length of the list under ``field`` before full validation (to answer 413 cheaply)."""
    if isinstance(data, dict) and isinstance(data.get(field), list):
        return len(data[field])
    return None
