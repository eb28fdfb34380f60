"""The engine's HTTP sink when the real platform (live server, real database) says no: a rotated or
revoked token (401), a malformed batch (400), an oversize batch (413), a rate limit (429). Each answer
is produced for real: a token re-issued or revoked, an invalid event, a lowered upload limit, a lowered
ingest rate."""

from __future__ import annotations

import copy
import json
import uuid

import pytest

from accounts.services import ingest_token_issue, ingest_tokens_revoke_for_run
from rl_engine.sinks.http import HttpSink
from tests.conftest import wait_for
from tests.factories import RunFactory
from tracking.models import RunEvent, Sample

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(transactional_db):
    return RunFactory(state="running")


@pytest.fixture
def own_throttle_counters(settings):
    """Throttle counters live in the cache (maybe a Redis shared with other suites): count in a key
    namespace of this test's own."""
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["KEY_PREFIX"] = f"{caches['default'].get('KEY_PREFIX', '')}:{uuid.uuid4().hex}"
    settings.CACHES = caches


def sink_for(live_server, run, tmp_path, token=None, **kw) -> HttpSink:
    # A long flush wait: what a test logs goes out in one batch, at close.
    opts = {
        "flush_interval_s": 30.0,
        "heartbeat_interval_s": 600,
        "max_backoff_s": 0.2,
        "close_timeout_s": 30,
    }
    return HttpSink(live_server.url, token, run.pk, spool_dir=tmp_path / "spool", **(opts | kw))


def rejected_entries(sink: HttpSink) -> list[dict]:
    return [json.loads(line) for line in sink.spool.rejected_path.read_text().splitlines()]


def test_the_token_comes_from_its_file_and_is_read_again_when_the_platform_rotates_it(
    live_server, run, tmp_path, monkeypatch
):
    token_file = tmp_path / "ingest-token"
    token_file.write_text(f"  {ingest_token_issue(run=run).secret}\n")  # whitespace around it is ignored
    for name, value in {"RL_ENGINE_INGEST_URL": live_server.url, "RL_ENGINE_RUN_ID": str(run.pk),
                        "RL_ENGINE_INGEST_TOKEN_FILE": str(token_file), "RL_ENGINE_SPOOL_DIR": str(tmp_path),
                        "RL_ENGINE_HEARTBEAT_S": "600", "RL_ENGINE_FLUSH_S": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RL_ENGINE_INGEST_TOKEN", raising=False)
    sink = HttpSink.from_env()
    sink.log_metrics(1, {"reward/mean": 1.0})
    wait_for(
        lambda: run.metric_points.exists(), timeout_s=30, message="the first point, with the file's token"
    )
    token_file.write_text(ingest_token_issue(run=run).secret)  # a new token; the sink's is revoked now
    sink.log_metrics(2, {"reward/mean": 2.0})  # 401, the file is read again, sent with the new token
    sink.close()
    assert sink.refused is None
    assert sorted(run.metric_points.values_list("step", flat=True)) == [1, 2]


def test_a_refused_token_stops_delivery_once_and_keeps_everything_in_the_spool(
    live_server, run, tmp_path, capsys
):
    sink = sink_for(live_server, run, tmp_path, ingest_token_issue(run=run).secret, flush_interval_s=0)
    sink.log_metrics(1, {"reward/mean": 1.0})
    wait_for(lambda: run.metric_points.exists(), timeout_s=30, message="the first point")
    ingest_tokens_revoke_for_run(run_id=run.pk)  # what the platform does when the run ends
    sink.log_metrics(2, {"reward/mean": 2.0})
    wait_for(lambda: sink.refused is not None, timeout_s=30, message="the sink to give up on its token")
    sink.log_event("log", "logged after the refusal")  # still recorded locally
    sink.close()
    assert sink.refused.status == 401
    assert list(run.metric_points.values_list("step", flat=True)) == [1]
    spooled = [json.loads(line) for line in sink.spool.path.read_text().splitlines()]
    assert [r["endpoint"] for r in spooled] == ["metrics", "events"]  # undelivered, kept in order
    assert spooled[0]["body"]["points"][0]["step"] == 2 and sink.backlog() == sink.spool.path.stat().st_size
    assert not sink.spool.rejected_path.exists()  # a refused token is not a malformed batch
    assert capsys.readouterr().err.count("refuses this run's ingest token") == 1


def test_a_malformed_item_is_dropped_recorded_and_reported_and_the_rest_of_its_batch_is_stored(
    live_server, run, tmp_path
):
    sink = sink_for(live_server, run, tmp_path, ingest_token_issue(run=run).secret)
    sink.log_event("log", "before")
    sink.log_event("bogus", "the platform answers 400 for this kind")
    sink.log_event("log", "after")
    sink.log_metrics(1, {"reward/mean": 1.0})  # delivery goes on behind the refused batch
    sink.close()
    assert sink.backlog() == 0, sink.last_error
    assert list(run.metric_points.values_list("step", flat=True)) == [1]
    events = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", "message", "data"))
    assert events[:2] == [("log", "before", {}), ("log", "after", {})]
    (alert,) = events[2:]
    assert alert[:2] == ("alert", "platform rejected a events batch: HTTP 400")
    assert alert[2]["endpoint"] == "events" and alert[2]["status"] == 400
    assert list(alert[2]["errors"]) == ["events[1].kind"]
    (entry,) = rejected_entries(sink)
    assert (entry["endpoint"], entry["status"]) == ("events", 400)
    assert [e["kind"] for e in entry["body"]["events"]] == ["bogus"]
    assert "events[1].kind" in entry["response"]["errors"]


def test_an_oversize_batch_is_split_and_a_record_too_big_alone_is_rejected(
    live_server, run, tmp_path, settings
):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 20_000  # the platform's body limit, lowered: 413 beyond
    sink = sink_for(live_server, run, tmp_path, ingest_token_issue(run=run).secret)
    sink.log_samples(1, [{"prompt": f"p{i}", "response": "r" * 4000} for i in range(8)])  # ~32 KB together
    sink.log_samples(2, [{"prompt": "huge", "response": "r" * 30_000}])
    sink.close()
    assert sink.backlog() == 0, sink.last_error
    assert sorted(Sample.objects.filter(run=run).values_list("prompt", flat=True)) == [
        f"p{i}" for i in range(8)
    ]
    (entry,) = rejected_entries(sink)
    assert (entry["endpoint"], entry["status"]) == ("samples", 413)
    assert [s["prompt"] for s in entry["body"]["samples"]] == ["huge"]
    alert = RunEvent.objects.get(run=run, kind="alert")
    assert alert.message == "platform rejected a samples batch: HTTP 413"
    assert "20000 bytes" in alert.data["errors"]["detail"]


def test_a_rate_limited_sink_waits_for_retry_after_drops_nothing_and_keeps_its_token_alive(
    live_server, run, tmp_path, settings, own_throttle_counters
):
    """A backlog far beyond the rate, behind a token that dies unless heartbeats renew it."""
    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        # 1/second: even a quick 1000-point insert on an idle machine meets the limit every window
        "DEFAULT_THROTTLE_RATES": {**rates, "ingest": "1/second"},
    }
    settings.RUN_HEARTBEAT_TIMEOUT_S = 3  # the token's life; each heartbeat renews it
    sink = sink_for(
        live_server,
        run,
        tmp_path,
        ingest_token_issue(run=run).secret,
        heartbeat_interval_s=0.5,
        max_backoff_s=0.02,
    )
    for step in range(8):  # 8 batches of 1000 points: 8 s at the allowed rate, the token lives 3 s
        sink.log_metrics(step, {f"k{i}": float(i) for i in range(1000)})
    sink.close()
    assert sink.refused is None, "the token expired: heartbeats did not get through the rate limit"
    assert sink.backlog() == 0, sink.last_error
    assert run.metric_points.count() == 8000  # every throttled batch was sent again, none dropped
    assert not sink.spool.rejected_path.exists()
    # Retry-After (1 s) was honoured: about one refusal per window; with its own 0.02 s backoff the
    # sink would have hit the limit about 50 times a second.
    assert 1 <= sink.throttled_responses <= 30
