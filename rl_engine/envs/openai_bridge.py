"""Agents written against an OpenAI client drive the policy unchanged: an OpenAI-compatible chat endpoint
inside the run (docs/engine.md, "Agents over an OpenAI client").

An **agent** is a function ``agent(client, model, task) -> reward`` — ``client`` an ``openai.OpenAI``
pointed at this process's endpoint, ``model`` the episode's name to send with every call, ``task`` the
episode's prompt, answer and metadata (:class:`AgentTask`) — that talks with the policy through
``client.chat.completions.create(model=model, messages=[...])`` as it would with any OpenAI server, and
returns the episode's reward (``None``: the run's reward scores the policy's last turn).
``agent_environment(agent)`` makes it an environment (``rl_engine.envs.base``) for ``EpisodeWorker``.

**Who drives.** The engine does: the rollout worker generates every policy turn of a batch of episodes
together, as for any environment, and the agent's call is the rendezvous. Each episode's agent runs in a
thread of its own; its first call must be the prompt the policy answered (its messages rendered by the
model's chat template equal ``task.prompt_text``: checked), and is answered with the policy's first turn,
already sampled. The agent's next call — the history it was given, then **one** new message (a user's
reply or a tool's result) — is the environment's step: the message goes into the episode as token ids
with a loss mask of 0 (``rl_engine.envs.chat_turns``), the policy's next turn is sampled from the ids it
already has, and it answers that call. The agent's view of the conversation is checked at each call
against the engine's (the same messages, the assistant turns as the policy wrote them): an agent that
edits the history ends its episode unscored, so the trainer always scores the tokens that were
sampled, never a re-tokenized conversation. The agent's return ends the episode; its exception, or
an edited history, ends it unscored.

**The endpoint.** ``POST /v1/chat/completions`` on ``127.0.0.1`` at a port the system picks, behind a
bearer token made for the process (``secrets``): reachable only from the machine, answered only to the
agents this process starts (who are given the token). A call names its episode by ``model``; sampling
settings in the request (``temperature``, ``max_tokens``...) are ignored: the run's rollout settings
sample every turn (the behaviour log-probs the trainer corrects with are those). Errors are OpenAI's
shape (``{"error": {"message", "type"}}``): 401 without the token, 404 for an episode that is not
waiting, 400 for a body that is not a chat request, 413 beyond 1 MiB, 408 when no answer comes within
``reply_timeout_s`` (an episode a budget ended leaves its agent's last call unanswered: it fails then and
the agent's thread ends).

An agent's thread and session live in this process: an episode continued in another process (a resumed
checkpoint) has lost its agent and ends unscored.
"""

from __future__ import annotations

import json
import logging
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rl_engine.envs.base import EnvStep, Episode, Judge

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 2**20
DEFAULT_REPLY_TIMEOUT_S = 600.0
ROLES = ("user", "tool")


@dataclass(frozen=True)
class AgentTask:
    """What an agent is given of its episode."""

    prompt_text: str  # the prompt the policy answered, as the chat template rendered it
    answer: str  # the reference answer (for the agent's own check)
    metadata: dict[str, Any] = field(default_factory=dict)  # the row's metadata columns


Agent = Callable[[Any, str, AgentTask], "float | None"]


class AgentError(RuntimeError):
    """An episode's agent failed, or its view of the conversation left the engine's."""


# --- the rendezvous between an agent's call and the episode's step ------------------------------------------


class _Session:
    """One episode's agent: its calls go to the episode's step (``events``), the policy's turns come back
    (``replies``)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.replies: queue.Queue[str | None] = queue.Queue()
        self.history: list[dict[str, str]] = []  # the conversation as the engine has it

    def call(self, messages: list[dict[str, str]], timeout: float) -> str:
        """The agent's side: hand over ``messages``, wait for the policy's turn."""
        self.events.put(("call", messages))
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no policy turn within {timeout:g} s (the episode has ended)") from None
        if reply is None:
            raise AgentError("the episode has ended")
        return reply

    def next_event(self, timeout: float) -> tuple[str, Any]:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"the agent made no call and did not return within {timeout:g} s") from None


class ChatEndpoint:
    """The OpenAI-compatible endpoint of this process (module docstring): a threading HTTP server on
    127.0.0.1, its sessions by episode name."""

    def __init__(self, reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S) -> None:
        self.token = secrets.token_urlsafe(32)
        self.reply_timeout_s = reply_timeout_s
        self.sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="chat-endpoint", daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def open(self, key: str) -> _Session:
        with self._lock:
            session = self.sessions[key] = _Session(key)
        return session

    def session(self, key: str) -> _Session | None:
        with self._lock:
            return self.sessions.get(key)

    def drop(self, key: str) -> None:
        with self._lock:
            session = self.sessions.pop(key, None)
        if session is not None:
            session.replies.put(None)  # a call still waiting fails now

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(endpoint: ChatEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("chat endpoint: " + format, *args)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str) -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self) -> None:
            self._error(404, f"no route {self.path[:100]}", "not_found")

        def do_POST(self) -> None:
            if self.headers.get("Authorization", "") != f"Bearer {endpoint.token}":
                self._error(
                    401, "a bearer token this run gave its agents is required", "authentication_error"
                )
                return
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no route {self.path[:100]}", "not_found")
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self._error(413, f"a request body of at most {MAX_BODY_BYTES} bytes", "invalid_request_error")
                self.close_connection = True
                return
            try:
                body = json.loads(self.rfile.read(length))
                key, messages = _chat_request(body)
            except (ValueError, TypeError) as exc:
                self._error(400, str(exc)[:300], "invalid_request_error")
                return
            session = endpoint.session(key)
            if session is None:
                self._error(404, f"no episode {key[:80]!r} is waiting for a turn", "not_found")
                return
            try:
                text = session.call(messages, endpoint.reply_timeout_s)
            except (TimeoutError, AgentError) as exc:
                self._error(408, str(exc), "timeout")
                return
            self._send(200, _completion(key, text))

    return Handler


def _chat_request(body: Any) -> tuple[str, list[dict[str, str]]]:
    """The episode name and the messages of a chat completions request; ValueError naming the field."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    key = body.get("model")
    if not isinstance(key, str) or not key:
        raise ValueError("model: the episode's name (given to the agent) is required")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ValueError("messages: a non-empty list is required")
    messages = []
    for i, m in enumerate(raw):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(f"messages[{i}]: a {{role, content}} object with text content is required")
        messages.append({"role": m["role"], "content": m["content"]})
    return key, messages


def _completion(key: str, text: str) -> dict[str, Any]:
    """An OpenAI ``chat.completion`` object holding the policy's turn."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": key,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


# --- the environment ---------------------------------------------------------------------------------------


class AgentEnvironment:
    """An agent (module docstring) as an environment: each episode's agent in a thread, its calls the
    episode's steps. The endpoint starts with the first episode (a config check builds this and runs
    nothing)."""

    def __init__(
        self, agent: Agent, *, step_wait_s: float = 3600.0, reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S
    ) -> None:
        self.agent = agent
        self.step_wait_s = step_wait_s
        self.reply_timeout_s = reply_timeout_s
        self.tokenizer: Any = None
        self._endpoint: ChatEndpoint | None = None
        self._lock = threading.Lock()

    def attach(self, tokenizer: Any) -> None:
        """The policy's tokenizer (``EpisodeWorker`` gives it): an agent's first call is checked with its
        chat template."""
        self.tokenizer = tokenizer

    @property
    def endpoint(self) -> ChatEndpoint:
        with self._lock:
            if self._endpoint is None:
                self._endpoint = ChatEndpoint(self.reply_timeout_s)
            return self._endpoint

    def client(self) -> Any:
        """An ``openai.OpenAI`` client of the endpoint (what each agent is given)."""
        import openai

        return openai.OpenAI(base_url=self.endpoint.base_url, api_key=self.endpoint.token, max_retries=0)

    def step(self, episode: Episode) -> EnvStep:
        if not episode.id:
            raise AgentError("the episode has no id (EpisodeWorker gives one)")
        session = self.endpoint.session(episode.id)
        if session is None:
            if episode.turn > 1:
                raise AgentError("the episode's agent is gone (the episode continued in another process)")
            session = self._start(episode)
        try:
            return self._step(session, episode)
        except BaseException:
            self.endpoint.drop(episode.id)
            raise

    def _start(self, episode: Episode) -> _Session:
        session = self.endpoint.open(episode.id)
        task = AgentTask(episode.prompt_text, episode.answer, dict(episode.metadata))

        def run() -> None:
            try:
                session.events.put(("done", self.agent(self.client(), episode.id, task)))
            except BaseException as exc:  # the agent's failure ends its episode, unscored
                session.events.put(("error", exc))
            finally:
                self.endpoint.drop(episode.id)  # the step that reads the event holds the session

        threading.Thread(target=run, name=f"agent-{episode.id[:8]}", daemon=True).start()
        kind, value = session.next_event(self.step_wait_s)
        if kind != "call":
            raise AgentError(f"the agent ended before its first call ({kind}: {value!r:.200})")
        self._check_first(value, episode)
        session.history = list(value)
        return session

    def _check_first(self, messages: list[dict[str, str]], episode: Episode) -> None:
        """The first call's messages are the prompt the policy answered: rendered by the chat template,
        or (a run without one) a single user message of the prompt's text."""
        if messages == [{"role": "user", "content": episode.prompt_text}]:
            return
        if self.tokenizer is None or getattr(self.tokenizer, "chat_template", None) is None:
            raise AgentError("the agent's first call is not the prompt the policy answered")
        rendered = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if rendered != episode.prompt_text:
            raise AgentError(
                "the agent's first call is not the prompt the policy answered: its messages render to "
                f"{rendered[-120:]!r}, the prompt ends {episode.prompt_text[-120:]!r}"
            )

    def _step(self, session: _Session, episode: Episode) -> EnvStep:
        turn = episode.policy[-1]
        session.history.append({"role": "assistant", "content": turn})
        session.replies.put(turn)  # the policy's turn answers the agent's waiting call
        kind, value = session.next_event(self.step_wait_s)
        if kind == "error":
            raise AgentError(f"the agent failed: {type(value).__name__}: {value}") from value
        if kind == "done":
            self.endpoint.drop(episode.id)
            return EnvStep(done=True, reward=None if value is None else float(value))
        known = len(session.history)
        if value[:known] != session.history:
            raise AgentError(
                "the agent's call changed the conversation so far (the engine's is the sampled one)"
            )
        new = value[known:]
        if len(new) != 1 or new[0]["role"] not in ROLES:
            raise AgentError(
                f"a call after a policy turn adds one message, a user's or a tool's; this one adds {len(new)}"
                + (f" ({new[0]['role']})" if len(new) == 1 else "")
            )
        session.history.append(new[0])
        return EnvStep(done=False, message=new[0]["content"], role=new[0]["role"])  # type: ignore[arg-type]


def agent_environment(agent: Agent, **settings: Any) -> AgentEnvironment:
    """``agent`` as an environment; an environment plugin's factory returns this (docs/engine.md)."""
    return AgentEnvironment(agent, **settings)


# --- a built-in agent: answer_feedback as OpenAI-client code ------------------------------------------------


def openai_feedback(
    judge: Judge, attempts: int = 3, reply: str = "That is not right. Try again."
) -> AgentEnvironment:
    """answer_feedback written as an agent over an OpenAI client (the worked example of docs/engine.md):
    the policy answers, the run's reward judges, a wrong answer is told ``reply``, up to ``attempts``
    tries; the episode's reward is the last try's score."""
    if not isinstance(attempts, int) or not 1 <= attempts <= 16:
        raise ValueError(f"attempts must be an integer in 1..16, got {attempts!r}")
    if not isinstance(reply, str) or not reply.strip() or len(reply) > 2000:
        raise ValueError("reply must be a non-empty text of at most 2000 characters")

    def agent(client: Any, model: str, task: AgentTask) -> float:
        messages = prompt_messages(task)
        score = 0.0
        for attempt in range(attempts):
            out = client.chat.completions.create(model=model, messages=messages)
            text = out.choices[0].message.content or ""
            score = judge(Episode(task.prompt_text, task.answer, task.metadata, (text,)), text)
            if score >= 1.0 or attempt == attempts - 1:
                break
            messages = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": reply}]
        return score

    return agent_environment(agent)


def prompt_messages(task: AgentTask) -> list[dict[str, str]]:
    """The messages of the task's prompt: the row's ``messages`` metadata when it carries them, else a user
    turn of its ``question`` / ``prompt`` metadata (``data.columns.metadata``), else (data without a chat
    template) a user turn of the prompt's text."""
    meta = task.metadata
    if isinstance(meta.get("messages"), list):
        return [{"role": m["role"], "content": m["content"]} for m in meta["messages"]]
    for key in ("question", "prompt"):
        if isinstance(meta.get(key), str):
            return [{"role": "user", "content": meta[key]}]
    return [{"role": "user", "content": task.prompt_text}]


__all__ = [
    "AgentEnvironment",
    "AgentTask",
    "ChatEndpoint",
    "agent_environment",
    "openai_feedback",
    "prompt_messages",
]
