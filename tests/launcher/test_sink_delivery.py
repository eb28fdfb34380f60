"""The engine's HTTP sink against the real platform (live server, real database), through its real retry
path: a batch delivered but whose reply was lost, and a sink killed while a delivery was in flight,
are sent again and stored once (event and sample batches carry the id the sink gave them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from accounts.services import ingest_token_issue
from rl_engine.sinks.http import HttpSink
from tests.conftest import REPO_ROOT
from tests.factories import RunFactory, checkpoint_path
from tracking.models import Checkpoint, RunEvent, Sample

pytestmark = pytest.mark.django_db(transaction=True)


class LossyProxy:
    """Stands between the sink and the platform (the network). Every POST is forwarded; the first one
    to each endpoint in ``lose`` is stored by the platform, and then its reply is lost: the connection
    is closed without an answer (``drop``), or held open until ``release`` (``hang``)."""

    def __init__(self, upstream: str, mode: str, lose: tuple[str, ...] = ("events", "samples")):
        self.upstream, self.mode, self.lose = upstream, mode, lose
        self.lost: set[str] = set()
        self.forwarded: list[str] = []
        self.reply_lost, self.release = threading.Event(), threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint = self.path.rsplit("/", 1)[1]
                headers = {k: self.headers[k] for k in ("Authorization", "Content-Type")}
                req = urllib.request.Request(
                    proxy.upstream + self.path, data=body, headers=headers, method="POST"
                )
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, answer = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    status, answer = exc.code, exc.read()
                proxy.forwarded.append(endpoint)
                if endpoint in proxy.lose and endpoint not in proxy.lost:
                    proxy.lost.add(endpoint)
                    proxy.reply_lost.set()
                    if proxy.mode == "hang":
                        proxy.release.wait(60)
                    self.close_connection = True
                    return  # no reply: the platform stored it, the sender cannot know
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()


@pytest.fixture
def run_and_token(transactional_db):
    run = RunFactory(state="running")
    return run, ingest_token_issue(run=run).secret


@pytest.fixture
def proxies(live_server) -> Iterator[list[LossyProxy]]:
    made: list[LossyProxy] = []
    yield made
    for proxy in made:
        proxy.close()


def test_a_batch_whose_reply_was_lost_is_sent_again_and_stored_once(
    live_server, proxies, run_and_token, tmp_path
):
    run, token = run_and_token
    proxy = LossyProxy(live_server.url, "drop")
    proxies.append(proxy)
    sink = HttpSink(proxy.url, token, run.pk, spool_dir=tmp_path, max_backoff_s=0.2, heartbeat_interval_s=600)
    sink.log_event(
        "checkpoint", "checkpoint at step 3", {"step": 3, "path": checkpoint_path(run, 3), "size_bytes": 1}
    )
    sink.log_samples(3, [{"prompt": "p", "response": "r", "reward": 1.0}])
    sink.log_metrics(3, {"reward/mean": 0.5})
    sink.close()
    assert proxy.lost == {"events", "samples"}
    assert proxy.forwarded.count("events") == 2 and proxy.forwarded.count("samples") == 2  # sent again
    assert list(RunEvent.objects.filter(run=run, kind="checkpoint").values_list("message", flat=True)) == [
        "checkpoint at step 3"
    ]
    assert Checkpoint.objects.filter(run=run).count() == 1
    assert Sample.objects.filter(run=run).count() == 1
    assert list(run.metric_points.values_list("key", "step", "value")) == [("reward/mean", 3, 0.5)]
    assert not sink.spool.path.exists()  # all delivered


def test_a_sink_killed_mid_delivery_is_resumed_from_its_spool_and_stores_nothing_twice(
    live_server, proxies, run_and_token, tmp_path
):
    """The engine dies (SIGKILL) after the platform stored a batch but before the reply came back; the
    next sink on the same spool (e.g. the resumed engine) re-sends from the recorded cursor."""
    run, token = run_and_token
    proxy = LossyProxy(live_server.url, "hang", lose=("events",))
    proxies.append(proxy)
    engine = f"""
import sys, time
sys.path.insert(0, {str(REPO_ROOT)!r})
from rl_engine.sinks.http import HttpSink
sink = HttpSink({proxy.url!r}, {token!r}, {run.pk}, spool_dir={str(tmp_path)!r}, heartbeat_interval_s=600,
               samples_interval_s=0)
sink.log_event("status", "pipeline running from step 0")
sink.log_samples(1, [{{"prompt": "p", "response": "r"}}])
time.sleep(600)
"""
    proc = subprocess.Popen([sys.executable, "-c", engine], start_new_session=True)
    try:
        assert proxy.reply_lost.wait(60), "the engine's event batch never reached the platform"
        assert RunEvent.objects.filter(run=run, message="pipeline running from step 0").count() == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # mid-delivery: the cursor still points at that batch
        proc.wait(timeout=30)
    spooled = [
        json.loads(line)["endpoint"] for line in (tmp_path / f"run-{run.pk}.jsonl").read_text().splitlines()
    ]
    assert spooled == ["events", "samples"]
    sink = HttpSink(live_server.url, token, run.pk, spool_dir=tmp_path, heartbeat_interval_s=600)
    sink.close()  # delivers the spool it found
    assert RunEvent.objects.filter(run=run, message="pipeline running from step 0").count() == 1
    assert Sample.objects.filter(run=run).count() == 1
    assert not sink.spool.path.exists()
