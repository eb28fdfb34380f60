"""The driver's Ray session (rl_engine/pipeline/driver.py, ``_ray_session``): a private Ray whose start
times out (Ray's own error, "The current node timed out during startup", seen on a loaded machine) is
started again, a bounded number of times, each retry told as a run event; its temporary folder, and what
a failed start left running in it, go on every exit. ``ray.init`` is simulated: the first attempts raise
what Ray raises (a plain ``Exception``, ray/_private/node.py), a later one succeeds."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from rl_engine.pipeline import driver
from tests.pipeline.conftest import RecordingSink, sim_config

TIMED_OUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed to "
    "startup or the GCS has become overloaded."
)


class SimulatedRay:
    """``ray.init`` that fails as told (an exception per attempt, None: it starts), leaving a process of
    its own behind in the folder of a failed attempt (as Ray's GCS would be); ``ray.shutdown`` counted."""

    def __init__(self, failures: list[BaseException | None]) -> None:
        self.failures = failures
        self.folders: list[str] = []
        self.left_running: list[subprocess.Popen[bytes]] = []
        self.shutdowns = 0
        self.started = False

    def init(self, **kwargs) -> None:
        folder = kwargs["_temp_dir"]
        self.folders.append(folder)
        assert Path(folder).is_dir()
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            # what a start that failed leaves running: a child naming its folder
            gcs = [sys.executable, "-c", "import time; time.sleep(120)", f"--session-dir={folder}/session"]
            self.left_running.append(subprocess.Popen(gcs))
            raise failure
        self.started = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.started = False


@pytest.fixture
def simulated(monkeypatch):
    made: list[SimulatedRay] = []

    def make(failures: list[BaseException | None]) -> SimulatedRay:
        fake = SimulatedRay(failures)
        made.append(fake)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray, "init", fake.init)
        monkeypatch.setattr(ray, "shutdown", fake.shutdown)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        return fake

    yield make
    for fake in made:  # what a failing test leaves: its own processes and folders only
        for process in fake.left_running:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        for folder in fake.folders:
            shutil.rmtree(folder, ignore_errors=True)


def _gone(fake: SimulatedRay) -> None:
    assert fake.folders and not any(Path(f).exists() for f in fake.folders), fake.folders
    for process in fake.left_running:  # killed and reaped by the driver: gone from the process table
        assert not Path(f"/proc/{process.pid}").exists(), process.args


def test_a_start_that_timed_out_is_tried_again_and_every_folder_goes(simulated):
    fake, sink = simulated([Exception(TIMED_OUT), Exception(TIMED_OUT), None]), RecordingSink()
    ran = []
    with driver._ray_session(sim_config(), None, sink):
        assert fake.started and len(fake.folders) == 3
        assert not Path(fake.folders[0]).exists() and Path(fake.folders[2]).is_dir()
        ran.append(1)
    assert ran == [1]
    _gone(fake)
    told = [m for kind, m, _ in sink.kinds("log") if "timed out" in m]
    assert told == [
        f"Ray's start timed out (attempt {n} of {driver.RAY_START_ATTEMPTS}): starting it again"
        for n in (1, 2)
    ]


def test_a_start_that_keeps_timing_out_fails_after_the_last_attempt_and_leaves_nothing(simulated):
    fake = simulated([Exception(TIMED_OUT)] * 10)
    session = driver._ray_session(sim_config(), None, RecordingSink())
    with pytest.raises(Exception, match="timed out during startup"), session:
        pytest.fail("the session must not start")
    assert len(fake.folders) == driver.RAY_START_ATTEMPTS
    _gone(fake)


@pytest.mark.parametrize(
    "failure",
    [
        Exception("some other start failure"),  # only Ray's startup timeout is tried again
        RuntimeError(TIMED_OUT),  # not the type Ray raises for it
        KeyboardInterrupt(),
    ],
    ids=["another-error", "another-type", "interrupted"],
)
def test_any_other_start_failure_is_not_retried_and_leaves_nothing(simulated, failure):
    fake = simulated([failure])
    with pytest.raises(type(failure)), driver._ray_session(sim_config(), None, RecordingSink()):
        pytest.fail("the session must not start")
    assert len(fake.folders) == 1
    _gone(fake)


def test_the_folder_goes_when_the_run_fails_too(simulated):
    fake = simulated([None])
    with (
        pytest.raises(ValueError, match="the run failed"),
        driver._ray_session(sim_config(), None, RecordingSink()),
    ):
        raise ValueError("the run failed")
    assert fake.shutdowns >= 1
    _gone(fake)
