"""The worker's log stays readable: the periodic sweep's routine lines are dropped, nothing else is."""

from __future__ import annotations

import logging

import pytest

import config.celery  # noqa: F401  (installs the filters, as the worker does when it loads the app)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def collected():
    handler = _Collect()
    names = ("celery.beat", "celery.worker.strategy", "celery.app.trace")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    yield handler.messages
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def test_routine_sweep_lines_are_dropped_and_other_tasks_kept(collected):
    # The three lines Celery writes for every periodic sweep, in its own formats.
    logging.getLogger("celery.beat").info(
        "Scheduler: Sending due task %s (%s)", "launcher-sweep", "launcher.sweep"
    )
    logging.getLogger("celery.worker.strategy").info("Task %s[%s] received", "launcher.sweep", "abc")
    logging.getLogger("celery.app.trace").info(
        "Task %s[%s] succeeded in %ss: %r", "launcher.sweep", "abc", 0.01, {}
    )
    # A run's tasks and anything about the sweep above INFO are kept.
    logging.getLogger("celery.worker.strategy").info("Task %s[%s] received", "launcher.start_run", "def")
    logging.getLogger("celery.app.trace").error(
        "Task %s[%s] raised unexpected: %r", "launcher.sweep", "ghi", "boom"
    )
    assert collected == [
        "Task launcher.start_run[def] received",
        "Task launcher.sweep[ghi] raised unexpected: 'boom'",
    ]
