"""The platform's processes started the way a deployment runs them, for end-to-end tests and benchmarks.

``PlatformStack`` starts the web tier (as production runs it: gunicorn managing uvicorn workers, see
platform/config/gunicorn.py; or one daphne process, the server before it), a Celery worker and
(optionally) a separate Celery beat as subprocesses of their own (each in its own session, so a kill takes its children with it) with the
environment given, and can pause, kill and restart them. ``Api`` is a REST client that talks to it the
way a browser behind a TLS-terminating proxy does (public host name, ``X-Forwarded-Proto: https``), and
``Follower`` follows a run's websocket in a background thread, recording each message with its receipt
time. Nothing here is used by the platform itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class PlatformStack:
    """web (gunicorn + uvicorn workers, or daphne), worker (celery, threads pool) and beat, on ``env``
    (settings come from it)."""

    var_dir: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    root: Path = REPO_ROOT  # the source tree the processes run (benchmarks compare an older commit's)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_path(self, name: str) -> Path:
        return self.var_dir / f"{name}.log"

    def log(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def _start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        env = {**self.env, "PYTHONPATH": os.pathsep.join([str(self.root / "platform"), str(self.root)])}
        with open(self.log_path(name), "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", *args], cwd=self.root, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self.procs[name] = proc
        return proc

    def start_web(
        self, timeout_s: float = 90.0, *, server: str = "gunicorn", workers: int | None = None
    ) -> None:
        """``server``: ``gunicorn`` (production: ``workers`` uvicorn processes, default WEB_CONCURRENCY from
        the environment, else the CPUs) or ``daphne`` (one process)."""
        if server == "gunicorn":
            args = [
                "gunicorn",
                "-c",
                "python:config.gunicorn",
                "-b",
                f"127.0.0.1:{self.port}",
                "config.asgi:application",
            ]
            if workers is not None:
                self.env["WEB_CONCURRENCY"] = str(workers)
        elif server == "uvicorn":  # uvicorn's own process manager (compared in benchmarks/live_load.py)
            args = ["uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(self.port),
                    "--workers", str(workers or 1), "--lifespan", "off", "--no-access-log", "--no-proxy-headers"]  # fmt: skip
        elif server == "daphne" and workers in (None, 1):
            args = ["daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"]
        else:
            raise ValueError(
                f"unknown web server {server!r} with {workers} workers (gunicorn, or daphne alone)"
            )
        proc = self._start("web", args)

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the web server exited:\n{self.log('web')[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/health/", timeout=2):
                    return True
            except urllib.error.HTTPError:
                return True  # it answers (e.g. 503 while its database is away)
            except OSError:
                return False

        wait_until(answers, timeout_s, "the web server", 0.2)

    def start_worker(
        self, queue: str, *, concurrency: int = 8, beat: bool = False, timeout_s: float = 90.0
    ) -> None:
        """``celery worker`` consuming ``queue`` and the webhook deliveries' queue (``CELERY_DELIVERY_QUEUE``,
        default ``<CELERY_QUEUE>-deliveries``), with the embedded beat when ``beat``."""
        seen = self.log("worker").count(" ready.")
        default = self.env.get("CELERY_QUEUE") or "celery"
        deliveries = self.env.get("CELERY_DELIVERY_QUEUE") or f"{default}-deliveries"
        queues = ",".join(dict.fromkeys([queue, deliveries]))
        args = ["celery", "-A", "config", "worker", "-l", "INFO", "-Q", queues, "--pool=threads",
                f"--concurrency={concurrency}", "--without-gossip", "--without-mingle", "--without-heartbeat",
                "-n", f"worker-{self.port}@%h"]  # fmt: skip
        if beat:
            args += ["-B", "-s", str(self.var_dir / "celerybeat-schedule")]
        proc = self._start("worker", args)

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited:\n{self.log('worker')[-3000:]}")
            return self.log("worker").count(" ready.") > seen

        wait_until(ready, timeout_s, "the worker", 0.2)

    def start_beat(self) -> None:
        self._start("beat", ["celery", "-A", "config", "beat", "-l", "INFO", "-s",
                             str(self.var_dir / "celerybeat-schedule")])  # fmt: skip

    def signal(self, name: str, sig: int) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)

    def pause(self, name: str) -> None:
        self.signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.signal(name, signal.SIGCONT)

    def alive(self, name: str) -> bool:
        return name in self.procs and self.procs[name].poll() is None

    def stop(self, name: str | None = None, timeout_s: float = 20.0) -> None:
        """SIGTERM (SIGKILL after ``timeout_s``) to one process, or to all of them."""
        for key in [name] if name else list(self.procs):
            proc = self.procs.pop(key, None)
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def cpu_seconds(self, name: str) -> float:
        """User + system CPU seconds of the process and every live process of its session (gunicorn's
        workers), threads included."""
        session, ticks = self.procs[name].pid, 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[3]) == session:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def web_client_ports(self) -> dict[int, set[int]]:
        """For each web process (``web_pids``), the client ports of the loopback TCP connections it holds:
        which process serves which client (a client knows its own port)."""
        inode_port: dict[str, int] = {}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as fh:
                next(fh)
                for line in fh:
                    cols = line.split()
                    local_port = int(cols[1].rsplit(":", 1)[1], 16)
                    if local_port == self.port:  # server side: the remote end is the client
                        inode_port[cols[9]] = int(cols[2].rsplit(":", 1)[1], 16)
        out: dict[int, set[int]] = {}
        for pid in self.web_pids():
            ports = out.setdefault(pid, set())
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    target = os.readlink(fd)
                except OSError:
                    continue
                if target.startswith("socket:[") and target[8:-1] in inode_port:
                    ports.add(inode_port[target[8:-1]])
        return out

    def web_pids(self) -> list[int]:
        """The processes serving requests: gunicorn's workers (children of the master), or daphne."""
        master = self.procs["web"].pid
        children = Path(f"/proc/{master}/task/{master}/children")
        pids = [int(p) for p in children.read_text().split()] if children.exists() else []
        return pids or [master]


@dataclass
class Api:
    """REST calls as a client of the public name behind a TLS proxy (token auth)."""

    base: str  # where the web server listens, e.g. http://127.0.0.1:8123
    token: str = ""
    host: str = ""  # the public host name sent as Host; "" keeps the URL's
    https_proxy: bool = False  # send X-Forwarded-Proto: https, as a TLS-terminating proxy does

    def headers(self) -> dict[str, str]:
        out = {"Content-Type": "application/json"}
        if self.token:
            out["Authorization"] = f"Token {self.token}"
        if self.host:
            out["Host"] = self.host
        if self.https_proxy:
            out["X-Forwarded-Proto"] = "https"
        return out

    def call(self, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=self.headers())
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def post(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def login(self, username: str, password: str) -> str:
        """Log in through the login page like a browser (CSRF cookie and token, then the form); returns
        the ``sessionid=...`` cookie for the websocket."""
        origin = ("https://" if self.https_proxy else "http://") + (self.host or self.base.split("://", 1)[1])
        page = urllib.request.Request(self.base + "/accounts/login/", headers=self.headers())
        with urllib.request.urlopen(page, timeout=30) as resp:
            csrf = SimpleCookie(resp.headers.get("Set-Cookie", ""))["csrftoken"].value
        form = f"username={username}&password={password}&csrfmiddlewaretoken={csrf}".encode()
        headers = self.headers() | {"Content-Type": "application/x-www-form-urlencoded", "Origin": origin,
                                    "Referer": origin + "/accounts/login/", "Cookie": f"csrftoken={csrf}"}  # fmt: skip
        req = urllib.request.Request(
            self.base + "/accounts/login/", data=form, method="POST", headers=headers
        )
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            opener.open(req, timeout=30)
        except urllib.error.HTTPError as exc:  # the 302 after a successful login
            cookies = SimpleCookie()
            for value in exc.headers.get_all("Set-Cookie") or []:
                cookies.load(value)
            if exc.code == 302 and "sessionid" in cookies:
                return f"sessionid={cookies['sessionid'].value}"
            raise
        raise RuntimeError("the login form did not log in (no redirect)")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Follower:
    """Follows ``ws/runs/<id>/`` in a background thread; ``messages`` holds (receipt time, message).

    Receipt times are ``time.time()`` (comparable with the engine's ``wall_time``) taken as each frame
    is read."""

    def __init__(self, base: str, run_id: int, cookie: str, *, host: str = "", origin: str = "") -> None:
        self.url = base.replace("http", "ws", 1) + f"/ws/runs/{run_id}/"
        self.headers = {"Cookie": cookie, "Origin": origin or base}
        if host:
            self.headers["Host"] = host
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.closed: str | None = None
        self.local_port = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._connected = threading.Event()
        self._thread = threading.Thread(
            target=self._loop.run_until_complete, args=(self._follow(),), daemon=True
        )
        self._thread.start()
        if not self._connected.wait(30):
            raise RuntimeError(f"websocket {self.url} did not connect: {self.closed}")
        if self.closed:
            raise RuntimeError(f"websocket {self.url} refused: {self.closed}")

    async def _follow(self) -> None:
        import aiohttp

        try:
            async with aiohttp.ClientSession() as session, session.ws_connect(self.url, headers=self.headers,
                                                                              heartbeat=None) as ws:  # fmt: skip
                self._ws = ws
                self.local_port = ws.get_extra_info("sockname")[
                    1
                ]  # which web process serves it: PlatformStack
                self._connected.set()
                async for frame in ws:
                    now = time.time()
                    if frame.type == aiohttp.WSMsgType.TEXT:
                        with self._lock:
                            self.messages.append((now, json.loads(frame.data)))
                self.closed = f"closed with code {ws.close_code}"
        except Exception as exc:
            self.closed = f"{type(exc).__name__}: {exc}"
        finally:
            self._connected.set()

    def snapshot(self) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            return list(self.messages)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for _, m in self.snapshot() if m.get("kind") == kind]

    def states(self) -> list[str]:
        return [e["event"]["data"]["to"] for e in self.of_kind("event")
                if e["event"]["kind"] == "status" and "to" in e["event"]["data"]]  # fmt: skip

    def points(self) -> list[tuple[str, int, float]]:
        """Every (key, step, value) received, in order (repeats kept: the caller can check for them)."""
        return [(k, step, value) for m in self.of_kind("metrics") for k, s in m["series"].items()
                for step, value in zip(s["steps"], s["values"], strict=True)]  # fmt: skip

    def wait_for(self, predicate: Callable[[Follower], Any], timeout_s: float, what: str) -> Any:
        def check() -> Any:
            if self.closed:
                raise RuntimeError(f"websocket {self.url} {self.closed} while waiting for {what}")
            return predicate(self)

        return wait_until(check, timeout_s, what, 0.05)

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None and not self.closed:
            asyncio.run_coroutine_threadsafe(ws.close(), self._loop).result(timeout=10)
        self._thread.join(timeout=10)
