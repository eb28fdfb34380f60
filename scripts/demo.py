"""`make demo`: run the platform on its embedded defaults and launch the demo experiment.

Starts the ASGI server (daphne) and a Celery worker (with the periodic scheduler) in the foreground,
creates a demo user and project (printing the password once), launches the `demo-cpu` preset (or
`--preset NAME` / `DEMO_PRESET`) as a run and prints its dashboard URL; a preset whose model is a catalogue
model not fetched yet (`smollm2-arith-cpu`) has it fetched first. Ctrl-C stops both processes and the
platform's local Ray head.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError("no free port")


def django_setup() -> None:
    sys.path.insert(0, str(REPO_ROOT / "platform"))
    sys.path.insert(0, str(REPO_ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def ensure_demo_user() -> tuple[str, str | None]:
    """Create the demo user once; returns (username, password-or-None when it already existed)."""
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user = user_model.objects.filter(username="demo").first()
    if user is not None:
        return "demo", None
    password = secrets.token_urlsafe(9)
    user_model.objects.create_superuser("demo", "demo@example.com", password)
    return "demo", password


def launch_demo_run(preset: str) -> str:
    """Create (or reuse) the demo project and the preset's experiment, launch a run; returns its dashboard path."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("launch_demo", user="demo", preset=preset, stdout=out)
    return out.getvalue().strip()


def fetch_preset_model(preset: str, env: dict[str, str]) -> bool:
    """Fetch the preset's model when it is a catalogue model missing from its folder (a progress bar, about
    a minute for SmolLM2); False when the fetch failed (its one-line error printed)."""
    from experiments.config_policy import platform_preset
    from rl_engine.catalogue import CATALOGUE, is_model_dir

    path = Path(platform_preset(preset).model.path)
    if path.name not in CATALOGUE or is_model_dir(path):
        return True
    print(f"fetching the model of {preset}: {path.name} into {path.parent}", flush=True)
    cmd = [PYTHON, "-m", "rl_engine", "models", "fetch", path.name, "--root", str(path.parent)]
    return subprocess.run(cmd, cwd=REPO_ROOT, env=env, check=False).returncode == 0


def wait_http(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status < 500:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Each child gets its own process group so that Ctrl-C handling is ours, and cleanup is complete.
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, start_new_session=True)


def stop_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 20.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "8000")))
    parser.add_argument("--no-launch", action="store_true", help="start the platform without a demo run")
    parser.add_argument(
        "--preset",
        default=os.environ.get("DEMO_PRESET") or "demo-cpu",
        help="the engine preset the demo run launches (default: demo-cpu; smollm2-arith-cpu: a real model)",
    )
    args = parser.parse_args()

    port = free_port(args.port)
    base_url = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    env.setdefault("PLATFORM_URL", base_url)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "platform"), str(REPO_ROOT)])
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.update({k: env[k] for k in ("PLATFORM_URL", "PYTHONPATH", "RAY_USAGE_STATS_ENABLED")})
    django_setup()
    from django.conf import settings

    username, password = ensure_demo_user()
    from rl_engine.presets import preset_names

    if args.preset not in preset_names():
        print(
            f"error: --preset: no preset {args.preset!r}; choose one of {', '.join(preset_names())}",
            file=sys.stderr,
        )
        return 2
    if not args.no_launch and not fetch_preset_model(args.preset, env):
        return 1

    # Each running run holds one worker thread while it is supervised: concurrency >= runs + a few.
    access_log = Path(settings.VAR_DIR) / "access.log"
    queues = ",".join(
        sorted(
            {
                settings.CELERY_TASK_DEFAULT_QUEUE,
                settings.CELERY_LAUNCHER_QUEUE,
                settings.CELERY_DELIVERY_QUEUE,  # webhook deliveries: a queue of their own
            }
        )
    )
    procs = [
        # The engine posts metrics several times a second: its requests go to a file, not the console.
        start(
            [
                PYTHON,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "--access-log",
                str(access_log),
                "config.asgi:application",
            ],
            env,
        ),
        start(
            [
                PYTHON,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-B",
                "-l",
                "INFO",
                "--pool=threads",
                "--concurrency=8",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-Q",
                queues,
                "-s",
                str(Path(settings.VAR_DIR) / "celerybeat-schedule"),
            ],
            env,
        ),
    ]
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        if not wait_http(f"{base_url}/api/health/", 60):
            print("error: the web server did not answer within 60 s", file=sys.stderr)
            return 1
        print(f"\nPlatform: {base_url}/   API docs: {base_url}/api/docs/   admin: {base_url}/admin/")
        if password:
            print(
                f"Demo user: {username} / {password}   (shown once; reset: python manage.py changepassword demo)"
            )
        else:
            print(
                f"Demo user: {username} (password shown when it was created; reset: python manage.py changepassword demo)"
            )
        if not args.no_launch:
            path = launch_demo_run(args.preset)
            print(f"Demo run launched — dashboard: {base_url}{path}")
        print(f"HTTP access log: {access_log}.   Ctrl-C stops the platform.\n", flush=True)
        while not stopping:
            if any(p.poll() is not None for p in procs):
                print("error: a platform process exited; stopping", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        print("stopping...", flush=True)
        stop_all(procs)
        subprocess.run(
            [PYTHON, "manage.py", "ray_local", "stop"],
            cwd=REPO_ROOT,
            env=env,
            check=False,
            stdout=subprocess.DEVNULL,
        )


if __name__ == "__main__":
    sys.exit(main())
