"""EngineLoop and InterruptGate (rl_engine/rollout/engine_loop.py) on plain asyncio coroutines."""

from __future__ import annotations

import asyncio
import threading

import pytest

from rl_engine.rollout.engine_loop import EngineError, EngineLoop, EngineTimeout, InterruptGate

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def loop():
    el = EngineLoop("test")
    yield el
    el.close()


def test_interrupt_returns_while_the_abort_is_still_running(loop):
    release = asyncio.Event()
    resumed = []

    async def pause() -> None:
        await release.wait()  # an engine abort that takes its time

    async def resume() -> None:
        resumed.append(True)

    flag = threading.Event()
    gate = InterruptGate(loop, pause, resume, flag, timeout_s=10)
    gate.interrupt()  # must not wait for pause()
    assert flag.is_set() and gate.paused and not gate._pending.done()
    gate.interrupt()  # a second interrupt submits no second abort
    loop.loop.call_soon_threadsafe(release.set)
    gate.clear()
    assert resumed == [True] and not flag.is_set() and not gate.paused


def test_an_abort_that_never_completes_times_out_with_a_clear_error(loop):
    async def pause() -> None:
        await asyncio.Event().wait()

    async def resume() -> None:
        raise AssertionError("resume must not run before the abort completed")

    gate = InterruptGate(loop, pause, resume, threading.Event(), timeout_s=0.2)
    gate.interrupt()
    with pytest.raises(EngineTimeout, match=r"abort of in-flight requests did not finish within 0\.2 s"):
        gate.clear()


def test_engine_failures_become_one_line_engine_errors(loop):
    async def boom() -> None:
        raise KeyError("layer.w")

    with pytest.raises(EngineError, match=r"test: load failed: KeyError: 'layer\.w'"):
        loop.call(boom(), timeout=5, what="load")


def test_waiting_on_the_loop_from_the_loop_itself_is_refused(loop):
    async def inner() -> None:
        await asyncio.sleep(0)

    async def outer() -> str:
        try:
            loop.call(inner(), timeout=1, what="nested")
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    assert "own loop thread" in loop.call(outer(), timeout=5, what="outer")


def test_close_cancels_pending_calls():
    el = EngineLoop("closing")
    fut = el.submit(asyncio.sleep(3600))
    el.close()
    assert fut.cancelled() or fut.done()
