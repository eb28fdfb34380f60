"""``rlp run follow``'s progress bar counts training steps as the engine numbers them: from 1 (the points
of step 0 are the evaluation before training), so a run of N steps ends at N/N, never N+1/N, and its last
frame shows the final state."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from rlp_client.cli_common import Output
from rlp_client.cli_run import follow
from rlp_client.live import FollowState
from rlp_client.models import MetricPoint


class _Stream:
    """What ``follow`` reads from ``Run.follow``: items, and the state the live stream keeps."""

    def __init__(self, total: int, steps: list[int]) -> None:
        self.state = FollowState(run_id=3, state="running", total_steps=total)
        self.steps = steps

    def __iter__(self) -> Iterator[MetricPoint]:
        for step in self.steps:
            self.state.latest_step = max(step, self.state.latest_step or 0)
            yield MetricPoint("reward/mean", step, 0.5, float(step))
        self.state.state = "succeeded"


class _Run:
    id, state = 3, "running"

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream

    def follow(self, last_seq: int = 0) -> _Stream:
        return self.stream


def _bar_counts(text: str, total: int) -> list[int]:
    return [int(done) for done in re.findall(rf"\b(\d+)/{total}\b", text)]


def test_a_run_of_60_steps_ends_at_60_of_60_showing_its_final_state(capsys):
    code = follow(_Run(_Stream(60, list(range(0, 61)))), Output(json_mode=False))
    captured = capsys.readouterr()
    assert code == 0 and captured.out.strip() == "run 3 succeeded"
    last_frame = captured.err.strip().splitlines()[-1]
    assert "60/60" in last_frame and "succeeded" in last_frame, captured.err
    assert _bar_counts(captured.err, 60) == [60]


@settings(max_examples=40, deadline=None)
@given(total=st.integers(1, 500), data=st.data())
def test_the_bar_shows_the_last_logged_step_and_never_more_than_the_total(total, data):
    """Any subset of the steps 0..total, logged in order (log_every, evaluations at step 0): the bar's
    count is the highest step logged (the reference: the points themselves)."""
    steps = sorted(data.draw(st.sets(st.integers(0, total), min_size=1)))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        follow(_Run(_Stream(total, steps)), Output(json_mode=False))
    assert _bar_counts(err.getvalue(), total) == [max(steps)]
