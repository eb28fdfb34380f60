"""The contract between the engine and the platform: rl_engine's real HTTP sink, posting to the real
ingestion API served by a live server, with the run's ingest token, stores what the engine logged."""

from __future__ import annotations

import pytest

from accounts.services import ingest_token_issue
from experiments.models import Run
from rl_engine.sinks.http import HttpSink
from tests.factories import ExperimentFactory, RunFactory, UserFactory, checkpoint_path
from tracking.models import Checkpoint, MetricPoint, RunEvent, Sample


@pytest.mark.django_db(transaction=True)
def test_the_engine_http_sink_reports_into_the_platform(live_server, tmp_path):
    exp = ExperimentFactory(created_by=UserFactory())
    # A run row without run_create: committed here, run_create would hand it to the launcher's queue.
    run = RunFactory(experiment=exp, state="running")
    secret = ingest_token_issue(run=run).secret
    sink = HttpSink(
        live_server.url,
        secret,
        run.pk,
        spool_dir=tmp_path,
        flush_interval_s=0.05,
        heartbeat_interval_s=0.2,
        close_timeout_s=30,
    )
    for step in range(1, 4):
        sink.log_metrics(step, {"reward/mean": step / 10, "actor/pg_loss": -step / 100})
    sink.log_metrics(3, {"reward/mean": 99.0})  # a repeated step: the platform keeps the first value
    sink.log_event(
        "checkpoint", "checkpoint at step 3", {"step": 3, "path": checkpoint_path(run, 3), "size_bytes": 10}
    )
    sink.log_event("log", "hello")
    sink.log_samples(
        3,
        [
            {
                "prompt": "ab",
                "response": "ab",
                "answer": "ab",
                "reward": 1.0,
                "param_version_start": 2,
                "param_version_end": 3,
            }
        ],
    )
    sink.close()
    assert sink.backlog() == 0, sink.last_error  # everything was delivered, nothing refused
    assert MetricPoint.objects.filter(run=run).count() == 6
    assert MetricPoint.objects.get(run=run, key="reward/mean", step=3).value == pytest.approx(0.3)
    assert list(RunEvent.objects.filter(run=run).values_list("kind", flat=True)) == [
        "checkpoint",
        "log",
    ]
    assert list(Checkpoint.objects.filter(run=run).values_list("step", "path")) == [
        (3, checkpoint_path(run, 3))
    ]
    sample = Sample.objects.get(run=run)
    assert (sample.step, sample.answer, sample.version_start, sample.version_end) == (3, "ab", 2, 3)
    assert Run.objects.get(pk=run.pk).heartbeat_at is not None
