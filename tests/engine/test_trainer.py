"""PolicyTrainer: updates move the policy the right way, schedule length, off-policy modes, exact resume."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.config import TrainerConfig
from rl_engine.data import PromptStream
from rl_engine.rewards import build_reward
from rl_engine.trainer import PolicyTrainer
from rl_engine.trainer.schedule import build_lr_multiplier, optimizer_steps_per_trainer_step
from rl_engine.types import Sample


def _scored_batch(cfg, worker=None, stream=None) -> list[Sample]:
    worker = worker or build_rollout_worker(cfg)
    stream = stream or PromptStream(cfg, worker.tokenizer)
    samples = worker.generate(stream.next_batch(cfg.trainer.batch_size // cfg.rollout.n), cfg.rollout.n)
    reward = build_reward(cfg.reward)
    for i, s in enumerate(samples):
        # The untrained policy almost never earns a reward: score by a fixed rule so advantages are non-zero.
        s.reward = reward(s) + float(i % 3 == 0)
    return samples


def _params(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}


@pytest.mark.smoke
def test_params_change_after_a_step_and_version_counts(make_cfg):
    cfg = make_cfg("trainer.batch_size=16", "trainer.mini_batch_size=8", "rollout.max_new_tokens=4")
    trainer = PolicyTrainer(cfg)
    before = _params(trainer)
    metrics = trainer.train_step(_scored_batch(cfg))
    after = _params(trainer)
    assert trainer.version == 1
    assert trainer.optimizer_steps == 2
    assert sum(not torch.equal(before[k], after[k]) for k in before) == len(before)
    for key in [
        "actor/pg_loss",
        "actor/entropy",
        "actor/clipfrac",
        "actor/approx_kl",
        "actor/grad_norm",
        "actor/lr",
    ]:
        assert np.isfinite(metrics[key]), key
    assert metrics["actor/lr"] == pytest.approx(cfg.trainer.lr)
    with pytest.raises(ValueError, match="batch_size=16"):
        trainer.train_step(_scored_batch(cfg)[:8])


def test_loss_decreases_on_a_fixed_batch(make_cfg):
    cfg = make_cfg(
        "trainer.batch_size=16",
        "trainer.mini_batch_size=16",
        "rollout.max_new_tokens=4",
        "algorithm.clip_eps_high=10",
        "algorithm.clip_eps_low=0.9",
    )
    trainer = PolicyTrainer(cfg)
    batch = _scored_batch(cfg)
    losses = [trainer.train_step(batch)["actor/pg_loss"] for _ in range(6)]
    assert losses[-1] < losses[0] - 0.05
    # And the policy moved towards the rewarded responses: their log-likelihood went up.
    good = [s for s in batch if s.reward > 0]
    new = trainer.compute_logprobs(good)
    assert np.mean([sum(n) - sum(s.logprobs) for s, n in zip(good, new, strict=True)]) > 0


@pytest.mark.parametrize("kind", ["linear", "cosine", "constant"])
def test_lr_schedule_counts_optimizer_steps_and_never_hits_zero_early(kind):
    tc = TrainerConfig(
        total_steps=10,
        batch_size=64,
        mini_batch_size=16,
        ppo_epochs=2,
        lr_schedule=kind,
        warmup_steps=2,
        min_lr_ratio=0.0,
    )
    mult, total = build_lr_multiplier(tc)
    assert optimizer_steps_per_trainer_step(tc) == 8
    assert total == 80
    values = [mult(k) for k in range(total)]
    assert all(v > 0 for v in values)
    assert values[0] == pytest.approx(1 / 16)  # warmup of 2 trainer steps = 16 optimizer steps
    assert values[15] == pytest.approx(1.0)
    if kind != "constant":
        assert values[-1] < 0.05
        assert all(a >= b for a, b in itertools.pairwise(values[16:]))


def test_trainer_lr_follows_schedule_over_the_whole_run(make_cfg):
    cfg = make_cfg(
        "trainer.total_steps=3",
        "trainer.batch_size=16",
        "trainer.mini_batch_size=8",
        "trainer.ppo_epochs=2",
        "trainer.lr_schedule=linear",
        "rollout.max_new_tokens=2",
    )
    trainer = PolicyTrainer(cfg)
    seen = []
    batch = _scored_batch(cfg)
    for _ in range(3):
        trainer.train_step(batch)
        seen.append(trainer.optimizer.param_groups[0]["lr"])
    assert trainer.optimizer_steps == trainer.total_optimizer_steps == 12
    # After the last optimizer step the scheduler has run out exactly (multiplier (N - N) / N = 0).
    assert seen[-1] == pytest.approx(0.0, abs=1e-12)
    assert seen[0] > seen[1] > 0


def test_micro_batches_accumulate_to_the_same_update(make_cfg):
    base = [
        "trainer.batch_size=16",
        "trainer.mini_batch_size=16",
        "rollout.max_new_tokens=4",
        "algorithm.loss_agg=seq_mean_token_sum_norm",
    ]
    full = PolicyTrainer(make_cfg(*base))
    micro = PolicyTrainer(make_cfg(*base, "trainer.micro_batch_size=4"))
    batch = _scored_batch(make_cfg(*base))
    mf, mm = full.train_step(batch), micro.train_step(batch)
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert mf[key] == pytest.approx(mm[key], abs=1e-6), key
    # to 1% of a learning-rate step: see test_scale's token-budget version of this test
    for (k, a), b in zip(full.model.named_parameters(), micro.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-2 * full.cfg.trainer.lr), k


def test_tis_and_decoupled_report_importance_ratios(make_cfg):
    base = ["trainer.batch_size=16", "trainer.mini_batch_size=16", "rollout.max_new_tokens=4"]
    cfg = make_cfg(*base, "algorithm.off_policy=tis", "algorithm.tis_threshold=1.5")
    trainer = PolicyTrainer(cfg)
    batch = _scored_batch(cfg)
    m = trainer.train_step(batch)
    # Behaviour and recomputed log-probs come from the same weights: ratio 1, nothing truncated.
    assert m["off_policy/is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    assert m["off_policy/tis_clipfrac"] == 0.0
    # Make the behaviour policy look much less likely than the current one: weights get truncated.
    for s in batch:
        s.logprobs = [lp - 1.0 for lp in s.logprobs]
    m = trainer.train_step(batch)
    assert m["off_policy/is_ratio_max"] > 1.5 and m["off_policy/tis_clipfrac"] > 0.5

    dec = PolicyTrainer(make_cfg(*base, "algorithm.off_policy=decoupled", "algorithm.tis_threshold=2.0"))
    # Decoupled PPO keeps no second model: the proximal log-probs come from the current weights.
    # (``policy`` is the forward wrapped around that same model, not a copy)
    assert [k for k, v in vars(dec).items() if isinstance(v, torch.nn.Module)] == ["model", "policy"]
    assert dec.policy.lm is dec.model
    fresh = _scored_batch(make_cfg(*base))
    assert dec.train_step(fresh)["off_policy/is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    # The proximal policy is the weights before this step's update, not the initial ones: after the
    # first step, behaviour (initial) and proximal (current) log-probs differ.
    m = dec.train_step(fresh)
    assert abs(m["off_policy/is_ratio_mean"] - 1.0) > 1e-4
    # Tokens whose weight exp(proximal - behaviour) exceeds the cap are filtered out (AReaL), not
    # truncated: shifted behaviour log-probs put every token over the cap and the update is empty.
    for s in fresh:
        s.logprobs = [lp - 5.0 for lp in s.logprobs]  # weights ~ e^5 >> 2 on every token
    m = dec.train_step(fresh)
    assert m["off_policy/tis_clipfrac"] == 1.0
    assert m["actor/pg_loss"] == 0.0 and m["actor/grad_norm"] == 0.0


def test_reference_model_only_with_kl(make_cfg):
    base = ["trainer.batch_size=16", "trainer.mini_batch_size=16", "rollout.max_new_tokens=4"]
    assert PolicyTrainer(make_cfg(*base)).ref_model is None
    trainer = PolicyTrainer(make_cfg(*base, "algorithm.kl_coef=0.1"))
    batch = _scored_batch(make_cfg(*base))
    assert trainer.train_step(batch)["actor/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # still at the reference
    assert trainer.train_step(batch)["actor/kl_ref"] > 0.0


def test_checkpoint_resume_continues_bit_identically(make_cfg, tmp_path: Path):
    cfg = make_cfg(
        "trainer.batch_size=16",
        "trainer.mini_batch_size=8",
        "trainer.ppo_epochs=2",
        "rollout.max_new_tokens=4",
        "algorithm.off_policy=decoupled",
        "trainer.lr_schedule=cosine",
        "trainer.warmup_steps=1",
    )
    worker = build_rollout_worker(cfg)
    stream = PromptStream(cfg, worker.tokenizer)
    b1, b2 = _scored_batch(cfg, worker, stream), _scored_batch(cfg, worker, stream)

    a = PolicyTrainer(cfg)
    a.train_step(b1)
    a.mark_synced()
    a.save_checkpoint(tmp_path / "ckpt", {"data": {"position": 4}, "queued": b2[:2]})
    torch.manual_seed(1234)  # the global RNG moves on after the save; the checkpoint restores it
    ma = a.train_step(b2)

    b = PolicyTrainer(cfg)
    extra = b.load_checkpoint(tmp_path / "ckpt")
    assert extra["data"] == {"position": 4} and extra["queued"] == b2[:2]
    assert b.version == 1 and b.optimizer_steps == 4
    mb = b.train_step(b2)
    for (k, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), k
    assert ma["actor/pg_loss"] == mb["actor/pg_loss"]
    assert a.optimizer.param_groups[0]["lr"] == b.optimizer.param_groups[0]["lr"]
    # The checkpoint's model/ is a normal model directory.
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt" / "model")) is not None
    # Overwriting an existing checkpoint replaces it atomically and leaves no temp dirs.
    b.save_checkpoint(tmp_path / "ckpt", {})
    assert b.load_checkpoint(tmp_path / "ckpt") == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_load_checkpoint_rejects_a_non_checkpoint(make_cfg, tmp_path: Path):
    trainer = PolicyTrainer(make_cfg())
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        trainer.load_checkpoint(tmp_path)


def test_weights_numpy_are_contiguous_copies(make_cfg):
    trainer = PolicyTrainer(make_cfg())
    w = trainer.weights_numpy()
    assert set(w) == {k for k, _ in trainer.model.named_parameters()}
    assert all(a.flags["C_CONTIGUOUS"] and a.dtype == np.float32 for a in w.values())
    w["model.norm.weight"][:] = 123.0  # a copy: the trainer's weights are untouched
    assert float(trainer.model.model.norm.weight[0].detach()) != 123.0


def test_entropy_bonus_raises_entropy_when_advantages_are_zero(make_cfg):
    cfg = make_cfg(
        "trainer.batch_size=16",
        "trainer.mini_batch_size=16",
        "rollout.max_new_tokens=4",
        "algorithm.entropy_coef=1.0",
        "trainer.lr=1e-2",
    )
    trainer = PolicyTrainer(cfg)
    batch = _scored_batch(cfg)
    for s in batch:
        s.reward = 1.0  # every group uniform: zero advantages, the entropy term alone drives the update
    first = trainer.train_step(batch)["actor/entropy"]
    for _ in range(3):
        last = trainer.train_step(batch)["actor/entropy"]
    assert last > first + 1e-3


def _finite_params(trainer: PolicyTrainer) -> bool:
    return all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_a_pathological_behaviour_logprob_does_not_poison_the_update(make_cfg):
    base = ["trainer.batch_size=16", "trainer.mini_batch_size=16", "rollout.max_new_tokens=4"]
    for extra in ([], ["algorithm.dual_clip_c=null"]):
        trainer = PolicyTrainer(make_cfg(*base, *extra))
        batch = _scored_batch(make_cfg(*base))
        batch[0].logprobs[0] = -1e4  # finite but absurd: exp(logp - old) overflows without the clamp
        m = trainer.train_step(batch)
        assert np.isfinite(m["actor/pg_loss"]) and np.isfinite(m["actor/grad_norm"]), extra
        assert _finite_params(trainer), extra
        assert m["error/nonfinite_behaviour_logprobs"] == 0.0


def test_non_finite_behaviour_logprobs_reject_their_samples_with_an_error_metric(make_cfg):
    base = ["trainer.batch_size=16", "trainer.mini_batch_size=8", "rollout.max_new_tokens=4"]
    for off_policy in ("none", "tis"):
        cfg = make_cfg(*base, f"algorithm.off_policy={off_policy}")
        batch = _scored_batch(cfg)
        clean = PolicyTrainer(cfg)
        assert clean.train_step(batch)["error/nonfinite_behaviour_logprobs"] == 0.0
        batch[1].logprobs[-1] = float("nan")
        batch[6].logprobs[0] = float("-inf")
        trainer = PolicyTrainer(cfg)
        before = _params(trainer)
        m = trainer.train_step(batch)
        assert m["error/nonfinite_behaviour_logprobs"] == 2.0
        assert all(np.isfinite(v) for v in m.values()), {k: v for k, v in m.items() if not np.isfinite(v)}
        assert _finite_params(trainer)
        assert any(not torch.equal(before[k], p) for k, p in trainer.model.named_parameters())


def test_reinforce_pp_with_one_response_per_prompt_still_learns(make_cfg):
    cfg = make_cfg(
        "rollout.n=1",
        "algorithm.advantage=reinforce_pp",
        "trainer.batch_size=8",
        "trainer.mini_batch_size=8",
        "rollout.max_new_tokens=4",
    )
    trainer = PolicyTrainer(cfg)
    batch = _scored_batch(cfg)
    assert len({s.reward for s in batch}) > 1
    before = _params(trainer)
    trainer.train_step(batch)
    moved = sum(not torch.equal(before[k], p) for k, p in trainer.model.named_parameters())
    assert moved == len(before)  # every parameter got a gradient: advantages are not all zero


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_a_resume_with_a_changed_config_trains_with_the_configs_optimizer_settings(
    make_cfg, tmp_path: Path, schedule: str
):
    """A fork: saved at lr A, restored with a config at lr B (and other betas and weight decay). The
    param groups carry B (scaled by the schedule at the checkpoint's optimizer step) and the next step
    moves the weights exactly as a fresh torch AdamW with the checkpoint's state at lr B would."""
    common = (
        "trainer.batch_size=8",
        "trainer.mini_batch_size=8",
        "trainer.ppo_epochs=1",
        "rollout.max_new_tokens=4",
        f"trainer.lr_schedule={schedule}",
        "trainer.total_steps=6",
    )
    lr_a, lr_b = 1e-3, 5e-5
    cfg_a = make_cfg(*common, f"trainer.lr={lr_a}")
    cfg_b = make_cfg(*common, f"trainer.lr={lr_b}", "trainer.betas=[0.8,0.95]", "trainer.weight_decay=0.1")
    worker = build_rollout_worker(cfg_a)
    stream = PromptStream(cfg_a, worker.tokenizer)
    b1, b2, b3 = (_scored_batch(cfg_a, worker, stream) for _ in range(3))

    a = PolicyTrainer(cfg_a)
    a.train_step(b1)
    a.train_step(b2)
    a.mark_synced()
    a.save_checkpoint(tmp_path / "ckpt", {})

    b = PolicyTrainer(cfg_b)
    b.load_checkpoint(tmp_path / "ckpt")
    assert b.version == 2 and b.optimizer_steps == 2
    multiplier, _ = build_lr_multiplier(cfg_b.trainer)
    for group in b.optimizer.param_groups:
        assert group["lr"] == pytest.approx(lr_b * multiplier(2), rel=1e-12)
        assert group["initial_lr"] == lr_b
        assert tuple(group["betas"]) == (0.8, 0.95) and group["weight_decay"] == 0.1
    assert b.scheduler.get_last_lr() == [pytest.approx(lr_b * multiplier(2), rel=1e-12)]

    before = [p.detach().clone() for p in b.optimizer.param_groups[0]["params"]]
    grads: list[torch.Tensor] = []
    b.optimizer.register_step_pre_hook(
        lambda opt, *_: grads.extend(p.grad.detach().clone() for p in opt.param_groups[0]["params"])
    )
    metrics = b.train_step(b3)
    assert metrics["actor/lr"] == pytest.approx(lr_b * multiplier(2), rel=1e-12)
    after = [p.detach() for p in b.optimizer.param_groups[0]["params"]]

    def reference(lr: float) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(t.clone()) for t in before]
        opt = torch.optim.AdamW(params, lr=lr, betas=(0.8, 0.95), weight_decay=0.1)
        opt.load_state_dict(torch.load(tmp_path / "ckpt" / "optimizer.pt", weights_only=False))
        for group in opt.param_groups:  # the checkpoint's state, the fork's hyper-parameters
            group.update(lr=lr, betas=(0.8, 0.95), weight_decay=0.1)
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        return [p.detach() for p in params]

    expected = reference(lr_b * multiplier(2))
    for got, want in zip(after, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
    # ... and not as the checkpoint's learning rate would have moved them
    stale = reference(lr_a * multiplier(2))
    assert max((g - s).abs().max().item() for g, s in zip(after, stale, strict=True)) > 1e-6
    assert b.optimizer.state[b.optimizer.param_groups[0]["params"][0]]["step"].item() == 3


def _optimizer_state(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    state = trainer.optimizer.state_dict()["state"]
    return {f"{i}.{k}": v.clone() for i, s in state.items() for k, v in s.items() if torch.is_tensor(v)}


@pytest.mark.parametrize("stop_after", [1, 3, 5])
def test_a_stop_between_micro_batches_abandons_the_step_with_nothing_applied(make_cfg, stop_after):
    """A stop during the old log-probs (1), during the forward/backward passes (3, 5) of a step: the step
    is abandoned (StepAborted), and the trainer is exactly where the last completed step left it: the
    next step from there equals, bit for bit, that of a trainer that was never stopped (the reference)."""
    from rl_engine.types import StepAborted

    cfg = make_cfg(
        "trainer.batch_size=16",
        "trainer.mini_batch_size=16",
        "trainer.micro_batch_size=4",  # 4 micro-batches: stop points before each, in both passes
        "rollout.max_new_tokens=4",
        "algorithm.off_policy=tis",  # old log-probs recomputed: the first pass of micro-batches
    )
    worker = build_rollout_worker(cfg)
    stream = PromptStream(cfg, worker.tokenizer)
    b1, b2 = _scored_batch(cfg, worker, stream), _scored_batch(cfg, worker, stream)
    stopped, reference = PolicyTrainer(cfg), PolicyTrainer(cfg)
    for t in (stopped, reference):
        t.train_step(b1)
    params, moments = _params(stopped), _optimizer_state(stopped)
    lr = stopped.optimizer.param_groups[0]["lr"]

    asked = itertools.count(1)
    with pytest.raises(StepAborted):
        stopped.train_step(b2, stop=lambda: next(asked) >= stop_after)
    assert next(asked) == stop_after + 1  # it stopped at the first yes
    assert stopped.version == 1 and stopped.optimizer_steps == 1
    assert all(p.grad is None for p in stopped.model.parameters())
    after, moments_after = _params(stopped), _optimizer_state(stopped)
    assert all(torch.equal(params[k], after[k]) for k in params)
    assert moments.keys() == moments_after.keys()
    assert all(torch.equal(moments[k], moments_after[k]) for k in moments)
    assert stopped.optimizer.param_groups[0]["lr"] == lr

    torch.manual_seed(99)
    m_stopped = stopped.train_step(b2)
    torch.manual_seed(99)
    m_reference = reference.train_step(b2)
    for (k, a), b in zip(stopped.model.named_parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(a, b), k
    assert m_stopped["actor/pg_loss"] == m_reference["actor/pg_loss"]
    assert m_stopped["timing/stop_gap_max_s"] > 0 and m_stopped["timing/step_tail_s"] > 0


def test_a_stop_after_the_first_optimizer_update_lets_the_step_finish(make_cfg):
    """Two mini-batches: once the first update is applied, the step cannot be undone: a stop asked from
    then on is not asked at all, and the step completes like an unstopped one."""
    cfg = make_cfg("trainer.batch_size=16", "trainer.mini_batch_size=8", "rollout.max_new_tokens=4")
    batch = _scored_batch(cfg)
    a, b = PolicyTrainer(cfg), PolicyTrainer(cfg)
    updates_before: list[int] = []

    def stop() -> bool:
        updates_before.append(a.optimizer_steps)
        return a.optimizer_steps >= 1  # only once an update happened: never asked then

    a.train_step(batch, stop=stop)
    b.train_step(batch)
    assert a.version == 1 and a.optimizer_steps == 2 and set(updates_before) == {0}
    for (k, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), k


@pytest.mark.parametrize("off_policy", ["none", "tis", "decoupled"])
def test_sync_and_fully_async_give_the_same_update_on_the_same_batch(make_cfg, off_policy):
    """The modes differ in scheduling (when batches are generated, how stale they may be), never in the
    loss: the same batch from the same weights gives the same update, bit for bit, whatever the mode."""
    common = ("trainer.batch_size=16", "trainer.mini_batch_size=8", "rollout.max_new_tokens=4",
              f"algorithm.off_policy={off_policy}")  # fmt: skip
    sync = make_cfg(*common, "pipeline.mode=sync", "pipeline.staleness_threshold=0")
    fully_async = make_cfg(*common, "pipeline.mode=fully_async", "pipeline.staleness_threshold=2")
    batch = _scored_batch(sync)
    results = []
    for cfg in (sync, fully_async):
        trainer = PolicyTrainer(cfg)
        torch.manual_seed(5)
        metrics = trainer.train_step(batch)
        results.append((_params(trainer), metrics))
    (p_sync, m_sync), (p_async, m_async) = results
    assert all(torch.equal(p_sync[k], p_async[k]) for k in p_sync)
    assert {k: v for k, v in m_sync.items() if not k.startswith("timing/")} == {
        k: v for k, v in m_async.items() if not k.startswith("timing/")
    }
