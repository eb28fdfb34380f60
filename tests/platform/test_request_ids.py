"""Ids in a request's path or query string never make a 500 (accounts/ids.py): ``str.isdigit()`` accepts
"²" (``int()`` refuses it) and other non-ASCII digits, and an id beyond a bigint overflows in the database.
Every web page and API route taking an id (in its path: found in the URL configuration; in its query
string: listed here) is requested with such values, logged in as a member of a project that has data, and
must answer below 500. A property test draws values and routes; a table covers each route with the
values that once failed."""

from __future__ import annotations

import sys
import unicodedata

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from accounts.ids import MAX_DB_ID, parse_db_id, parse_db_ids
from sweeps.services import SweepSpec, sweep_create
from tests.factories import ExperimentFactory

pytestmark = pytest.mark.django_db

# Every character str.isdigit() accepts that is not an ASCII digit ("²", Arabic-Indic, Bengali, mathematical bold digits, ...).
UNICODE_DIGITS = sorted(
    chr(c) for c in range(sys.maxunicode + 1) if chr(c).isdigit() and not chr(c).isascii()
)
assert "²" in UNICODE_DIGITS and "\u0661" in UNICODE_DIGITS

BAD_IDS = [
    "²",
    "\u0661\u0662",  # Arabic-Indic "12": int() reads it
    "1²",
    str(2**63),  # one past a bigint
    "99999999999999999999",
    "9" * 5000,  # past int()'s digit limit
    "0",
    "-1",
    "+1",
    " 1",
    "1_0",
    "",
]


def path_routes() -> list[str]:
    """Every URL pattern with an ``<int:...>`` segment, as a template with ``{}`` for each id."""
    found: list[str] = []

    def walk(patterns: list, prefix: str) -> None:
        for p in patterns:
            route = str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + route)
            elif isinstance(p, URLPattern) and "<int:" in route:
                template = prefix + route
                while "<int:" in template:
                    start = template.index("<int:")
                    template = template[:start] + "{}" + template[template.index(">", start) + 1 :]
                found.append("/" + template)

    walk(get_resolver().url_patterns, "")
    return sorted(set(found))


PATH_ROUTES = path_routes()
# Routes that read an id (or a list of ids) from the query string; "{}" is the value.
QUERY_ROUTES = [
    "/experiments/new/?from={}",
    "/experiments/new/?project={}",
    "/compare/?runs={}",
    "/compare/?runs=1,{}",
    "/api/experiments?project={}",
    "/api/runs?project={}",
    "/api/runs?experiment={}",
    "/api/runs/compare?ids={}",
    "/api/runs/compare?ids=1,{}",
    "/api/schema/experiment?project={}",
    "/api/alerts?project={}",
    "/api/alerts?run={}",
    "/api/alert-rules?project={}",
    "/api/webhooks?project={}",
    "/api/sweeps?project={}",
    "/api/sweeps?experiment={}",
]


def test_the_route_lists_cover_the_pages_and_the_api():
    assert {"/experiments/{}/", "/runs/{}/", "/sweeps/{}/", "/projects/{}/"} <= set(PATH_ROUTES)
    api = {"/api/runs/{}", "/api/runs/{}/metrics", "/api/experiments/{}", "/api/sweeps/{}"}
    assert api <= set(PATH_ROUTES)
    assert len(PATH_ROUTES) > 30


@pytest.fixture
def clients(team):
    """A web client (session) and an API client, both the owner of a project with an experiment, runs and a
    sweep, so that a value read as a small id finds real rows."""
    owner = team["owner"]
    exp = ExperimentFactory(project=team["project"], created_by=owner)
    sweep_create(  # (and its two runs)
        experiment=exp,
        user=owner,
        spec=SweepSpec(name="s", method="grid", search_space={"trainer.lr": [1e-6, 2e-6]}, metric="k"),
    )
    web = Client(raise_request_exception=False)
    web.force_login(owner)
    api = APIClient(raise_request_exception=False)
    api.force_authenticate(owner)
    return {"web": web, "api": api}


def request_every_method(clients: dict, url: str) -> list[tuple[str, int]]:
    """GET, and for an API route also POST, PATCH and DELETE (an empty JSON body): each status."""
    if not url.startswith("/api/"):
        return [("GET", clients["web"].get(url).status_code)]
    api = clients["api"]
    answers = [("GET", api.get(url).status_code)]
    for method in ("post", "patch", "delete"):
        answers.append((method.upper(), getattr(api, method)(url, {}, format="json").status_code))
    return answers


def assert_no_500(clients: dict, template: str, value: str) -> None:
    from urllib.parse import quote

    url = template.replace("{}", quote(value, safe=",") if "?" in template else quote(value))
    for method, status in request_every_method(clients, url):
        assert status < 500, f"{method} {url[:200]} -> {status}"


@pytest.mark.parametrize("value", BAD_IDS, ids=lambda v: repr(v)[:24])
def test_no_route_answers_500_to_a_malformed_or_out_of_range_id(clients, value):
    for template in PATH_ROUTES + QUERY_ROUTES:
        assert_no_500(clients, template, value)


ID_TEXT = st.one_of(
    st.text(st.sampled_from(UNICODE_DIGITS), min_size=1, max_size=4),  # digits, none ASCII
    st.text(st.sampled_from([*UNICODE_DIGITS[::10], *"0123456789"]), min_size=2, max_size=6).filter(
        lambda t: not t.isascii()
    ),  # mixed
    st.integers(min_value=MAX_DB_ID + 1, max_value=10**40).map(str),  # past a bigint
    st.integers(max_value=0).map(str),
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(template=st.sampled_from(PATH_ROUTES + QUERY_ROUTES), value=ID_TEXT)
@example(template="/experiments/new/?from={}", value="²")
@example(template="/experiments/new/?project={}", value="²")
@example(template="/compare/?runs={}", value="²")
@example(template="/compare/?runs=1,{}", value="99999999999999999999")
def test_property_no_route_answers_500_to_an_id_that_is_not_one(clients, template, value):
    assert_no_500(clients, template, value)


@given(value=ID_TEXT)
@settings(max_examples=300, derandomize=True)
def test_the_parser_takes_only_ascii_digits_within_a_bigint(value):
    assert parse_db_id(value) is None


@given(n=st.integers(min_value=1, max_value=MAX_DB_ID))
@settings(max_examples=300, derandomize=True)
def test_the_parser_reads_every_id_in_range(n):
    assert parse_db_id(str(n)) == n and parse_db_id(n) == n and parse_db_id(f"00{n}") == n


def test_the_parser_refuses_every_non_ascii_digit():
    assert all(parse_db_id(c) is None and parse_db_id("1" + c) is None for c in UNICODE_DIGITS)
    assert [unicodedata.digit(c, None) for c in ("²", "\u0661")] == [2, 1]  # (digits indeed)
    for text in ("", "-1", "+1", " 1", "1 ", "1_0", "0", "1.0", str(MAX_DB_ID + 1), "9" * 5000):
        assert parse_db_id(text) is None, text
    assert parse_db_id(True) is None and parse_db_id(0) is None and parse_db_id(MAX_DB_ID) == MAX_DB_ID


def test_an_id_list_keeps_the_valid_ids_once_in_order():
    assert parse_db_ids("3, 1,²,3,x,,99999999999999999999,2", limit=12) == [3, 1, 2]
    assert parse_db_ids(",".join(map(str, range(1, 40))), limit=12) == list(range(1, 13))
