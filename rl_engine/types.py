"""Typed data and messages of the engine: prompts, samples, and what the pipeline's actors send each other.

No torch or ray import: plain Python lists (shapes in comments) and ``Any`` for object refs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class Prompt:
    """One prompt to answer. ``uid`` is unique within a run and deterministic from the data position."""

    uid: str
    token_ids: list[int]
    text: str
    answer: str
    index: int  # position in the prompt stream (data position for resume)
    metadata: dict[str, Any] = field(default_factory=dict)  # dataset columns named in data.columns.metadata


@dataclass
class Sample:
    """One response to one prompt, as produced by a rollout worker and scored by the rollouter.

    ``logprobs[i]`` is the behaviour log-prob of ``response_ids[i]`` under the sampling distribution
    (logits / temperature) of the weights that generated that token. With partial rollout a response
    may span several weight versions: ``param_version_start`` <= ``param_version_end``.
    Staleness at consumption = trainer version - ``param_version_start``.
    """

    prompt_uid: str
    group_id: str  # samples of one prompt share it; advantages are normalised within a group
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    param_version_start: int
    param_version_end: int
    prompt_text: str = ""
    response_text: str = ""
    answer: str = ""
    reward: float = 0.0
    gen_time_s: float = 0.0
    num_interruptions: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)  # the prompt's metadata (rewards may read it)
    # [len(response_ids)] of a multi-turn episode (``rl_engine.envs``): 1 for a token the policy sampled
    # (trained on), 0 for a token the environment wrote between turns (its behaviour log-prob is a 0.0
    # placeholder); None: every token was sampled
    loss_mask: list[int] | None = None
    turn_start: int = 0  # where its current turn began in ``response_ids`` (a multi-turn episode's)

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    @property
    def unscored(self) -> bool:
        """Its reward could not be computed (a remote reward service failed it: ``rl_engine.rewards``):
        left out of the update and of the step's reward figures, never counted as a 0."""
        return bool(self.extra.get(UNSCORED))


# ``Sample.extra``'s mark of an unscored sample (1.0).
UNSCORED = "reward_unscored"


def split_groups(samples: list[Sample]) -> list[list[Sample]]:
    """Group consecutive samples by ``group_id`` (workers return them grouped by prompt)."""
    groups: list[list[Sample]] = []
    for s in samples:
        if groups and groups[-1][0].group_id == s.group_id:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


# --- messages between the pipeline's actors ----------------------------------------------------------
# What ``rl_engine.pipeline``'s actors send each other and the driver: dataclasses (Ray pickles them;
# all frozen but the queue's own counters), so a misspelt field is an AttributeError (or a type-checker error), never a silent KeyError.
# Per-sample lists are aligned with the batch: ``[B]`` is ``trainer.batch_size`` samples, in batch order.
# Object refs are typed ``Any``: this module imports neither ray nor torch.


@dataclass(frozen=True)
class QueueBatch:
    """``MessageQueue.get``: whole groups, FIFO, and the samples dropped as too stale on the way."""

    samples: list[Sample]  # [k] with k >= the number asked for (whole groups), or fewer once closed
    dropped: int  # samples dropped as too stale during this call


@dataclass
class QueueCounters:
    """The queue's cumulative counts, in samples. Conservation (checked by tests)::

    admitted == consumed + queued + dropped_stale + in_flight(rollouters)
    """

    admitted: int = 0
    generated: int = 0  # samples that reached the queue
    consumed: int = 0  # samples handed to the trainer
    dropped_stale: int = 0  # dropped at consumption or by a rollouter before finishing


@dataclass(frozen=True)
class QueueStats:
    """``MessageQueue.stats``: depth, counters and the first fatal error any actor reported."""

    queued: int  # samples on the queue now
    max_depth: int  # the deepest the queue got, in samples
    admitted: int
    generated: int
    consumed: int
    dropped_stale: int
    failure: str | None


@dataclass(frozen=True)
class QueueSnapshot:
    """``MessageQueue.snapshot`` / ``restore``: queued groups (FIFO order) and the counters."""

    groups: list[list[Sample]]
    counters: QueueCounters


@dataclass(frozen=True)
class PauseState:
    """``Rollouter.pause`` / ``restore``: what a rollouter holds that is admitted but not queued.

    ``pending``: groups with unfinished (``abort``) samples, continued on resume; ``parked``: admitted
    units of prompts not started yet, one list per parked unit; ``prompts``: the prompt stream's own
    ``state_dict`` (its position); ``in_flight``: admitted samples held here (pending + parked x n);
    ``sampler``: the worker's sampling random numbers (``RolloutWorker.sampler_state``; None: the
    engine keeps them, or a checkpoint written before they were saved).
    """

    pending: list[list[Sample]]
    parked: list[list[Prompt]]
    prompts: dict[str, Any]
    in_flight: int
    sampler: bytes | None = None


@dataclass(frozen=True)
class RolloutHealth:
    """``Rollouter.health``: progress figures for the step metrics and the watchdog (seconds are
    ``time.monotonic`` differences in the rollouter's process)."""

    version: int  # the weights the worker holds
    busy_s: float  # cumulative time inside worker calls, per loop thread
    call_running_s: float  # how long the oldest running worker call has run (0: none running)
    samples_out: int  # samples put on the queue so far
    tokens_out: int  # response tokens of those samples
    since_progress_s: float  # since a worker call last ended
    now: float  # the rollouter's monotonic clock when it answered
    counters: dict[str, float]  # cumulative metric counters (``Rollouter.counters``), by metric name


@dataclass(frozen=True)
class RolloutStopped:
    """``Rollouter.stop``: admitted samples still held, and whether a loop thread outlived the join."""

    in_flight: int
    alive: bool


@dataclass(frozen=True)
class WeightLoadTiming:
    """One rollouter's part of a weight sync (``update_weights`` / ``receive_weights``), seconds."""

    wait_s: float  # waiting for the worker-exclusive section
    total_s: float  # from the call to the loaded weights
    get_s: float | None = None  # fetching the sync's object (object store only)


@dataclass(frozen=True)
class TransferGroup:
    """A rollout worker's place in the trainer's broadcast weight group (``pipeline.sync_backend: gloo |
    nccl``): the trainer is rank 0 and hosts the group's store at ``master_address:master_port``; the
    worker takes ranks ``rank_offset ..`` (an engine one per GPU). One description for every backend,
    built by ``weights.sync.BroadcastSync``; each worker takes what its engine lets it use."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    backend: str  # "gloo" | "nccl"
    timeout_s: float  # bounds the join and each collective (where the engine lets it be set)
    max_bucket_bytes: int  # the largest bucket the trainer sends (vLLM's packed buffer is this size)


@dataclass(frozen=True)
class SendStats:
    """The trainer's part of a broadcast sync: buckets and bytes sent, seconds spent."""

    buckets: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class SyncTiming:
    """Seconds spent in one sync: publish (trainer put), load (slowest rollouter), total."""

    version: int
    publish_s: float
    load_s: float
    total_s: float
    per_rollouter: list[WeightLoadTiming] = field(default_factory=list)  # [num_rollouters]


# What a sample carries to the platform of a multi-turn episode (``wire.SampleIn.turns``'s bounds; here,
# beside the type, so that the engine's envs need not import the wire format).
MAX_SAMPLE_TURNS = 128  # turns of a multi-turn episode's sample (env.max_turns <= 64)
MAX_TURN_TEXT = 8000  # characters of one turn's text (the engine cuts a longer one)


@dataclass(frozen=True)
class ExampleTurn:
    """One turn of a multi-turn episode shown with its example (``rl_engine.envs.transcript``): the
    policy's (role ``assistant``: its sampled tokens and their mean behaviour log-prob) or the
    environment's message (role ``user`` or ``tool``: tokens it wrote, no log-prob)."""

    role: str
    text: str
    tokens: int
    logprob_mean: float | None = None


@dataclass(frozen=True)
class ExampleSample:
    """One trained sample shown to the sink (``sink.log_samples`` takes ``to_dict()``)."""

    prompt: str
    response: str
    answer: str
    reward: float
    param_version_start: int
    param_version_end: int
    # each reward component's score (``sample.extra["reward/<label>"]`` of a ``reward.combine`` or a
    # plugin's figures), by label; None for a single reward without figures
    reward_parts: dict[str, float] | None = None
    # a multi-turn episode's turns in order (policy turns and the environment's messages); None for a
    # single-turn sample
    turns: list[ExampleTurn] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The sink's dict (``reward_parts`` and ``turns`` left out where there are none)."""
        out = asdict(self)
        for key in ("reward_parts", "turns"):
            if out[key] is None:
                del out[key]
        return out


class StepAborted(Exception):
    """A trainer step stopped between micro-batches on a stop request, before its first optimizer
    update: nothing of it was applied (gradients dropped, random state restored)."""


@dataclass(frozen=True)
class StepCancelled:
    """``TrainerActor.train_step`` returned without training: a stop was requested while it waited, or
    while it trained and before its first optimizer update (``abandoned``: the step was cut between
    micro-batches). Either way the samples it had taken went back to the queue front."""

    wait_s: float
    abandoned: bool = False
    train_s: float = 0.0  # time spent on the abandoned step before it stopped


@dataclass(frozen=True)
class StepResult:
    """``TrainerActor.train_step``: one trained batch. Per-sample lists are ``[B]``, in batch order."""

    version: int  # the trainer's version after the step (steps applied so far)
    trainer_metrics: dict[str, float]  # the policy trainer's own metrics, by metric name
    wait_s: float  # gathering the batch from the queue
    train_s: float
    dropped_now: int  # samples the queue dropped as too stale while this batch was gathered
    staleness: list[int]  # [B] trainer version before the step - param_version_start
    rewards: list[float]  # [B]
    lengths: list[int]  # [B] response tokens
    partial: list[bool]  # [B] spans several weight versions or was interrupted
    gen_s: list[float]  # [B] generation wall time
    uids: list[str]  # [B] "group_id/index in group"
    examples: list[ExampleSample]  # at most logging.samples_per_step, drawn from the batch
    # set when the step publishes a weight sync (object store): ``[ObjectRef]`` of the published
    # weights, boxed in a list so Ray passes the ref instead of fetching it; and the put's seconds
    weights_box: list[Any] | None = None
    publish_s: float = 0.0
    # the mean of each component of a weighted-sum reward over the batch: {"reward/<key>/mean": mean}
    reward_parts: dict[str, float] = field(default_factory=dict)
    # [B] the sample's reward could not be computed (``Sample.unscored``); empty: all scored
    unscored: list[bool] = field(default_factory=list)


@dataclass(frozen=True)
class EvalSummary:
    """``Rollouter.evaluate`` / ``Evaluator.run``: one held-out evaluation, sent to the sink as ``val/``
    metrics (``metrics()``; the names are documented in ``rl_engine.evaluation``)."""

    reward_mean: float
    response_length: float  # mean response tokens
    truncated_ratio: float
    aborted_ratio: float
    reward_errors: int
    num_prompts: int
    n: int  # responses per prompt (eval.n)
    pass_at_1: float
    pass_at_n: float  # pass@n; equals pass_at_1 when n = 1
    param_version: int  # the weights of the first chunk
    param_version_end: int  # the weights of the last chunk (a weight update may land between chunks)
    time_s: float
    # a weighted-sum reward's component means: {"reward/<key>/mean": mean}, reported as val/reward/<key>/mean
    reward_parts: dict[str, float] = field(default_factory=dict)
    # each of data.extra_validation_splits evaluated on its own, by split: reported as val/<split>/<metric>
    sets: dict[str, EvalSummary] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        out = self._own_metrics()
        for split, summary in self.sets.items():
            out.update(
                {
                    f"val/{split}/{name.removeprefix('val/')}": value
                    for name, value in summary.set_metrics().items()
                }
            )
        return out

    def set_metrics(self) -> dict[str, float]:
        """An extra split's figures (its weights versions and time are the evaluation's own)."""
        skip = {"val/param_version", "val/param_version_end", "val/time_s"}
        return {name: value for name, value in self._own_metrics().items() if name not in skip}

    def _own_metrics(self) -> dict[str, float]:
        out = {
            "val/reward_mean": self.reward_mean,
            "val/response_length": self.response_length,
            "val/truncated_ratio": self.truncated_ratio,
            "val/aborted_ratio": self.aborted_ratio,
            "val/reward_errors": float(self.reward_errors),
            "val/num_prompts": float(self.num_prompts),
            "val/pass@1": self.pass_at_1,
        }
        if self.n != 1:
            out[f"val/pass@{self.n}"] = self.pass_at_n
        out["val/param_version"] = float(self.param_version)
        out["val/param_version_end"] = float(self.param_version_end)
        out["val/time_s"] = self.time_s
        out.update({f"val/{key}": value for key, value in self.reward_parts.items()})
        return out
