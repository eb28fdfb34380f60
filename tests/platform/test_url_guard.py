"""The webhook SSRF guard (alerts/url_guard.py) against an address table written from the IANA special-
purpose address registries (IPv4 and IPv6), not from the ``ipaddress`` module the guard uses: every
address a webhook host may resolve to is either refused (with the reason's words) or public."""

from __future__ import annotations

import ipaddress

import pytest

from alerts.url_guard import UrlRefused, check

# (address, None: public, else words of the refusal)
TABLE = [
    # IPv4
    ("8.8.8.8", None),
    ("93.184.216.34", None),
    ("0.0.0.0", "unspecified"),
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"),
    ("100.64.0.1", "not a public address"),  # shared address space (carrier-grade NAT)
    ("192.0.0.1", "private"),  # IETF protocol assignments
    ("192.0.2.1", "private"),  # TEST-NET-1
    ("198.18.0.1", "private"),  # benchmarking
    ("198.51.100.1", "private"),  # TEST-NET-2
    ("203.0.113.1", "private"),  # TEST-NET-3
    ("224.0.0.1", "not a public address"),  # multicast
    ("240.0.0.1", "private"),  # reserved (future use)
    ("255.255.255.255", "private"),  # limited broadcast
    # IPv6
    ("2606:4700:4700::1111", None),
    ("2001:4860:4860::8888", None),
    ("::ffff:8.8.8.8", None),  # IPv4-mapped: the IPv4 address decides
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("::ffff:127.0.0.1", "loopback"),
    ("::ffff:10.1.2.3", "private"),
    ("::ffff:169.254.169.254", "link-local"),
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),  # unique local
    ("fd12:3456:789a::1", "private"),
    ("fec0::1", "site-local"),  # deprecated site-local, fec0::/10
    ("feff:ffff::1", "site-local"),
    ("2002:7f00:1::1", "6to4"),  # 6to4 of 127.0.0.1
    ("2002:a00:1::1", "6to4"),  # 6to4 of 10.0.0.1
    ("2002:a9fe:a9fe::1", "6to4"),  # 6to4 of 169.254.169.254
    ("2002:808:808::1", "6to4"),  # 6to4 of a public address: refused all the same
    ("64:ff9b::7f00:1", "private"),  # NAT64 of 127.0.0.1
    ("64:ff9b::808:808", "private"),  # NAT64: translated by a gateway of the platform's network
    ("::7f00:1", "private"),  # IPv4-compatible (deprecated)
    ("100::1", "private"),  # discard-only
    ("2001::1", "private"),  # Teredo
    ("2001:db8::1", "private"),  # documentation
    ("3fff::1", "documentation"),  # documentation (RFC 9637)
    ("ff02::1", "not a public address"),  # multicast
]


def _literal(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@pytest.mark.parametrize(("address", "why"), TABLE, ids=[a for a, _ in TABLE])
def test_every_address_of_the_table_is_refused_or_public_as_written(settings, address, why):
    settings.WEBHOOK_ALLOWED_HOSTS = []
    url = f"https://{_literal(address)}/hook"
    if why is None:
        assert ipaddress.ip_address(check(url).address) == ipaddress.ip_address(address)  # as written
        return
    with pytest.raises(UrlRefused) as err:
        check(url)
    message = str(err.value)
    # "private" stands for the refusals Python's ipaddress calls private or reserved
    assert why in message or (why == "private" and "not a public address" in message), message
