"""Typed readers for the environment variables the platform understands (see README: Configuration)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote, urlparse


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise SystemExit(f"error: {name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"error: {name}={raw!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"error: {name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SystemExit(f"error: {name}={raw!r} is not a finite number")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


@dataclass(frozen=True)
class DatabaseUrl:
    engine: str
    name: str
    user: str
    password: str
    host: str
    port: str

    def as_django(self, pool_size: int = 20) -> dict[str, object]:
        """Connections come from a psycopg pool of at most ``pool_size`` per process (checked before
        use). Django's own persistent connections (CONN_MAX_AGE) leak under ASGI, where each request
        runs in a thread of its own: 20 busy runs exhausted PostgreSQL's 100 connections."""
        return {
            "ENGINE": self.engine,
            "NAME": self.name,
            "USER": self.user,
            "PASSWORD": self.password,
            "HOST": self.host,
            "PORT": self.port,
            "CONN_MAX_AGE": 0,  # required with the pool, which keeps the connections
            "CONN_HEALTH_CHECKS": True,
            "OPTIONS": {"pool": {"min_size": 1, "max_size": pool_size, "timeout": 30}},
        }


def parse_database_url(url: str) -> DatabaseUrl:
    """Parse ``postgres://user:pass@host:port/name`` (also ``postgresql://``) into Django terms."""
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise SystemExit(
            f"error: DATABASE_URL scheme {parsed.scheme!r} is not supported (use postgres://user@host:port/db)"
        )
    name = unquote(parsed.path.lstrip("/"))
    if not name:
        raise SystemExit("error: DATABASE_URL has no database name (postgres://user@host:port/NAME)")
    return DatabaseUrl(
        engine="django.db.backends.postgresql",
        name=name,
        user=unquote(parsed.username or ""),
        password=unquote(parsed.password or ""),
        host=parsed.hostname or "",
        port=str(parsed.port or ""),
    )


def platform_url_host(url: str) -> str:
    """The host name of PLATFORM_URL as ALLOWED_HOSTS spells it (IPv6 in brackets); "" when it has none."""
    host = urlparse(url).hostname or ""
    return f"[{host}]" if ":" in host else host


def proxy_ssl_header(name: str) -> tuple[str, str] | None:
    """DJANGO_SECURE_PROXY_SSL_HEADER (a header name such as ``X-Forwarded-Proto``) in Django's form,
    ``("HTTP_X_FORWARDED_PROTO", "https")``; None when unset."""
    if not name:
        return None
    if not all(c.isalnum() or c == "-" for c in name):
        raise SystemExit(
            f"error: DJANGO_SECURE_PROXY_SSL_HEADER={name!r} is not a header name (e.g. X-Forwarded-Proto)"
        )
    return "HTTP_" + name.upper().replace("-", "_"), "https"
