"""One strict parser for the network URLs a config may name (docs/api.md, "Trust boundary").

Python's ``urlsplit``, ``urllib3`` (what MLflow's client connects with) and browsers disagree on odd
URLs: ``http://EVIL\\@mlflow:5000`` is host ``mlflow`` to ``urlsplit`` and host ``EVIL`` to a client
that treats the backslash as the end of the authority, and ``/teamA/%2e%2e/teamB`` is a different path
before and after percent-decoding. An allow-list compared through one parser is bypassed through the
other. So a URL is accepted only in a grammar every parser reads the same way:

    scheme "://" host [":" port] [path]
    host  = DNS name, compared in lower case (letters, digits, "-", "."; no empty label, no trailing dot, last label
            not all digits) | dotted-quad IPv4 | "[" IPv6 "]"
    port  = 1..65535, decimal, no leading zero
    path  = ("/" segment)*  segment = [A-Za-z0-9._~-]+, never "." or ".."

Nothing else: no user-info (``@``), backslash, percent-encoding, whitespace, control character,
non-ASCII, query or fragment. Pure standard library (the platform imports it; no torch, ray, Django).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_PORTS = {"http": 80, "https": 443, "ray": 10001}
_SHAPE = re.compile(r"^([a-z][a-z0-9+.-]*)://([^/]*)(/.*)?$")
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_SEGMENT = re.compile(r"^[A-Za-z0-9._~-]+$")
_PORT = re.compile(r"^[1-9][0-9]{0,4}$")
_FORBIDDEN = (
    ("@", "must not contain user-info ('@')"),
    ("\\", "must not contain a backslash"),
    ("%", "must not contain percent-encoding ('%')"),
    ("?", "must not contain a query ('?')"),
    ("#", "must not contain a fragment ('#')"),
)


class UrlError(ValueError):
    """Why a URL is refused (one line, for a 400 naming the field)."""


@dataclass(frozen=True)
class StrictUrl:
    """A URL as the strict grammar reads it: what an allow-list compares."""

    scheme: str
    host: str  # lower case; an IPv6 address in its compressed form, without brackets
    port: int  # the scheme's default port where none was written
    path: str  # "" or "/seg/seg" (no trailing slash)

    def within(self, allowed: StrictUrl) -> bool:
        """Same scheme, host and port exactly, and the path is ``allowed.path`` or below it."""
        if (self.scheme, self.host, self.port) != (allowed.scheme, allowed.host, allowed.port):
            return False
        return not allowed.path or self.path == allowed.path or self.path.startswith(allowed.path + "/")


def _host(text: str) -> str:
    if text.startswith("["):
        if not text.endswith("]"):
            raise UrlError("has an unterminated IPv6 address")
        try:
            return ipaddress.IPv6Address(text[1:-1]).compressed
        except ValueError:
            raise UrlError(f"has an invalid IPv6 address {text!r}") from None
    if not text:
        raise UrlError("has no host")
    text = text.lower()  # host names are case-insensitive; every parser agrees on ASCII lower case
    labels = text.split(".")
    if all(label.isdigit() for label in labels):
        try:  # only the canonical dotted quad: "2130706433", "0x7f.1" or "127.1" are refused
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            raise UrlError(f"has an invalid IPv4 address {text!r}") from None
    if len(text) > 253 or not all(_LABEL.match(label) for label in labels) or labels[-1].isdigit():
        raise UrlError(f"has an invalid host name {text!r}")
    return text


def parse_strict_url(text: str, *, schemes: tuple[str, ...] = ("http", "https")) -> StrictUrl:
    """``text`` read by the strict grammar above; raises UrlError saying what is wrong."""
    if not isinstance(text, str):
        raise UrlError("must be a string")
    if not text.isascii() or not text.isprintable() or any(c.isspace() for c in text):
        raise UrlError("must be ASCII without whitespace or control characters")
    for char, problem in _FORBIDDEN:
        if char in text:
            raise UrlError(problem)
    shape = _SHAPE.match(text)
    if shape is None:
        raise UrlError("must look like scheme://host[:port][/path]")
    scheme, authority, path = shape.group(1), shape.group(2), shape.group(3) or ""
    if scheme not in schemes:
        raise UrlError(f"must use {' or '.join(schemes)}, not {scheme!r}")
    host_text, port_text = authority, ""
    if authority.startswith("["):
        end = authority.find("]")
        host_text, rest = authority[: end + 1], authority[end + 1 :]
        if rest and not rest.startswith(":"):
            raise UrlError("has text after its IPv6 address")
        port_text = rest[1:] if rest else ""
        if rest and not port_text:
            raise UrlError("has an empty port")
    elif ":" in authority:
        host_text, port_text = authority.split(":", 1)
        if not port_text:
            raise UrlError("has an empty port")
    if port_text and (not _PORT.match(port_text) or int(port_text) > 65535):
        raise UrlError(f"has an invalid port {port_text!r}")
    host = _host(host_text)
    port = int(port_text) if port_text else DEFAULT_PORTS.get(scheme, 0)
    if not port:
        raise UrlError("must name a port")
    segments = path.split("/")[1:] if path else []
    if segments and segments[-1] == "":
        segments.pop()  # one trailing slash is the same path
    for segment in segments:
        if not _SEGMENT.match(segment) or segment in (".", ".."):
            raise UrlError(f"has a path segment {segment!r} outside [A-Za-z0-9._~-] (or a dot segment)")
    return StrictUrl(scheme, host, port, "".join("/" + s for s in segments))


def url_problem(text: str, *, schemes: tuple[str, ...] = ("http", "https")) -> str | None:
    """None when ``text`` parses; else why not."""
    try:
        parse_strict_url(text, schemes=schemes)
    except UrlError as exc:
        return str(exc)
    return None
