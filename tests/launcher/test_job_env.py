"""A job never sees the platform's settings (docs/api.md, "Trust boundary"): the local Ray head is started
with an allow-list of the worker's environment, and every job gets only the engine's own settings on top.
The platform's settings are read out of platform/config/settings.py (every ``env_*("NAME")``), so a new
setting is covered without editing this test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher import job_env, jobs, ray_local
from rl_engine.config import parse_config
from rl_engine.jobspec import IngestSpec, JobSpec, Placement
from tests.conftest import REPO_ROOT

SETTINGS_FILE = REPO_ROOT / "platform" / "config" / "settings.py"
# Read by Django, Celery and the test suite rather than through config.env; secrets all the same.
EXTRA = ("DJANGO_SETTINGS_MODULE", "CELERY_BROKER_URL", "REDIS_PASSWORD", "PGPASSWORD", "SECRET_KEY")


def platform_settings() -> list[str]:
    names = set(re.findall(r'env_[a-z]+\(\s*"([A-Z][A-Z0-9_]*)"', SETTINGS_FILE.read_text())) | set(EXTRA)
    assert {"DATABASE_URL", "DJANGO_SECRET_KEY", "REDIS_URL"} <= names
    return sorted(names)


def _spec() -> JobSpec:
    ingest = IngestSpec(url="http://platform.invalid:8000", run_id="7", token_file="/runs/7/ingest-token")
    placement = Placement(checkpoint_dir="/runs/7/checkpoints", data_roots=("/data",))
    return JobSpec(config=parse_config({"model": {"path": "m"}}), placement=placement, ingest=ingest)


def test_the_head_environment_is_an_allow_list(settings, monkeypatch):
    """What ``ray_local`` starts the head with (so what every job driver and worker inherits)."""
    settings.ENGINE_ENV_PASSTHROUGH = ["SITE_PROXY_CONFIG"]
    worker = {name: f"leak-{name}" for name in platform_settings()}
    worker |= {"PATH": "/usr/bin", "HOME": "/home/w", "HF_HOME": "/cache/hf", "CUDA_VISIBLE_DEVICES": "0",
               "MLFLOW_TRACKING_TOKEN": "engine's", "SITE_PROXY_CONFIG": "x", "UNRELATED_TOOL_TOKEN": "t"}  # fmt: skip
    for name, value in worker.items():
        monkeypatch.setenv(name, value)
    env = ray_local.head_env()
    assert not [k for k, v in env.items() if v.startswith("leak-")]
    assert {
        "PATH",
        "HOME",
        "HF_HOME",
        "CUDA_VISIBLE_DEVICES",
        "MLFLOW_TRACKING_TOKEN",
        "SITE_PROXY_CONFIG",
    } <= set(env)
    assert "UNRELATED_TOOL_TOKEN" not in env and env["RAY_USAGE_STATS_ENABLED"] == "0"


def test_a_job_gets_the_engines_settings_and_nothing_else():
    env = job_env.job_env(_spec().env())
    assert {k for k in env if not k.startswith("RL_ENGINE_")} == {"PYTHONPATH", "PYTHONUNBUFFERED",
                                                                  "RAY_USAGE_STATS_ENABLED"}  # fmt: skip
    with pytest.raises(ValueError, match="DATABASE_URL"):
        job_env.job_env({"DATABASE_URL": "postgres://secret"})


PROBE = """
import json, os, ray
ray.init(address="auto", logging_level="ERROR")
worker = ray.get(ray.remote(lambda: dict(os.environ)).remote())
print("ENVS " + json.dumps({"driver": dict(os.environ), "worker": worker}))
"""


@pytest.mark.slow
def test_a_real_jobs_driver_and_workers_see_none_of_the_platforms_settings(settings, monkeypatch, tmp_path):
    """Every platform setting is in the worker's environment (as in production) when the local head
    starts; a real job on that head, and a Ray task it runs (where model code runs), sees none."""
    for name in platform_settings():
        monkeypatch.setenv(name, f"leak-{name}")
    settings.RAY_LOCAL_DIR = str(tmp_path / "ray")  # a head of this test's own
    settings.RAY_LOCAL_NUM_CPUS = 1
    info = ray_local.ensure_started()
    monkeypatch.undo()  # only the head had to start among them (this process's Ray client reads RAY_ADDRESS)
    try:
        probe = tmp_path / "probe.py"
        probe.write_text(PROBE)
        sid = f"env-probe-{tmp_path.name}"
        jobs.submit(info.dashboard_url, submission_id=sid, entrypoint=f"{ray_local.sys.executable} {probe}",
                    env=job_env.job_env(_spec().env()), metadata={})  # fmt: skip
        final = jobs.wait_terminal(info.dashboard_url, sid, timeout=240, poll_s=1.0)
        log = jobs.logs(info.dashboard_url, sid)
    finally:
        ray_local.stop()
    assert final is not None and final.status == "SUCCEEDED", log[-3000:]
    [line] = [ln for ln in log.splitlines() if ln.startswith("ENVS ")]
    seen = json.loads(line.removeprefix("ENVS "))
    for where, env in seen.items():
        leaked = sorted(k for k, v in env.items() if "leak-" in v)
        assert not leaked, f"the job's {where} sees the platform's {leaked}"
        assert env["RL_ENGINE_INGEST_URL"] == "http://platform.invalid:8000" and env["PATH"], where
        assert env["RL_ENGINE_DATA_ROOTS"] == "/data"
    assert Path(seen["driver"]["PYTHONPATH"].split(":")[0]).is_dir()
