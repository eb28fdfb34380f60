"""The one codebase resolves to the embedded default without env, and to the production stack with it."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

PROBE = """
import json, django
django.setup()
from django.conf import settings
print(json.dumps({
    "db": settings.DATABASES["default"]["ENGINE"],
    "db_name": str(settings.DATABASES["default"]["NAME"]),
    "broker": settings.CELERY_BROKER_URL,
    "live_bus": settings.LIVE_BUS,
    "debug": settings.DEBUG,
}))
"""


def run_probe(env_extra: dict[str, str], code: str = PROBE) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_DEBUG", "DJANGO_SECRET_KEY", "SQLITE_PATH"}
    }
    env |= {
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONPATH": str(REPO_ROOT / "platform"),
    } | env_extra
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60
    )


@pytest.mark.smoke
def test_no_env_resolves_to_embedded_default(tmp_path):
    out = run_probe({"VAR_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert resolved["db"] == "django.db.backends.sqlite3"
    assert resolved["db_name"] == str(tmp_path / "db.sqlite3")
    assert resolved["broker"] == "filesystem://"
    assert resolved["live_bus"] is None  # in process
    assert resolved["debug"] is True


def test_database_and_redis_urls_resolve_to_production_stack(tmp_path):
    out = run_probe(
        {
            "VAR_DIR": str(tmp_path),
            "DATABASE_URL": "postgres://alice:s%40cret@db.internal:6543/rl",
            "REDIS_URL": "redis://cache.internal:6380/2",
        },
        PROBE.replace(
            '"db_name"',
            '"user": settings.DATABASES["default"]["USER"], '
            '"password": settings.DATABASES["default"]["PASSWORD"], '
            '"port": settings.DATABASES["default"]["PORT"], "db_name"',
        ),
    )
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)
    assert resolved["db"] == "django.db.backends.postgresql"
    assert (resolved["db_name"], resolved["user"], resolved["password"], resolved["port"]) == (
        "rl",
        "alice",
        "s@cret",
        "6543",
    )
    assert resolved["broker"] == "redis://cache.internal:6380/2"
    assert resolved["live_bus"]["url"] == "redis://cache.internal:6380/2"


def test_debug_off_without_secret_key_refuses_to_start_with_one_line(tmp_path):
    out = run_probe({"VAR_DIR": str(tmp_path), "DJANGO_DEBUG": "0"})
    assert out.returncode != 0
    assert out.stderr.strip() == "error: DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off"


def test_unsupported_database_url_is_a_one_line_error(tmp_path):
    out = run_probe({"VAR_DIR": str(tmp_path), "DATABASE_URL": "mysql://root@localhost/x"})
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("error: DATABASE_URL scheme 'mysql' is not supported")


def test_check_deploy_passes_with_production_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"SQLITE_PATH"}}
    env |= {
        "VAR_DIR": str(tmp_path),
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(64),
        "DJANGO_ALLOWED_HOSTS": "rl.example.com",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
        "REDIS_URL": "redis://127.0.0.1:6379/0",
    }
    out = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no issues" in out.stdout


LIVE_PROBE = """
import json, django
django.setup()
from django.conf import settings
print(json.dumps({
    "poll": settings.LIVE_POLL_INTERVAL_S,
    "proxy": settings.SECURE_PROXY_SSL_HEADER,
    "hosts": settings.ALLOWED_HOSTS,
    "db": {k: settings.DATABASES["default"].get(k) for k in ("CONN_MAX_AGE", "OPTIONS")},
}))
"""


def test_live_poll_follows_the_bus(tmp_path):
    embedded = json.loads(run_probe({"VAR_DIR": str(tmp_path)}, LIVE_PROBE).stdout)
    assert embedded["poll"] == 1.5  # the in-process bus cannot carry a worker's messages: poll
    redis = run_probe({"VAR_DIR": str(tmp_path), "REDIS_URL": "redis://cache.internal:6380/2"}, LIVE_PROBE)
    production = json.loads(redis.stdout)
    assert production["poll"] == 10.0  # Redis carries everything: the poll is a slow safety net
    forced = run_probe({"VAR_DIR": str(tmp_path), "REDIS_URL": "redis://x:1/0", "LIVE_POLL_INTERVAL_S": "2"},
                       LIVE_PROBE)  # fmt: skip
    assert json.loads(forced.stdout)["poll"] == 2.0


def test_deployments_sharing_one_redis_keep_their_live_channels_apart(tmp_path):
    probe = PROBE.replace('"debug": settings.DEBUG,', '"prefix": settings.LIVE_BUS["prefix"],')
    prefixes = [
        json.loads(
            run_probe({"VAR_DIR": str(tmp_path), "REDIS_URL": "redis://x:1/0", **queue}, probe).stdout
        )["prefix"]
        for queue in (
            {"CELERY_QUEUE": "celery"},
            {"CELERY_QUEUE": "staging"},
            {"CELERY_QUEUE": "test-123-abc"},
        )
    ]
    assert prefixes[0] == "rlp"
    assert len(set(prefixes)) == 3


def test_postgresql_connections_come_from_a_bounded_pool(tmp_path):
    """Django's persistent connections leak under ASGI (a thread per request): 20 busy runs exhausted
    PostgreSQL's connections (HTTP 500s). A pool per process bounds them."""
    env = {"VAR_DIR": str(tmp_path), "DATABASE_URL": "postgres://u@db:5432/rl", "DATABASE_POOL_SIZE": "12"}
    db = json.loads(run_probe(env, LIVE_PROBE).stdout)["db"]
    assert db == {"CONN_MAX_AGE": 0, "OPTIONS": {"pool": {"min_size": 1, "max_size": 12, "timeout": 30}}}


def test_proxy_ssl_header_only_when_configured_and_platform_url_host_is_allowed(tmp_path):
    plain = json.loads(run_probe({"VAR_DIR": str(tmp_path)}, LIVE_PROBE).stdout)
    assert plain["proxy"] is None  # nobody may claim HTTPS with a header unless a proxy sets it
    proxied = run_probe({"VAR_DIR": str(tmp_path), "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
                         "DJANGO_ALLOWED_HOSTS": "rl.example.com", "PLATFORM_URL": "http://web:8000"},
                        LIVE_PROBE)  # fmt: skip
    resolved = json.loads(proxied.stdout)
    assert resolved["proxy"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert resolved["hosts"] == ["rl.example.com", "web"]
    bad = run_probe({"VAR_DIR": str(tmp_path), "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https"})
    assert bad.returncode != 0 and bad.stderr.strip().startswith("error: DJANGO_SECURE_PROXY_SSL_HEADER=")
