"""Agents over an OpenAI client (``rl_engine.envs.openai_bridge``): the real ``openai`` package talks with
the endpoint inside the process; the policy is the tiny model on the real HF worker. Checked: the agent sees
exactly the turns the policy sampled and the engine records exactly the messages the agent sent (tokens
masked out of the loss), the agent's reward is the episode's, an agent that fails or edits the history
ends its own episode unscored, and the endpoint refuses what is not one of its agents' calls."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from rl_engine.data import PromptStream
from rl_engine.envs.base import Episode
from rl_engine.envs.episodes import DONE, META, EpisodeWorker
from rl_engine.envs.openai_bridge import AgentEnvironment, AgentTask, ChatEndpoint, agent_environment
from rl_engine.envs.registry import judge_of
from rl_engine.pipeline.components import real_worker
from rl_engine.rewards import build_reward
from rl_engine.types import UNSCORED

REPLIES = ["not yet", "one more"]


class Scripted:
    """An agent in plain OpenAI-client code: asks, then replies twice, and records what it saw."""

    def __init__(self, fail_on: str | None = None, edit_history: bool = False):
        self.seen: dict[str, list[str]] = {}  # the policy's turns each episode's agent was answered
        self.fail_on, self.edit_history = fail_on, edit_history
        self.lock = threading.Lock()

    def __call__(self, client: openai.OpenAI, model: str, task: AgentTask) -> float:
        messages = [{"role": "user", "content": task.prompt_text}]
        seen: list[str] = []
        for reply in [*REPLIES, None]:
            out = client.chat.completions.create(model=model, messages=messages, temperature=0.0)
            text = out.choices[0].message.content
            assert out.choices[0].message.role == "assistant" and isinstance(text, str)
            seen.append(text)
            if reply is None:
                break
            if self.fail_on is not None and task.prompt_text.startswith(self.fail_on):
                raise RuntimeError("the agent's own bug")
            said = text + "!" if self.edit_history else text
            messages = [*messages, {"role": "assistant", "content": said}, {"role": "user", "content": reply}]
        with self.lock:
            self.seen[model] = seen  # by episode
        return float(len(seen))


def _episodes(make_cfg, agent, n_prompts: int = 2):
    cfg = make_cfg("rollout.max_new_tokens=200", "rollout.n=2")
    inner = real_worker(cfg)
    worker = EpisodeWorker(
        inner, agent_environment(agent, step_wait_s=60), max_turns=3, max_tokens=200, max_turn_tokens=4
    )
    prompts = PromptStream(cfg, inner.tokenizer).next_batch(n_prompts)
    return worker, worker.generate(prompts, cfg.rollout.n)


def _turns(worker, s):
    """The policy's turns of ``s`` as ids: the sampled ids between the environment's spans."""
    spans, turns, cursor = s.metadata[META]["spans"], [], 0
    for start, end in spans:
        turns.append(s.response_ids[cursor:start])
        cursor = end
    return [*turns, s.response_ids[cursor:]]


def test_an_agent_drives_the_policy_and_the_engine_records_what_was_said(make_cfg):
    agent = Scripted()
    worker, samples = _episodes(make_cfg, agent)
    assert len(samples) == 4
    tok = worker.tokenizer
    for s in samples:
        assert s.extra[DONE] == 1.0 and UNSCORED not in s.extra
        assert s.extra["env/reward"] == 3.0 and s.extra["env/turns"] == 3.0  # the agent's return
        state = s.metadata[META]
        assert state["replies"] == REPLIES and state["roles"] == ["user", "user"]  # what the agent sent
        # what the agent was answered is the sampled ids of each turn, decoded
        decoded = [tok.decode(t, skip_special_tokens=True) for t in _turns(worker, s)]
        assert agent.seen[state["id"]] == decoded
        assert len(s.loss_mask) == len(s.response_ids) == len(s.logprobs)
        for start, end in state["spans"]:  # the agent's messages: no loss, placeholder log-probs
            assert set(s.loss_mask[start:end]) == {0} and set(s.logprobs[start:end]) == {0.0}
        cursor = 0
        for start, end in state["spans"]:
            assert set(s.loss_mask[cursor:start]) <= {1}
            cursor = end
    assert len(agent.seen) == 4  # one agent per episode


def test_an_agent_that_fails_or_edits_the_history_ends_only_its_episode_unscored(make_cfg):
    cfg = make_cfg()
    first = PromptStream(cfg, real_worker(cfg).tokenizer).next_batch(1)[0].text
    _, samples = _episodes(make_cfg, Scripted(fail_on=first))
    failed = [s for s in samples if s.prompt_text == first]
    assert failed and all(s.extra.get(UNSCORED) == 1.0 and s.extra["env/errors"] == 1.0 for s in failed)
    others = [s for s in samples if s.prompt_text != first]
    assert others and all(UNSCORED not in s.extra and s.extra["env/reward"] == 3.0 for s in others)
    _, edited = _episodes(make_cfg, Scripted(edit_history=True), n_prompts=1)
    assert all(s.extra.get(UNSCORED) == 1.0 and s.extra["env/turns"] == 1.0 for s in edited)


def test_a_first_call_that_is_not_the_policys_prompt_ends_the_episode_unscored(make_cfg):
    def wrong(client, model, task):
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "another question"}]
        )
        return 1.0

    _, samples = _episodes(make_cfg, wrong, n_prompts=1)
    assert all(s.extra.get(UNSCORED) == 1.0 for s in samples)


def test_the_endpoint_answers_only_its_agents_calls():
    endpoint = ChatEndpoint(reply_timeout_s=5)
    try:
        stranger = openai.OpenAI(base_url=endpoint.base_url, api_key="guess", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            stranger.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        agent = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.token, max_retries=0)
        with pytest.raises(openai.NotFoundError):  # no episode of that name waits
            agent.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "hi"}])
        auth = {"Authorization": f"Bearer {endpoint.token}"}
        url = f"{endpoint.base_url}/chat/completions"
        for body in (b"not json", b'{"model": "x"}', b'{"model": "x", "messages": [{"role": "user"}]}'):
            r = httpx.post(url, content=body, headers=auth)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        r = httpx.post(url, content=b"x" * (2**20 + 1), headers=auth)
        assert r.status_code == 413
        assert endpoint.base_url.startswith("http://127.0.0.1:")
    finally:
        endpoint.close()


def test_openai_feedback_is_answer_feedback_written_as_an_agent(make_cfg):
    """The built-in agent through the config: each episode's reward is the run's reward of its last turn,
    and it stops at the first right answer."""
    cfg = make_cfg(
        "env.name=openai_feedback",
        "env.kwargs={attempts: 3, reply: 'again'}",
        "env.max_turn_tokens=4",
        "rollout.max_new_tokens=200",
        "rollout.n=2",
    )
    worker = real_worker(cfg)
    assert isinstance(worker, EpisodeWorker)
    samples = worker.generate(PromptStream(cfg, worker.tokenizer).next_batch(2), 2)
    judge = judge_of(build_reward(cfg.reward))
    for s in samples:
        assert UNSCORED not in s.extra and 1 <= s.extra["env/turns"] <= 3
        state = s.metadata[META]
        assert state["replies"] == ["again"] * (int(s.extra["env/turns"]) - 1)
        scores = [judge(Episode(s.prompt_text, s.answer, {}, ()), t) for t in state["policy"]]
        assert s.extra["env/reward"] == scores[-1]
        assert all(x < 1.0 for x in scores[:-1])  # it asked again only after a wrong answer
    assert isinstance(worker._env, AgentEnvironment)
