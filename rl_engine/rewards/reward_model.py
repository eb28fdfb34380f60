"""A reward model: ``reward: {name: model, kwargs: {path: <model folder>}}`` scores each (prompt,
response) with a Hugging Face ``AutoModelForSequenceClassification`` (docs/engine.md, "Reward model").

- **Where it runs.** Inside a run (Ray initialised) the model lives on its own Ray actor,
  :class:`RewardModelActor`, with ``num_cpus`` / ``num_gpus`` of the cluster's resources (a GPU when
  ``num_gpus`` is 1: it sits beside the rollout engines, not inside them). The actor is named after the
  model and its settings and shared (``get_if_exists``) by the run's rollouters and its evaluator: one
  copy of the weights per run. Outside Ray (a unit test, a script) the same :class:`RewardModelScorer`
  runs in-process: one scorer, two hosts, no second code path.
- **What it reads.** The text is ``prompt_text + response_text`` (the prompt as the policy saw it, its
  chat template applied), truncated from the left to ``max_length`` tokens so the response's end, where
  a sequence classifier reads its score, always stays. Right padding; the model's ``pad_token_id`` (the
  tokenizer's pad, else its eos) marks where each sequence ends.
- **The score** is the logit of ``label`` (default 0: a one-logit reward head, as TRL's and OpenRLHF's
  reward models have); with ``probability`` the softmax probability of that label (a classifier's
  "good" class) instead.
- **Failures** follow the batch contract (``rl_engine.rewards.base.BatchRewardFn``): a batch the actor
  cannot score within ``timeout_s`` (it died, the folder does not load, the cluster lacks the GPU it
  asks for) is unscored, counted and left out of the update; the next batch asks for the actor again.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_engine.types import Sample

log = logging.getLogger(__name__)

ACTOR_PREFIX = "rl_engine-reward-model-"


class RewardModelScorer:
    """The sequence classifier and its tokenizer, scoring batches of (prompt, response) texts."""

    def __init__(
        self, path: str, *, max_length: int, batch_size: int, label: int, probability: bool, device: str
    ):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.truncation_side = "left"  # keep the response's end: the classifier reads it
        self.tokenizer.padding_side = "right"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        if not 0 <= label < self.model.config.num_labels:
            raise ValueError(f"label {label} of a model with {self.model.config.num_labels} labels")
        self.max_length, self.batch_size, self.label, self.probability = (
            max_length,
            batch_size,
            label,
            probability,
        )
        self.device = device
        self._torch = torch

    def score_texts(self, texts: Sequence[str]) -> list[float]:
        """One score per text, in order (module docstring)."""
        torch = self._torch
        out: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start : start + self.batch_size])
            enc = self.tokenizer(
                chunk, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
            ).to(self.device)
            with torch.no_grad():
                logits = self.model(**enc).logits.float()  # [b, num_labels]
            values = logits.softmax(-1)[:, self.label] if self.probability else logits[:, self.label]
            out.extend(float(v) for v in values.cpu())
        return out


class RewardModelActor:
    """A Ray actor holding one :class:`RewardModelScorer` (created by :class:`ModelReward`)."""

    def __init__(self, path: str, settings: dict[str, Any]):
        self.scorer = RewardModelScorer(path, **settings)

    def score_texts(self, texts: list[str]) -> list[float]:
        return self.scorer.score_texts(texts)


class ModelReward:
    """The ``model`` reward: a batch reward over a sequence-classification model (module docstring)."""

    def __init__(
        self, path: str, settings: dict[str, Any], num_cpus: float, num_gpus: float, timeout_s: float
    ):
        self.path, self.settings, self.num_cpus, self.num_gpus = path, settings, num_cpus, num_gpus
        self.timeout_s = timeout_s
        self._host: Any = None  # the actor handle (in a run) or the in-process scorer

    def __call__(self, sample: Sample) -> float:
        return self.score_batch([sample])[0]

    def score_batch(self, samples: Sequence[Sample]) -> list[float]:
        texts = [s.prompt_text + s.response_text for s in samples]
        if not texts:
            return []
        host = self._get_host()
        if isinstance(host, RewardModelScorer):
            return host.score_texts(texts)
        import ray

        try:
            return ray.get(host.score_texts.remote(texts), timeout=self.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            # it died, or never started (resources the cluster lacks), or hangs: this batch is unscored,
            # the next one asks for the actor again
            self._host = None
            raise

    @property
    def actor_name(self) -> str:
        key = repr((self.path, sorted(self.settings.items()), self.num_cpus, self.num_gpus)).encode()
        return ACTOR_PREFIX + hashlib.sha256(key).hexdigest()[:16]

    def _get_host(self) -> Any:
        if self._host is not None:
            return self._host
        import ray

        if not ray.is_initialized():
            self._host = RewardModelScorer(self.path, **self.settings)
            return self._host
        actor = ray.remote(RewardModelActor).options(
            name=self.actor_name,
            get_if_exists=True,
            num_cpus=self.num_cpus,
            num_gpus=self.num_gpus,
            max_concurrency=1,
        )
        self._host = actor.remote(self.path, self.settings)
        return self._host

    def __getstate__(self) -> dict[str, Any]:  # an actor handle or a model does not travel with a config
        return {**self.__dict__, "_host": None}


def model_reward(
    path: str,
    batch_size: int = 16,
    max_length: int = 1024,
    label: int = 0,
    probability: bool = False,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    timeout_s: float = 240.0,
) -> ModelReward:
    """A reward model: an AutoModelForSequenceClassification folder scores prompt + response.

    Run on its own Ray actor (``num_cpus``, ``num_gpus``: 1 puts it on a GPU), shared by the run's
    rollouters; ``batch_size`` texts per forward, cut from the left to ``max_length`` tokens; the score is
    the logit of ``label`` (with ``probability``: its softmax probability). A batch it cannot score within
    ``timeout_s`` (the first one includes loading the model) is unscored (counted, left out of the
    update). Scoring runs inside the rollouter's generation call, which a weight sync waits for: the
    default stays under the GPU engines' ``rollout.control_timeout_s`` (300 s)."""
    if not isinstance(path, str) or not path:
        raise ValueError("path must name a model folder (a sequence-classification model)")
    for name, value, lo, hi in (("batch_size", batch_size, 1, 4096), ("max_length", max_length, 8, 131072),
                                ("label", label, 0, 1023)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    for name, number in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
        if isinstance(number, bool) or not isinstance(number, int | float) or not 0 <= number <= 64:
            raise ValueError(f"{name} must be a number in 0..64, got {number!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= 3600:
        raise ValueError(f"timeout_s must be a number in (0, 3600], got {timeout_s!r}")
    if not isinstance(probability, bool):
        raise ValueError(f"probability must be true or false, got {probability!r}")
    device = "cuda" if num_gpus >= 1 else "cpu"
    settings = {
        "max_length": max_length,
        "batch_size": batch_size,
        "label": label,
        "probability": probability,
        "device": device,
    }
    return ModelReward(str(Path(path)), settings, float(num_cpus), float(num_gpus), float(timeout_s))
