"""A Redis broker that is connected but silent (``CLIENT PAUSE``: connections stay open, nothing answers)
must not hold the request that launches or cancels a run: the task's publish is one try bounded by
``REDIS_SOCKET_TIMEOUT_S``, and the run stays recorded (queued) for the launcher's sweep to start. The
platform's own settings on a private redis-server (harness/private_redis.py) in a child process, which
pauses it between a first publish (sent) and a second (refused in time); never the machine's Redis."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from experiments.models import Run, RunState
from experiments.services import run_create
from harness.private_redis import PrivateRedis, require_redis_server
from tests.conftest import REPO_ROOT, child_process_env

PAUSE_MS = 30_000

CHILD = """
import json, os, sys, time
sys.path.insert(0, "platform")
os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
import django
django.setup()
import redis
from launcher.lifecycle import enqueue_start
from experiments.models import Run
first, second = int(sys.argv[1]), int(sys.argv[2])
enqueue_start(first)  # Redis answers: the task is sent, its id recorded
redis.Redis.from_url(os.environ["REDIS_URL"]).execute_command("CLIENT", "PAUSE", sys.argv[3], "ALL")
enqueue_start(second)  # Redis silent: one bounded try, then the run stays as it is
print(json.dumps({"first": Run.objects.get(pk=first).celery_task_id}))
"""


def _still_silent(port: int) -> bool:
    """A PING with a short timeout gets no answer: the pause is still on."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.settimeout(0.5)
            sock.sendall(b"PING\r\n")
            return not sock.recv(16)
    except TimeoutError:
        return True


@pytest.mark.django_db(transaction=True)  # the child process reads the runs
def test_a_start_task_sent_to_a_silent_broker_gives_up_in_time_and_the_run_stays_queued(
    team, experiment, tmp_path
):
    require_redis_server()
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        first, second = (run_create(experiment=experiment, user=team["member"]) for _ in range(2))
        Run.objects.filter(pk__in=[first.pk, second.pk]).update(celery_task_id="")
        env = child_process_env() | {"REDIS_URL": server.url, "CELERY_QUEUE": f"silent-{tmp_path.name}"}
        proc = subprocess.run([sys.executable, "-c", CHILD, str(first.pk), str(second.pk), str(PAUSE_MS)],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        # it returned while Redis still answered nothing: the publish did not wait for the broker
        assert _still_silent(server.port)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1])["first"]  # the broker was really used
        second.refresh_from_db()
        assert second.state == RunState.QUEUED and second.celery_task_id == ""  # the sweep starts it
        assert "could not enqueue start of run" in proc.stderr
    finally:
        server.stop()
