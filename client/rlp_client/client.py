"""The entry point: ``Client(url, token)`` (or ``Client.from_env()``) and its typed calls."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

from rlp_client.config import Credentials, load_credentials
from rlp_client.models import Experiment, NewToken, Project, RunInfo, Sweep
from rlp_client.runs import Run
from rlp_client.transport import RetryPolicy, Transport


def create_token(
    url: str, username: str, password: str, *, name: str = "rlp login", timeout_s: float = 30.0
) -> NewToken:
    """A new user token for ``username`` and ``password`` (``POST /api/tokens/login``; the password is
    sent once and kept nowhere). Raises AuthenticationFailed for a wrong username or password (the same
    for both), RateLimited beyond the login rates, ServerError (503) while the platform cannot count
    login attempts."""
    transport = Transport(url, None, timeout_s=timeout_s)
    try:
        body = {"username": username, "password": password, "name": name}
        return NewToken.from_api(transport.post("/api/tokens/login", body))
    finally:
        transport.close()


class Client:
    """A user's connection to one platform.

    Args:
        url: the platform's address, e.g. ``http://127.0.0.1:8000``.
        token: a user API token (``rlp_...``; create one under /tokens/ or with ``POST /api/tokens``).
        timeout_s: per-request timeout.
        retry: the retry policy of idempotent calls (see :mod:`rlp_client.transport`).
    """

    def __init__(
        self, url: str, token: str | None, *, timeout_s: float = 30.0, retry: RetryPolicy | None = None
    ) -> None:
        self.transport = Transport(url, token, timeout_s=timeout_s, retry=retry)

    @classmethod
    def from_env(cls, **kwargs: Any) -> Client:
        """From ``RLP_URL``/``RLP_TOKEN``, else the file ``rlp login`` wrote (see :mod:`rlp_client.config`;
        what its permission checks found is issued as a ``UserWarning``)."""
        creds: Credentials = load_credentials()
        for notice in creds.notices:
            warnings.warn(notice, stacklevel=2)
        return cls(creds.url, creds.token, **kwargs)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self.transport.base_url

    # --- who am I, projects, presets -------------------------------------------------------------------

    def me(self) -> dict[str, Any]:
        """``{"id", "username", "projects": {"<id>": "<role>"}}``; raises AuthenticationFailed for a bad token."""
        return dict(self.transport.get("/api/me"))

    def projects(self) -> list[Project]:
        return [Project.from_api(p) for p in self.transport.pages("/api/projects")]

    def project(self, ref: int | str) -> Project:
        """A project by id, or by its exact name."""
        if isinstance(ref, int) or str(ref).isdigit():
            return Project.from_api(self.transport.get(f"/api/projects/{int(ref)}"))
        matches = [p for p in self.projects() if p.name == ref]
        if len(matches) != 1:
            from rlp_client.errors import NotFound

            what = "no project" if not matches else f"{len(matches)} projects"
            raise NotFound(404, f"{what} named {ref!r}", {"project": [f"{what} named {ref!r}"]})
        return matches[0]

    def create_project(self, name: str, description: str = "") -> Project:
        return Project.from_api(
            self.transport.post("/api/projects", {"name": name, "description": description})
        )

    def presets(self) -> dict[str, dict[str, Any]]:
        """``{name: config}``: the engine's presets as this platform accepts them."""
        return dict(self.transport.get("/api/presets"))

    def models(self) -> dict[str, Any]:
        """``{"models": [...], "not_fetched": [...]}``: the model directories a config may name here
        (``model.path``), with parameters, vocabulary, head size, chat template and serving backends."""
        return dict(self.transport.get("/api/models"))

    def rewards(self) -> dict[str, Any]:
        """``{"rewards": [...], "refused": [...]}``: the rewards a config may name, as the engine's
        environment lists them (built-ins and installed reward plugins), each with its parameters
        (name, type, default), description and origin (``builtin``, or the plugin's package and version)."""
        return dict(self.transport.get("/api/rewards"))

    def tasks(self) -> dict[str, Any]:
        """``{"tasks": [...]}``: the built-in tasks (``data.task``) with their parameters."""
        return dict(self.transport.get("/api/tasks"))

    # --- experiments -----------------------------------------------------------------------------------

    def experiments(self, project: int | None = None, tag: str | None = None) -> Iterator[Experiment]:
        for e in self.transport.pages("/api/experiments", {"project": project, "tag": tag}):
            yield Experiment.from_api(e)

    def experiment(self, experiment_id: int) -> Experiment:
        return Experiment.from_api(self.transport.get(f"/api/experiments/{experiment_id}"))

    def create_experiment(
        self,
        project: int,
        name: str,
        config: dict[str, Any],
        *,
        description: str = "",
        tags: list[str] | None = None,
    ) -> Experiment:
        """Validated and stored normalised; a bad config raises BadRequest naming ``config.<path>``."""
        body = {
            "project": project,
            "name": name,
            "config": config,
            "description": description,
            "tags": tags or [],
        }
        return Experiment.from_api(self.transport.post("/api/experiments", body))

    def import_experiment(
        self, project: int, name: str, yaml_text: str, *, description: str = "", tags: list[str] | None = None
    ) -> Experiment:
        """From YAML text (e.g. an export); errors name ``yaml.<path>``."""
        body = {
            "project": project,
            "name": name,
            "yaml": yaml_text,
            "description": description,
            "tags": tags or [],
        }
        return Experiment.from_api(self.transport.post("/api/experiments/import", body))

    def experiment_yaml(self, experiment_id: int) -> str:
        """The experiment's config as YAML (what ``import_experiment`` takes back)."""
        return self.transport.request("GET", f"/api/experiments/{experiment_id}/yaml").text

    # --- runs ------------------------------------------------------------------------------------------

    def launch(self, experiment: int, priority: int | None = None) -> Run:
        """A new run of ``experiment`` (state ``queued``); higher ``priority`` starts first."""
        body: dict[str, Any] = {"experiment": experiment}
        if priority is not None:
            body["priority"] = priority
        return Run(self, RunInfo.from_api(self.transport.post("/api/runs", body)))

    def run(self, run_id: int) -> Run:
        return Run(self, RunInfo.from_api(self.transport.get(f"/api/runs/{run_id}")))

    def runs(
        self,
        *,
        states: list[str] | None = None,
        project: int | None = None,
        experiment: int | None = None,
        tag: str | None = None,
    ) -> Iterator[Run]:
        """Every visible run (newest first), filtered; pages are followed for you."""
        params = {"state": ",".join(states) if states else None, "project": project, "experiment": experiment,
                  "tag": tag}  # fmt: skip
        for r in self.transport.pages("/api/runs", params):
            yield Run(self, RunInfo.from_api(r))

    # --- sweeps ----------------------------------------------------------------------------------------

    def create_sweep(
        self,
        experiment: int,
        *,
        method: str,
        search_space: dict[str, Any],
        metric: str,
        **options: Any,
    ) -> Sweep:
        """A grid or random search over config fields of ``experiment`` (docs/api.md, "Sweeps"): its runs
        are created queued and started at most ``max_concurrent`` at a time. ``options``: ``name``,
        ``max_runs``, ``max_concurrent``, ``goal``, ``summary``, ``early_stopping``, ``seed``,
        ``priority`` (None: the server's default). A refused point raises BadRequest naming
        ``search_space.<path>``."""
        body: dict[str, Any] = {"experiment": experiment, "method": method, "search_space": search_space,
                                "metric": metric}  # fmt: skip
        body.update({k: v for k, v in options.items() if v is not None})
        return Sweep.from_api(self.transport.post("/api/sweeps", body))

    def sweep(self, sweep_id: int, summary: str | None = None) -> Sweep:
        """The sweep with its runs ranked by its metric (``summary``: ``last`` or ``best``)."""
        return Sweep.from_api(self.transport.get(f"/api/sweeps/{sweep_id}", {"summary": summary}))

    def sweeps(self, project: int | None = None, experiment: int | None = None) -> Iterator[Sweep]:
        for d in self.transport.pages("/api/sweeps", {"project": project, "experiment": experiment}):
            yield Sweep.from_api(d)

    def cancel_sweep(self, sweep_id: int) -> Sweep:
        """Cancel every unfinished run of the sweep."""
        return Sweep.from_api(self.transport.post(f"/api/sweeps/{sweep_id}/cancel", None))
