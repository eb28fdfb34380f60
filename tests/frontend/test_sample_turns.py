"""The sample browser shows a multi-turn episode turn by turn: the samples list the run page reads
carries the episode's turns as the engine posted them, and the page's pure helper
(frontend/static/js/sample_turns.js, run in node) makes of them the rows it draws: who spoke (the policy,
or the environment with its message's role), each turn's tokens and a policy turn's mean log-prob."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from django.test import Client

from accounts.services import ingest_token_issue, project_create
from rl_engine import wire
from rl_engine.types import ExampleSample, ExampleTurn
from tests.conftest import REPO_ROOT
from tests.factories import ExperimentFactory, RunFactory, UserFactory

pytestmark = pytest.mark.django_db
NODE = shutil.which("node")

TURNS = [
    ExampleTurn("assistant", '<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>', 31, -0.4321),
    ExampleTurn("tool", "84", 9),
    ExampleTurn("assistant", "84", 1, -0.05),
    ExampleTurn("user", "That is not right.", 12),
]  # fmt: skip


def listed_samples() -> tuple[list[dict], str]:
    """The samples list the run page fetches (``/api/runs/<id>/samples``) after the engine posted one
    episode and one single-turn sample; and the page's HTML."""
    owner = UserFactory(username="owner")
    run = RunFactory(experiment=ExperimentFactory(project=project_create(name="alpha", user=owner)))
    engine = Client(headers={"Authorization": f"Token {ingest_token_issue(run=run).secret}"})
    episode = ExampleSample("what is 12*7?", "whole response", "84", 1.0, 2, 3, turns=TURNS).to_dict()
    single = ExampleSample("q", "r", "a", 0.0, 2, 2).to_dict()
    body = {"samples": [wire.sample(episode, 7), wire.sample(single, 7)]}
    resp = engine.post(f"/api/runs/{run.pk}/samples", body, content_type="application/json")
    assert resp.status_code == 201, resp.content
    member = Client()
    member.force_login(owner)
    rows = member.get(f"/api/runs/{run.pk}/samples?step=7").json()
    return rows, member.get(f"/runs/{run.pk}/").content.decode()


def test_the_samples_list_carries_an_episodes_turns():
    rows, page = listed_samples()
    by_prompt = {r["prompt"]: r for r in rows}
    assert by_prompt["q"]["turns"] is None
    assert by_prompt["what is 12*7?"]["turns"] == [
        {"role": t.role, "text": t.text, "tokens": t.tokens, "logprob_mean": t.logprob_mean} for t in TURNS
    ]
    assert "js/run_dashboard.js" in page and 'data-testid="samples"' in page


@pytest.mark.skipif(NODE is None, reason="needs node")
def test_the_page_draws_an_episode_turn_by_turn():
    rows, _ = listed_samples()
    script = f"""
      import {{ turnRows }} from "{REPO_ROOT}/frontend/static/js/sample_turns.js";
      const rows = {json.dumps(rows)};
      console.log(JSON.stringify(rows.map((s) => turnRows(s.turns))));
    """
    out = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, check=True, timeout=60
    )
    drawn = dict(zip([r["prompt"] for r in rows], json.loads(out.stdout), strict=True))
    assert drawn["q"] == []  # a single-turn sample: its response as it is
    assert [(r["speaker"], r["summary"], r["text"], r["policy"]) for r in drawn["what is 12*7?"]] == [
        ("policy", "31 tokens · mean log-prob -0.432", TURNS[0].text, True),
        ("environment · tool", "9 tokens", "84", False),
        ("policy", "1 token · mean log-prob -0.050", "84", True),
        ("environment · user", "12 tokens", "That is not right.", False),
    ]
