"""``python manage.py ping_worker``: prove that a Celery worker consumes from this deployment's broker.

Sends a ping task and waits until a worker has written the answer to the database. Exit 0 on answer,
1 on timeout (with a one-line message), so it serves as a readiness probe for deployments and demos.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.models import WorkerPing
from core.services import worker_ping_send


class Command(BaseCommand):
    help = "Send a ping through the Celery broker and wait for a worker to answer."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the answer")

    def handle(self, *args: object, wait: float, **options: object) -> None:
        started = time.monotonic()
        token = worker_ping_send()
        while time.monotonic() - started < wait:
            ping = WorkerPing.objects.filter(token=token).first()
            if ping is not None:
                elapsed_ms = (time.monotonic() - started) * 1000
                self.stdout.write(f"worker {ping.hostname} answered via {ping.broker} in {elapsed_ms:.0f} ms")
                return
            time.sleep(0.1)
        raise CommandError(
            f"no Celery worker answered within {wait:.0f} s (is `celery -A config worker` running?)"
        )
