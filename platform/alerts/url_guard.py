"""Where a webhook may point: the SSRF guard of the platform's outbound requests.

A webhook URL is a request the platform makes on a project member's behalf, from inside its network.
It must be ``http`` or ``https`` with a host name and no credentials, and **every** address the name
resolves to must be a public one: not loopback, link-local (the cloud metadata service, 169.254.169.254),
private (RFC 1918, unique-local IPv6), shared (100.64/10), multicast, reserved or unspecified, nor an
IPv6 range the standard library counts as global that leads elsewhere (site-local ``fec0::/10``; every
6to4 address, ``2002::/16``, whatever IPv4 address it embeds; documentation ``3fff::/20``), and none
of the addresses of the platform's own services (``PLATFORM_URL``, the database, Redis, the Ray
cluster) — unless the host is listed, verbatim, in the administrator's ``WEBHOOK_ALLOWED_HOSTS``.

The check returns the address to connect to, and delivery connects to exactly that address (with the
name as the Host header and as TLS SNI and certificate name), so a name that resolves to a public
address when checked and to a private one a moment later (DNS rebinding) cannot slip through. Redirects
are never followed: a 3xx answer is a failed attempt.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

SCHEMES = {"http": 80, "https": 443}
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# IPv6 ranges Python's ``is_global`` (3.11) lets through. 6to4 is refused whole (it is deprecated, RFC
# 7526): a relay the platform does not choose forwards it to the IPv4 address it embeds.
REFUSED_V6 = (
    (ipaddress.IPv6Network("fec0::/10"), "a site-local address (fec0::/10)"),
    (ipaddress.IPv6Network("2002::/16"), "a 6to4 address (2002::/16), relayed to the IPv4 address it embeds"),
    (ipaddress.IPv6Network("3fff::/20"), "a documentation address (3fff::/20)"),
)


class UrlRefused(ValueError):
    """The URL is not one the platform will send to (the message says why, for the API's 400)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as written (lower case), without brackets
    port: int
    path: str  # path and query, at least "/"
    address: str  # the checked address to connect to

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == SCHEMES[self.scheme] else f"{host}:{self.port}"


def allowed_hosts() -> set[str]:
    return {
        h.strip().lower().strip("[]") for h in getattr(settings, "WEBHOOK_ALLOWED_HOSTS", []) if h.strip()
    }


def parse(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of a well-formed http(s) URL, else UrlRefused."""
    if not isinstance(url, str) or not url or len(url) > 2000:
        raise UrlRefused("must be an http(s) URL of at most 2000 characters")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise UrlRefused("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UrlRefused(f"is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise UrlRefused(f"scheme {scheme or '(none)'!r} is not allowed: use http or https")
    if parts.username is not None or parts.password is not None:
        raise UrlRefused("must not carry credentials (user:password@); use the webhook's secret")
    host = (parts.hostname or "").lower()
    if not host:
        raise UrlRefused("has no host")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return scheme, host, port or SCHEMES[scheme], path


def _resolve(host: str, port: int) -> list[IpAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise UrlRefused(f"host {host!r} does not resolve ({exc})") from None
    out: list[IpAddress] = []
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if addr not in out:
            out.append(addr)
    if not out:
        raise UrlRefused(f"host {host!r} does not resolve")
    return out


def _own_service_addresses() -> set[IpAddress]:
    """The addresses of the platform's own services (web, database, Redis, Ray), as resolved now."""
    urls = [getattr(settings, name, "") or "" for name in ("PLATFORM_URL", "REDIS_URL", "RAY_ADDRESS")]
    db = settings.DATABASES.get("default", {})
    hosts = {urlsplit(u if "://" in u else f"x://{u}").hostname for u in urls if u}
    if db.get("HOST"):
        hosts.add(str(db["HOST"]))
    out: set[IpAddress] = set()
    for host in filter(None, hosts):
        with contextlib.suppress(UrlRefused):
            out.update(_resolve(host, 0))
    return out


def _why_not_public(addr: IpAddress) -> str | None:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if isinstance(addr, ipaddress.IPv6Address):
        for network, why in REFUSED_V6:
            if addr in network:
                return why
    if addr.is_unspecified:
        return "an unspecified address"
    if addr.is_loopback:
        return "a loopback address"
    if addr.is_link_local:
        return "a link-local address (e.g. the cloud metadata service)"
    if addr.is_private:
        return "a private address"
    if addr.is_multicast or addr.is_reserved or not addr.is_global:
        return "not a public address"
    return None


def check(url: str) -> Target:
    """The URL's target if the platform may send to it now, else UrlRefused (the reason in its text)."""
    scheme, host, port, path = parse(url)
    addresses = _resolve(host, port)
    if host not in allowed_hosts():
        own = _own_service_addresses()
        for addr in addresses:
            why = _why_not_public(addr)
            if why is None and addr in own:
                why = "an address of the platform's own services"
            if why is not None:
                raise UrlRefused(
                    f"host {host!r} resolves to {addr}, {why}; an administrator can allow the host "
                    "in WEBHOOK_ALLOWED_HOSTS"
                )
    return Target(scheme=scheme, host=host, port=port, path=path, address=str(addresses[0]))
