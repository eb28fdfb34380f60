"""A real multi-node Ray cluster on this machine, for tests: a head (``ray start --head``) and worker nodes
(``ray start --address``), each its own ``ray start --block`` process in a session of its own, with its
own CPUs and custom resources: Ray schedules across them exactly as across machines. Worker nodes can
also join a head started elsewhere (the launcher's local head).

Start-up on a loaded machine. A raylet waits for its node's dashboard and runtime-env agents (Python
processes that import a lot) to write their ports to files in the session directory, and aborts after
15 s (hard-coded in Ray 2.5x+, whatever the ports given); ``ray start`` then gives the raylet 30 s to
register. On this 2-core machine at a load of 10-20 the agents' imports alone take longer: the cause of
the time-outs this test once hit. So every port is chosen here (free, distinct) and passed on the command
line, the node's id too (``RAY_OVERRIDE_NODE_ID_FOR_TESTING``, Ray's own test hook), and the agents' port
files are written here, with those very ports, as soon as the session directory exists: the raylet goes
on at once and the agents come up in their own time (Ray's later waits for them are long). Nodes start
one at a time, the head without the dashboard unless asked, without the autoscaler monitor and the log
monitor; a node whose start still failed is started again (``START_ATTEMPTS``). Stopping sends SIGTERM
to each ``ray start`` process (it stops its node's processes), then SIGKILL to whatever of its session
is left: never ``ray stop``, which would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 240.0  # per attempt; a node normally starts in seconds
START_ATTEMPTS = 4
STOP_TIMEOUT_S = 30.0
_READY = "Ray runtime started"
_OBJECT_STORE_BYTES = 200 * 2**20  # per node: the tests move a tiny model's weights


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports, held together while choosing (none is handed out twice), outside Ray's
    default worker-port range and Redis's port."""
    socks: list[socket.socket] = []
    try:
        while len(socks) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            if sock.getsockname()[1] == 6379 or 10002 <= sock.getsockname()[1] <= 19999:
                sock.close()
                continue
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class RayNode:
    name: str
    resources: dict[str, float]
    log_path: Path
    proc: subprocess.Popen[bytes]
    node_id: str  # chosen here (RAY_OVERRIDE_NODE_ID_FOR_TESTING)
    agent_ports: dict[str, int]  # port-file name -> the port given on the command line

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class LocalRayCluster:
    """``with LocalRayCluster(tmp).started(...) as cluster:`` a head and worker nodes of this machine."""

    tmp: Path
    env: Mapping[str, str] | None = None  # the nodes' environment (default: this process's)
    nodes: list[RayNode] = field(default_factory=list)
    gcs_port: int = 0
    dashboard_port: int = 0
    temp_dir: Path | None = None  # the head's, removed with it

    @property
    def address(self) -> str:
        """The GCS address ``ray.init(address=...)`` takes."""
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        """The Jobs API address (the head started with ``dashboard=True``)."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    @contextlib.contextmanager
    def started(
        self,
        *,
        head_cpus: float = 1,
        head_resources: Mapping[str, float] | None = None,
        workers: Sequence[tuple[float, Mapping[str, float]]] = (),
        dashboard: bool = False,
        join: tuple[str, Path] | None = None,
    ) -> Iterator[LocalRayCluster]:
        """Start the head (or ``join`` the head at (GCS address, its temp dir)), then each worker node
        (CPUs, custom resources), one at a time; stop the nodes started here on exit."""
        try:
            if join is None:
                self._start(lambda: self._spawn_head(head_cpus, dict(head_resources or {}), dashboard))
            else:
                self.gcs_port, self.temp_dir = int(join[0].rsplit(":", 1)[1]), Path(join[1])
            for cpus, resources in workers:
                self._start(lambda c=cpus, r=resources: self._spawn_worker(c, dict(r)))
            yield self
        finally:
            self.stop(remove_temp=join is None)

    # --- nodes ----------------------------------------------------------------------------------
    def _start(self, spawn: Callable[[], RayNode]) -> None:
        """Spawn a node and wait for it; a node that failed to start is started again."""
        failures = []
        for _ in range(START_ATTEMPTS):
            node = spawn()
            if self._wait_ready(node):
                self.nodes.append(node)
                return
            failures.append(node.log()[-2000:])
            self._stop_node(node)
        raise RuntimeError(
            f"Ray node {node.name} did not start in {START_ATTEMPTS} attempts; the last:\n{failures[-1]}"
        )

    def _spawn_head(self, cpus: float, resources: dict[str, float], dashboard: bool) -> RayNode:
        if self.temp_dir is not None:  # an earlier attempt's
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.gcs_port, self.dashboard_port, client_port = free_ports(3)
        self.temp_dir = Path("/tmp") / f"rlc-{os.getpid()}-{self.gcs_port}"  # short: socket paths are limited
        args = [
            "--head",
            f"--port={self.gcs_port}",
            f"--ray-client-server-port={client_port}",  # (ray start takes no 0 here)
            "--no-monitor",  # no autoscaler
            f"--include-dashboard={'true' if dashboard else 'false'}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--temp-dir={self.temp_dir}",
        ]
        return self._spawn("head", cpus, resources, args)

    def _spawn_worker(self, cpus: float, resources: dict[str, float]) -> RayNode:
        return self._spawn(f"worker{len(self.nodes)}", cpus, resources, [f"--address={self.address}"])

    def _spawn(self, name: str, cpus: float, resources: dict[str, float], args: list[str]) -> RayNode:
        grpc, listen, runtime_env, metrics, node_manager, object_manager = free_ports(6)
        cmd = [
            str(Path(sys.executable).parent / "ray"), "start", "--block", "--disable-usage-stats",
            *args, f"--num-cpus={cpus}", "--num-gpus=0", f"--resources={json.dumps(resources)}",
            f"--object-store-memory={_OBJECT_STORE_BYTES}",
            f"--dashboard-agent-grpc-port={grpc}", f"--dashboard-agent-listen-port={listen}",
            f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
            f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}",
            "--min-worker-port=0", "--max-worker-port=0",  # workers take any free port
            "--include-log-monitor=false",  # the tests read job logs through the Jobs API, not the driver
        ]  # fmt: skip
        node_id = secrets.token_hex(28)  # a Ray NodeID: 28 bytes
        env = dict(os.environ if self.env is None else self.env)
        env.update(
            {
                "RAY_USAGE_STATS_ENABLED": "0",
                "RAY_AUTH_MODE": "disabled",
                "RAY_OVERRIDE_NODE_ID_FOR_TESTING": node_id,
            }
        )
        self.tmp.mkdir(parents=True, exist_ok=True)
        log_path = self.tmp / f"ray-{name}-{time.monotonic_ns()}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,
            )  # fmt: skip
        ports = {
            "metrics_agent_port": grpc,
            "dashboard_agent_listen_port": listen,
            "runtime_env_agent_port": runtime_env,
            "metrics_export_port": metrics,
        }
        return RayNode(name, resources, log_path, proc, node_id, ports)

    def _wait_ready(self, node: RayNode) -> bool:
        """True once the node logged that it is up; False when it exited or timed out first. Meanwhile
        its agents' port files are written for the raylet (``_announce_agent_ports``)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while _READY not in node.log():
            if node.proc.poll() is not None or time.monotonic() > deadline:
                return False
            self._announce_agent_ports(node)
            time.sleep(0.2)
        return True

    def _announce_agent_ports(self, node: RayNode) -> None:
        """Write the node's agent port files into the session directory, as the agents do once their
        imports are done: the raylet waits for these files, 15 s at most (then it aborts), and the
        ports are the ones given on the command line, so the raylet need not wait for the agents."""
        latest = None if self.temp_dir is None else self.temp_dir / "session_latest"
        if latest is None or not latest.exists():
            return
        session = latest.resolve()
        for name, port in node.agent_ports.items():
            path = session / f"{name}_{node.node_id}"
            if not path.exists():
                tmp = path.with_name(f".{path.name}.tmp")
                tmp.write_text(str(port))
                tmp.replace(path)

    def stop(self, *, remove_temp: bool = True) -> None:
        """The nodes started here, workers first, then the head (and its temp dir)."""
        for node in reversed(self.nodes):
            self._stop_node(node)
        self.nodes.clear()
        if remove_temp and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    @staticmethod
    def _stop_node(node: RayNode) -> None:
        """SIGTERM to ``ray start`` (it stops the node's processes); then SIGKILL to whatever of its
        session is left (a node that failed to start may leave its GCS or agents behind)."""
        if node.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                node.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=STOP_TIMEOUT_S)
        # the node leads its own session (start_new_session): its members are its processes only
        for pid in _session_members(node.proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=10)


def _session_members(sid: int) -> list[int]:
    """The processes of session ``sid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
                out.append(int(stat.parent.name))
    return out


__all__ = ["LocalRayCluster", "RayNode", "free_ports"]
