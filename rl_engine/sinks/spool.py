"""The HTTP sink's on-disk queue: every batch is appended before it is sent, and a cursor file records
how many bytes of it were delivered, so a platform outage (or a crash between a send and its answer)
costs a resend, never a loss.

``run-<id>.jsonl`` holds one ``{"endpoint", "body"}`` record a line; ``run-<id>.cursor`` the byte
offset delivered up to (written atomically after each delivered batch); ``run-<id>.rejected.jsonl`` the
batches the platform refused for good, with its answer. Event and sample batches get a ``batch_id``
when spooled, which the platform stores once however often the batch is sent.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_engine import wire


@dataclass(frozen=True)
class SpooledBatch:
    endpoint: str  # one of rl_engine.wire's endpoints
    body: dict[str, Any]


class Spool:
    """Run ``run_id``'s spool files in folder ``root`` (created)."""

    def __init__(self, root: Path, run_id: int | str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f"run-{run_id}.jsonl"
        self.cursor_path = root / f"run-{run_id}.cursor"
        self.rejected_path = root / f"run-{run_id}.rejected.jsonl"

    def append(self, endpoint: str, body: dict[str, Any]) -> None:
        if endpoint in (wire.EVENTS, wire.SAMPLES):  # stored once by the platform however often it is sent
            body = {**body, "batch_id": uuid.uuid4().hex}
        with open(self.path, "ab") as fh:
            fh.write(json.dumps({"endpoint": endpoint, "body": body}).encode() + b"\n")

    def backlog(self) -> int:
        """Bytes spooled and not yet delivered."""
        try:
            return self.path.stat().st_size - self.cursor()
        except FileNotFoundError:
            return 0

    def cursor(self) -> int:
        try:
            return int(self.cursor_path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def undelivered(self) -> Iterator[tuple[SpooledBatch | None, int]]:
        """The batches after the cursor, in order, each with the byte offset just past it; None for a
        torn last line (a crash mid-write), which is skipped."""
        offset = self.cursor()
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            for raw in fh:
                offset += len(raw)
                try:
                    record = json.loads(raw)
                except ValueError:
                    yield None, offset
                    continue
                yield SpooledBatch(record["endpoint"], record["body"]), offset

    def delivered_to(self, offset: int) -> None:
        """Record that everything before byte ``offset`` was delivered; once that is the whole spool, the
        files go (a new batch starts a new spool)."""
        if offset >= self.path.stat().st_size:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            with contextlib.suppress(FileNotFoundError):
                self.cursor_path.unlink()
            return
        tmp = self.cursor_path.with_suffix(".tmp")
        tmp.write_text(str(offset))
        tmp.replace(self.cursor_path)

    def reject(self, batch: SpooledBatch, status: int, response: Any) -> None:
        """Keep a batch the platform will never accept, with its answer, in the rejected log."""
        entry = {"endpoint": batch.endpoint, "status": status, "response": response, "body": batch.body}
        with open(self.rejected_path, "ab") as fh:
            fh.write(json.dumps(entry).encode() + b"\n")
