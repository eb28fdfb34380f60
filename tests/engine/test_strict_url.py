"""The one strict URL parser (rl_engine/strict_url.py) against the parsers clients really use: what it
accepts, Python's ``urlsplit`` and ``urllib3`` (the HTTP client under MLflow's) read identically; the
strings on which they disagree are refused."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from urllib3.util import parse_url

from rl_engine.config import ConfigError, parse_config
from rl_engine.jobspec import Placement
from rl_engine.strict_url import UrlError, parse_strict_url

ATTACKS = [
    "http://EVIL\\@mlflow:5000",  # urlsplit: host mlflow; urllib3 / browsers: host EVIL
    "http://mlflow:5000\\@evil.example",
    "http://mlflow:5000@evil.example",  # user-info
    "http://user:pw@mlflow:5000",
    "https://ml.example.com/teamA/%2e%2e/teamB",  # encoded dot segment
    "https://ml.example.com/teamA/%2E%2E%2fteamB",
    "https://ml.example.com/teamA/../teamB",
    "https://ml.example.com/teamA/./x",
    "https://ml.example.com/teamA//teamB",
    "http://mlflow:5000/\x00",
    "http://mlflow:5000\r\nHost: evil",
    "http://mlflow :5000",
    " http://mlflow:5000",
    "http://mlflow\t:5000",
    "http://\uff4dlflow:5000",  # full-width m: NFKC (IDNA) folds it to m
    "http://mlflow:5000#@evil.example",
    "http://mlflow:5000?@evil.example",
    "http://2130706433:5000",  # 127.0.0.1 to getaddrinfo
    "http://127.1:5000",
    "http://0x7f.0.0.1:5000",
    "http://mlflow.:5000",
    "http://mlflow:05000",
    "http://mlflow:99999",
    "http://mlflow:",
    "http://:5000",
    "http:///mlflow:5000",
    "http:mlflow:5000",
    "ftp://mlflow:5000",
    "HTTP://mlflow:5000",
    "http://[::1:5000",
]


@pytest.mark.parametrize("url", ATTACKS)
def test_every_string_parsers_read_differently_is_refused(url):
    with pytest.raises(UrlError):
        parse_strict_url(url)


def test_the_backslash_attack_is_a_real_parser_difference():
    """Why the grammar exists: the two parsers disagree on the host of the attack string."""
    attack = "http://EVIL\\@mlflow:5000"
    assert urlsplit(attack).hostname == "mlflow"
    assert parse_url(attack).host != "mlflow"


def test_accepted_urls_are_compared_by_scheme_host_port_and_path():
    allowed = parse_strict_url("https://ml.example.com/team-a")
    assert parse_strict_url("https://ML.example.com:443/team-a/x/").within(allowed)
    assert parse_strict_url("https://ml.example.com/team-a").within(allowed)
    for other in (
        "https://ml.example.com/team-ab",
        "https://ml.example.com/team-b",
        "http://ml.example.com/team-a",
        "https://ml.example.com:8443/team-a",
        "https://ml.example.com.evil/team-a",
    ):
        assert not parse_strict_url(other).within(allowed), other
    assert parse_strict_url("http://[::1]:5000").host == "::1"
    assert parse_strict_url("http://10.0.0.7").port == 80


URL_TEXT = st.text(
    alphabet=st.sampled_from([*"htps:/[]@\\%.2e:0915mlfow-_~?#AZ \t\x00", "\uff4d", "\u200b"]),
    max_size=40,
).map(lambda rest: "http://" + rest)


@settings(max_examples=3000, deadline=None)
@given(URL_TEXT)
def test_what_the_grammar_accepts_every_parser_reads_the_same(url):
    """Property: for any accepted string, urlsplit and urllib3 agree with it on host, port and path."""
    try:
        ours = parse_strict_url(url)
    except UrlError:
        return
    split, u3 = urlsplit(url), parse_url(url)
    assert (split.hostname or "").strip("[]") == ours.host == (u3.host or "").strip("[]").lower()
    assert (split.port or 80) == ours.port == (u3.port or 80)
    assert split.path.rstrip("/") == ours.path == (u3.path or "").rstrip("/")
    assert not split.username and u3.auth is None and not split.query and not split.fragment


def test_the_engine_config_refuses_them_too():
    raw: dict = {"model": {"path": "m"}, "logging": {"mlflow": {"tracking_uri": "http://EVIL\\@mlflow:5000"}}}
    with pytest.raises(ConfigError, match=r"logging\.mlflow\.tracking_uri"):
        parse_config(raw)
    for good in ("http://mlflow:5000", "sqlite:///mlflow.db"):
        raw["logging"]["mlflow"]["tracking_uri"] = good
        parse_config(raw)


def test_the_placement_refuses_a_ray_address_with_user_info():
    with pytest.raises(ValidationError, match="user-info"):
        Placement(ray_address="ray://a@b:1")
    for good in ("auto", "10.0.0.1:6379", "ray://head:10001"):
        assert Placement(ray_address=good).ray_address == good
