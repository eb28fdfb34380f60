"""docker/compose.yaml with docker/env.example is consistent: every URL a service calls names a service
of the stack, and each call that reaches the web server is to an allowed host and is not redirected to
HTTPS — checked against the settings those very variables produce (DEBUG off, HTTPS redirect on)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from tests.conftest import REPO_ROOT

DOCKER = REPO_ROOT / "docker"
PLATFORM_SERVICES = ("migrate", "web", "worker", "beat")
LONG_RUNNING = ("postgres", "redis", "web", "worker", "beat", "ray-head")
# What the engine posts to PLATFORM_URL (rl_engine/sinks/http.py): run 1's ingestion endpoints.
ENGINE_PATHS = ("/api/runs/1/metrics", "/api/runs/1/events", "/api/runs/1/samples", "/api/runs/1/heartbeat")
SECRETS = ("DJANGO_SECRET_KEY", "POSTGRES_PASSWORD", "DATABASE_URL")

PROBE = """
import json, sys, django
django.setup()
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.middleware.security import SecurityMiddleware
from django.test import RequestFactory
from urllib.parse import urlparse

out = {"ssl_redirect": settings.SECURE_SSL_REDIRECT, "debug": settings.DEBUG, "calls": {}}
for url in json.loads(sys.argv[1]):
    u = urlparse(url)
    request = RequestFactory().post(u.path, HTTP_HOST=u.netloc, secure=u.scheme == "https")
    try:
        request.get_host()
        allowed = True
    except DisallowedHost:
        allowed = False
    redirect = SecurityMiddleware(lambda r: None).process_request(request)
    out["calls"][url] = {"allowed": allowed, "redirect": redirect["Location"] if redirect else None}
print(json.dumps(out))
"""


def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def env_example() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (DOCKER / "env.example").read_text().splitlines())
    return {k.strip(): v.strip() for k, *rest in pairs if k.strip() and not k.startswith("#") for v in rest}


def interpolate(value: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: variables[m.group(1)], str(value))


def service_env(service: dict[str, Any]) -> dict[str, str]:
    """What a container of ``service`` sees: its env_file (docker/.env, i.e. env.example) then its
    ``environment``, with ``${VAR}`` taken from the .env file as compose does."""
    dotenv = env_example()
    env = dict(dotenv) if ".env" in (service.get("env_file") or []) else {}
    env |= {k: interpolate(v, dotenv) for k, v in (service.get("environment") or {}).items()}
    return env


def probe(env: dict[str, str], urls: list[str], tmp_path: Path) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_", "REDIS_"))}
    clean |= env | {"VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "config.settings",
                    "PYTHONPATH": str(REPO_ROOT / "platform")}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(urls)], env=clean, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def healthcheck_urls(service: dict[str, Any]) -> list[str]:
    test = (service.get("healthcheck") or {}).get("test") or []
    return [word for word in test if isinstance(word, str) and word.startswith("http")]


def test_every_call_into_the_web_server_is_allowed_and_not_redirected(tmp_path):
    services = compose()["services"]
    web_env = service_env(services["web"])
    engine_base = web_env["PLATFORM_URL"]  # the launcher hands this URL to the engine
    for name in PLATFORM_SERVICES:
        assert service_env(services[name])["PLATFORM_URL"] == engine_base, name
    assert urlparse(engine_base).hostname == "web" and urlparse(engine_base).port == 8000
    assert "0.0.0.0:8000" in services["web"]["command"]  # the web tier listens where the engine posts
    calls = [engine_base + path for path in ENGINE_PATHS] + healthcheck_urls(services["web"])
    assert len(calls) == len(ENGINE_PATHS) + 1, "the web service has an HTTP health check"
    user_call = f"http://{web_env['DJANGO_ALLOWED_HOSTS'].split(',')[0]}/api/runs"
    result = probe(web_env, [*calls, user_call], tmp_path)
    assert result["debug"] is False and result["ssl_redirect"] is True  # the production settings
    for url in calls:
        assert result["calls"][url] == {"allowed": True, "redirect": None}, url
    # A browser's plain-HTTP request to the public name is still sent to HTTPS.
    assert result["calls"][user_call]["redirect"].startswith("https://")


def test_every_url_a_service_is_given_names_a_service_of_the_stack():
    services = compose()["services"]
    for name in PLATFORM_SERVICES:
        env = service_env(services[name])
        for var in ("DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "PLATFORM_URL"):
            host = urlparse(env[var]).hostname
            assert host in services, f"{name}: {var} points at {host!r}, which is not a service"


def test_the_ray_head_gets_no_secret_and_long_running_services_restart_and_report_health():
    services = compose()["services"]
    head = services["ray-head"]
    env = service_env(head)
    assert not head.get("env_file"), "the Ray head (the engine's jobs) must not read docker/.env"
    assert not set(SECRETS) & set(env), env
    assert not any(secret in json.dumps(head) for secret in ("POSTGRES_PASSWORD", "SECRET_KEY"))
    for name in LONG_RUNNING:
        assert services[name].get("restart") == "unless-stopped", name
        assert services[name].get("healthcheck", {}).get("test"), name
    assert services["migrate"]["restart"] == "no"
