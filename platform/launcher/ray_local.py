"""The ``local`` cluster provider: one Ray head started for the platform on this machine.

The head runs ``ray start --head --block`` in its own session (``setsid``), on explicitly chosen free
ports (never Ray's defaults: Redis owns 6379 and a second head would clash on the client-server and
dashboard-agent ports), with its own short temp dir (Ray's unix-socket paths have a ~107 byte limit).
Its address, PID and ports live in ``VAR_DIR/ray/local_head.json`` so every later run, worker and
``manage.py ray_local`` reuses it. Stopping sends SIGTERM to *that* PID only, after stopping our jobs —
never ``ray stop``, which would kill every Ray process on the machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

from django.conf import settings

from launcher import job_env

HEAD_START_TIMEOUT_S = 90.0
HEAD_STOP_TIMEOUT_S = 40.0
# Ray's own "keep sockets short" budget: temp dir + "/session_<date>_<pid>/sockets/plasma_store".
_MAX_TEMP_DIR_LEN = 40


class LocalHeadError(RuntimeError):
    """The local head could not be started or reached; the message says why and where to look."""


@dataclass(frozen=True)
class HeadInfo:
    pid: int
    gcs_port: int
    dashboard_port: int
    client_server_port: int
    agent_listen_port: int
    agent_grpc_port: int
    runtime_env_agent_port: int
    node_manager_port: int
    object_manager_port: int
    metrics_export_port: int
    temp_dir: str
    num_cpus: int
    started_at: float

    @property
    def dashboard_url(self) -> str:
        """What the Jobs API client and ``provider=address`` users call the cluster's address."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"


def ray_dir() -> Path:
    """Where the head's state, lock and log live: RAY_LOCAL_DIR, else VAR_DIR/ray."""
    path = Path(getattr(settings, "RAY_LOCAL_DIR", "") or Path(settings.VAR_DIR) / "ray")
    path.mkdir(parents=True, exist_ok=True)
    return path


def state_file() -> Path:
    return ray_dir() / "local_head.json"


def temp_dir() -> Path:
    """A short temp dir for the head, unique to this VAR_DIR (so two checkouts never share one)."""
    preferred = ray_dir() / "t"
    if len(str(preferred)) <= _MAX_TEMP_DIR_LEN:
        return preferred
    digest = hashlib.sha256(str(ray_dir().resolve()).encode()).hexdigest()[:10]
    return Path("/tmp") / f"rlp-{digest}"


def read_state() -> HeadInfo | None:
    try:
        data = json.loads(state_file().read_text())
        return HeadInfo(**data)
    except (OSError, ValueError, TypeError):
        return None


def _write_state(info: HeadInfo) -> None:
    tmp = state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(info), indent=2))
    tmp.replace(state_file())


def _clear_state() -> None:
    with contextlib.suppress(FileNotFoundError):
        state_file().unlink()


@contextlib.contextmanager
def _start_lock() -> Iterator[None]:
    """Serialise start/stop across processes (two workers must not start two heads)."""
    with open(ray_dir() / "local_head.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def jobs_api_ok(info: HeadInfo, timeout: float = 3.0) -> bool:
    """The health check: the dashboard's Jobs API answers a job listing."""
    try:
        with urlopen(f"{info.dashboard_url}/api/jobs/", timeout=timeout) as resp:
            return resp.status == 200
    except (URLError, OSError, ValueError):
        return False


def status() -> tuple[HeadInfo | None, str]:
    """(info, "running" | "unhealthy" | "stopped") of the recorded head."""
    info = read_state()
    if info is None or not pid_alive(info.pid):
        return None, "stopped"
    return info, ("running" if jobs_api_ok(info) else "unhealthy")


def is_gone(address: str) -> bool:
    """Whether ``address`` was a local head that no longer runs: the recorded head (if any) is at another
    address or dead. A stopped local head never comes back at the same address (a new one gets new ports),
    so jobs that ran on it are lost for good."""
    info = read_state()
    return info is None or info.dashboard_url != address.rstrip("/") or not pid_alive(info.pid)


def _free_ports(count: int) -> list[int]:
    """Distinct free TCP ports, held together while choosing so none is handed out twice."""
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            # Stay clear of Redis and Ray's worker-port range, which the head hands to workers.
            if port == 6379 or 10002 <= port <= 19999:
                sock.close()
                continue
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _num_cpus() -> int:
    """Logical CPUs of the head. By default the cores, but at least two per allowed concurrent run: a
    run places a rollout and a trainer actor of one CPU each, and a run whose actors cannot be placed
    would sit "running" without progress (oversubscribing cores only slows runs down)."""
    configured = int(getattr(settings, "RAY_LOCAL_NUM_CPUS", 0) or 0)
    if configured > 0:
        return configured
    return max(os.cpu_count() or 1, 2 * int(getattr(settings, "RUN_CONCURRENCY_LIMIT", 1) or 1))


def head_env() -> dict[str, str]:
    """Environment of the head (and so of every job driver it starts): an allow-list of the worker's
    (launcher.job_env), never the platform's settings (database, secret key, broker, RAY_ADDRESS)."""
    return job_env.head_env()


def _spawn_head() -> HeadInfo:
    ports = _free_ports(9)
    tdir = temp_dir()
    tdir.mkdir(parents=True, exist_ok=True)
    ray_bin = str(Path(sys.executable).parent / "ray")
    num_cpus = _num_cpus()
    cmd = [
        ray_bin, "start", "--head", "--block", "--disable-usage-stats",
        f"--port={ports[0]}", "--dashboard-host=127.0.0.1", f"--dashboard-port={ports[1]}",
        f"--ray-client-server-port={ports[2]}", f"--dashboard-agent-listen-port={ports[3]}",
        f"--dashboard-agent-grpc-port={ports[4]}", f"--runtime-env-agent-port={ports[5]}",
        f"--node-manager-port={ports[6]}", f"--object-manager-port={ports[7]}",
        f"--metrics-export-port={ports[8]}", f"--num-cpus={num_cpus}", f"--temp-dir={tdir}",
        "--include-dashboard=true",
    ]  # fmt: skip
    log = open(ray_dir() / "head.log", "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        # start_new_session = setsid: the head outlives the Celery worker that happened to start it.
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=head_env(), cwd=str(settings.BASE_DIR), start_new_session=True,
        )  # fmt: skip
    finally:
        log.close()
    return HeadInfo(
        pid=proc.pid, gcs_port=ports[0], dashboard_port=ports[1], client_server_port=ports[2],
        agent_listen_port=ports[3], agent_grpc_port=ports[4], runtime_env_agent_port=ports[5],
        node_manager_port=ports[6], object_manager_port=ports[7], metrics_export_port=ports[8],
        temp_dir=str(tdir), num_cpus=num_cpus, started_at=time.time(),
    )  # fmt: skip


def _wait_healthy(info: HeadInfo, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(info.pid):
            raise LocalHeadError(f"the local Ray head exited during start; see {ray_dir() / 'head.log'}")
        if jobs_api_ok(info, timeout=2.0):
            return
        time.sleep(0.5)
    raise LocalHeadError(
        f"the local Ray head did not answer the Jobs API within {timeout:.0f} s; see {ray_dir() / 'head.log'}"
    )


def ensure_started(timeout: float = HEAD_START_TIMEOUT_S) -> HeadInfo:
    """Return the running head, starting one if there is none (idempotent, safe across processes)."""
    info, state = status()
    if state == "running" and info is not None:
        return info
    with _start_lock():
        info, state = status()
        if info is not None and state == "unhealthy":
            # Still booting (another process just started it), or wedged: give it a chance first.
            with contextlib.suppress(LocalHeadError):
                _wait_healthy(info, timeout=min(timeout, 30.0))
                return info
            _terminate(info)
        elif info is not None:
            return info
        info = _spawn_head()
        _write_state(info)
        try:
            _wait_healthy(info, timeout)
        except LocalHeadError:
            _terminate(info)
            _clear_state()
            raise
        return info


def _stop_jobs(info: HeadInfo) -> None:
    """Stop every unfinished job on our head first: a head kill would leave job drivers behind."""
    from launcher import jobs

    with contextlib.suppress(Exception):
        jobs.stop_all(info.dashboard_url, timeout=15.0)


def _terminate(info: HeadInfo) -> None:
    """SIGTERM our head's PID (it drains and takes its children along); SIGKILL its session if stuck."""
    if not pid_alive(info.pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + HEAD_STOP_TIMEOUT_S
    while time.monotonic() < deadline and pid_alive(info.pid):
        time.sleep(0.2)
    if pid_alive(info.pid):
        # The head leads its own session (setsid), so this group is ours and nobody else's.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(info.pid, signal.SIGKILL)


def stop() -> bool:
    """Stop our jobs, then our head. Returns False when no head was running."""
    with _start_lock():
        info = read_state()
        if info is None:
            return False
        was_alive = pid_alive(info.pid)
        if was_alive:
            if jobs_api_ok(info):
                _stop_jobs(info)
            _terminate(info)
        _clear_state()
        return was_alive
