"""``python manage.py ray_local start|stop|status``: the platform's own local Ray head."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from launcher import ray_local


class Command(BaseCommand):
    help = "Start, stop or show the local Ray head the platform runs jobs on (never touches other Ray processes)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args: object, **options: object) -> None:
        action = options["action"]
        if action == "start":
            try:
                info = ray_local.ensure_started()
            except ray_local.LocalHeadError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(
                f"running: pid {info.pid}, dashboard {info.dashboard_url}, gcs {info.gcs_address}"
            )
        elif action == "stop":
            stopped = ray_local.stop()
            self.stdout.write("stopped" if stopped else "not running")
        else:
            info, state = ray_local.status()
            if info is None:
                self.stdout.write("stopped")
                return
            self.stdout.write(
                f"{state}: pid {info.pid}, dashboard {info.dashboard_url}, gcs {info.gcs_address}, "
                f"{info.num_cpus} CPUs, temp dir {info.temp_dir}"
            )
            if state != "running":
                raise CommandError(f"the local Ray head (pid {info.pid}) does not answer its Jobs API")
