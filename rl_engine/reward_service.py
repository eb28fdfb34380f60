"""A reference remote reward service: a small ASGI app that scores batches with the built-in graders, in
the protocol of ``reward: {name: http}`` (``rl_engine.rewards.remote``; docs/engine.md, "Remote reward
service"). It is what a team's own grader looks like (a code sandbox, a judge model: the same two
routes), and what the tests run as a real process.

    python -m rl_engine.reward_service --host 127.0.0.1 --port 8808

- ``POST /score/<grader>`` with the protocol's body answers ``{"rewards": [...]}``; ``<grader>`` is
  ``math_verify`` (``math_verify_reward()``: the reference's final number against the response's) or
  ``reasoning_gym`` (the task's own scorer, from the entry each reasoning-gym prompt carries in its
  metadata). A grader that fails on one sample answers ``null`` for it (unscored), never a guess.
- ``GET /health`` answers ``{"status": "ok", "graders": [...]}``.
- A body over ``MAX_BODY_BYTES`` is a 413, malformed JSON or lists of different lengths a 400, an
  unknown grader a 404.

Served by uvicorn (the platform's own ASGI server); no framework, so the whole contract is on this page.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from rl_engine.rewards.math_answers import math_verify_reward
from rl_engine.rewards.reasoning_gym import reasoning_gym_reward
from rl_engine.types import Sample

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 32 * 1024 * 1024
GRADERS: dict[str, Callable[[], Callable[[Sample], float]]] = {
    "math_verify": math_verify_reward,
    "reasoning_gym": reasoning_gym_reward,
}


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def samples_of(body: Any) -> list[Sample]:
    """The samples a request body describes (``rl_engine.rewards.remote.request_body``'s lists)."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    responses = body.get("responses")
    if not isinstance(responses, list):
        raise BadRequest(400, "'responses' must be a list")
    n = len(responses)
    lists: dict[str, list[Any]] = {}
    for key, default in (("prompts", ""), ("labels", ""), ("metadata", {})):
        value = body.get(key, [default] * n)
        if not isinstance(value, list) or len(value) != n:
            raise BadRequest(400, f"'{key}' must be a list as long as 'responses' ({n})")
        lists[key] = value
    samples = []
    for i in range(n):
        prompt, response, label = lists["prompts"][i], responses[i], lists["labels"][i]
        metadata = lists["metadata"][i]
        if not all(isinstance(v, str) for v in (prompt, response, label)) or not isinstance(metadata, dict):
            raise BadRequest(400, f"sample {i}: prompts, responses and labels are strings, metadata objects")
        samples.append(
            Sample(
                prompt_uid=str(i),
                group_id=str(i),
                prompt_ids=[],
                response_ids=[],
                logprobs=[],
                finish_reason="stop",
                param_version_start=0,
                param_version_end=0,
                prompt_text=prompt,
                response_text=response,
                answer=label,
                metadata=metadata,
            )
        )
    return samples


def score(grader: Callable[[Sample], float], samples: list[Sample]) -> list[float | None]:
    """Each sample's score; None where the grader raised (the engine counts it unscored)."""
    out: list[float | None] = []
    for s in samples:
        try:
            out.append(float(grader(s)))
        except Exception as exc:  # one sample's failure is that sample's, never the batch's
            log.warning("grader failed on sample %s: %s: %s", s.prompt_uid, type(exc).__name__, exc)
            out.append(None)
    return out


class RewardService:
    """The ASGI app (module docstring)."""

    def __init__(self) -> None:
        self.graders = {name: factory() for name, factory in GRADERS.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        try:
            if method == "GET" and path == "/health":
                await _json(send, 200, {"status": "ok", "graders": sorted(self.graders)})
                return
            if not path.startswith("/score/"):
                raise BadRequest(404, f"no route {path[:100]!r}: POST /score/<grader>, GET /health")
            grader = self.graders.get(path[len("/score/") :])
            if grader is None:
                raise BadRequest(
                    404, f"no grader {path[7:][:100]!r}; graders: {', '.join(sorted(self.graders))}"
                )
            if method != "POST":
                raise BadRequest(405, "POST a batch")
            samples = samples_of(await _body(receive))
            await _json(send, 200, {"rewards": score(grader, samples)})
        except BadRequest as exc:
            await _json(send, exc.status, {"error": str(exc)})


async def _body(receive: Receive) -> Any:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequest(413, f"a body over {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"the body is not JSON: {exc}") from None


async def _json(send: Send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m rl_engine.reward_service", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8808)
    args = parser.parse_args(argv)
    uvicorn.run(RewardService(), host=args.host, port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
