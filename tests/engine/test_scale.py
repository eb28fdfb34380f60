"""The trainer at real scale, proven on the tiny model: chunked output-layer log-probs equal the full
logits path (values and gradients), device placement, bf16 that learns, gradient checkpointing."""

from __future__ import annotations

import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.config import ConfigError
from rl_engine.models import resolve_device
from rl_engine.models.batching import token_logprobs_and_entropy
from rl_engine.models.logprobs import LinearHead, chunked_logprobs_and_entropy, linear_head_of
from rl_engine.trainer import PolicyTrainer
from rl_engine.trainer.microbatch import plan_micro_batches, select
from tests.engine.test_trainer import _params, _scored_batch

BASE = ["trainer.batch_size=16", "trainer.mini_batch_size=16", "rollout.max_new_tokens=6"]


def _reference(hidden, weight, bias, targets, temperature):
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return token_logprobs_and_entropy(logits, targets, temperature, entropy_grad=True)


@pytest.mark.parametrize("chunk", [1, 7, 1000])
@pytest.mark.parametrize("with_bias", [False, True])
def test_chunked_head_equals_full_logits_values_and_gradients(chunk, with_bias):
    g = torch.Generator().manual_seed(0)
    n, h, v = 37, 16, 101
    # logits of order 1, as a language model's are (the tolerance is absolute)
    hidden = (0.5 * torch.randn(n, h, generator=g)).requires_grad_()
    weight = (0.5 * torch.randn(v, h, generator=g)).requires_grad_()
    bias = torch.randn(v, generator=g).requires_grad_() if with_bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    gl, ge = torch.randn(n, generator=g), torch.randn(n, generator=g)  # arbitrary upstream gradients
    ref_lp, ref_ent = _reference(hidden, weight, bias, targets, 0.7)
    inputs = [hidden, weight] + ([bias] if with_bias else [])
    ref_grads = torch.autograd.grad((ref_lp * gl).sum() + (ref_ent * ge).sum(), inputs, retain_graph=True)
    lp, ent = chunked_logprobs_and_entropy(hidden, LinearHead(weight, bias), targets, 0.7, chunk_tokens=chunk)
    grads = torch.autograd.grad((lp * gl).sum() + (ent * ge).sum(), inputs)
    assert (lp - ref_lp).abs().max() <= 1e-5 and (ent - ref_ent).abs().max() <= 1e-5
    for a, b in zip(grads, ref_grads, strict=True):
        assert (a - b).abs().max() <= 1e-5
    # Entropy as a metric only: no gradient flows through it, the log-prob gradient is unchanged.
    lp, ent = chunked_logprobs_and_entropy(
        hidden, LinearHead(weight, bias), targets, 0.7, chunk_tokens=chunk, entropy_grad=False
    )
    assert not ent.requires_grad
    only_lp = torch.autograd.grad((lp * gl).sum(), inputs)
    ref_only = torch.autograd.grad((ref_lp * gl).sum(), inputs)
    for a, b in zip(only_lp, ref_only, strict=True):
        assert (a - b).abs().max() <= 1e-5


def test_trainer_forward_equals_the_full_logits_path_on_the_tiny_model(make_cfg):
    cfg = make_cfg(*BASE, "rollout.temperature=0.7", "trainer.logits_chunk_tokens=5", "data.task=add")
    trainer = PolicyTrainer(cfg)
    batch = trainer.pack_samples(_scored_batch(cfg)).to(trainer.device)
    mask = batch.response_mask.bool()
    assert linear_head_of(trainer.model) is not None  # the chunked path is the one under test
    # the trainer's layout (rows left-aligned, no attention mask) against the model's own forward on
    # the shared left-padded layout with its mask (what the rollout runs)
    mb = select(batch, torch.arange(16), trainer.pad_id)
    lp, ent = trainer._forward(trainer.policy, mb, with_entropy=True, entropy_grad=True)
    loss = (lp * mask).sum() + 0.3 * (ent * mask).sum()
    new_grads = torch.autograd.grad(loss, list(trainer.model.parameters()))
    width = batch.response_mask.shape[1]
    logits = trainer.model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=width + 1,
    ).logits[:, :-1]
    ref_lp, ref_ent = token_logprobs_and_entropy(logits, batch.response_ids, 0.7, entropy_grad=True)
    ref_loss = (ref_lp * mask).sum() + 0.3 * (ref_ent * mask).sum()
    ref_grads = torch.autograd.grad(ref_loss, list(trainer.model.parameters()))
    assert (lp - ref_lp)[mask].abs().max() <= 1e-5
    assert (ent - ref_ent)[mask].abs().max() <= 1e-5
    for (name, _), a, b in zip(trainer.model.named_parameters(), new_grads, ref_grads, strict=True):
        assert (a - b).abs().max() <= 1e-5, name


def test_token_budget_packs_rows_and_aligns_them_without_padding_on_the_left(make_cfg):
    # rows of (prompt, response) tokens; budget 24 tokens = rows x longest row, at most 3 rows
    plan = plan_micro_batches([4, 4, 6, 2, 4, 9], [2, 3, 2, 8, 1, 20], max_rows=3, max_tokens=24)
    # [0, 1, 2] costs 3 x 8 = 24; [3, 4] = 2 x 10 = 20; 5 alone is over the budget (29) but still runs
    assert plan == [[0, 1, 2], [3, 4], [5]]
    cfg = make_cfg(*BASE, "data.task=add")
    trainer = PolicyTrainer(cfg)
    samples = _scored_batch(cfg)
    batch = trainer.pack_samples(samples)
    rows = torch.tensor([5, 0])
    mb = select(batch, rows, trainer.pad_id)
    for k, i in enumerate(rows.tolist()):
        s = samples[i]
        n = len(s.prompt_ids) + len(s.response_ids)
        assert mb.input_ids[k, :n].tolist() == s.prompt_ids + s.response_ids  # left-aligned
        assert set(mb.input_ids[k, n:].tolist()) <= {trainer.pad_id}
        assert mb.targets[mb.rows == k].tolist() == s.response_ids
    full, _ = trainer._forward(
        trainer.policy, select(batch, torch.arange(16), trainer.pad_id), with_entropy=False
    )
    part, _ = trainer._forward(trainer.policy, mb, with_entropy=False)
    assert (full[rows, : mb.width] - part).abs().max() <= 1e-6


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("split", ["trainer.micro_batch_size=4", "trainer.max_tokens_per_micro_batch=40"])
def test_token_budget_micro_batches_accumulate_to_the_mini_batch_update(make_cfg, agg, split):
    base = [*BASE, f"algorithm.loss_agg={agg}", "data.task=add", "algorithm.entropy_coef=0.01"]
    full, micro = PolicyTrainer(make_cfg(*base)), PolicyTrainer(make_cfg(*base, split))
    batch = _scored_batch(make_cfg(*base))
    assert len(micro._micro_batches(micro.pack_samples(batch), torch.arange(16))) > 2
    assert len(full._micro_batches(full.pack_samples(batch), torch.arange(16))) == 1
    mf, mm = full.train_step(batch), micro.train_step(batch)
    for key in ("actor/pg_loss", "actor/entropy", "actor/clipfrac", "actor/grad_norm"):
        assert mf[key] == pytest.approx(mm[key], abs=1e-6), key
    # The same update to 1% of one learning-rate step: AdamW divides by sqrt(v), so the float rounding
    # of a summed gradient (which differs between CPUs' kernels) shows up magnified in elements whose
    # gradient is near zero (measured up to 2.4e-6 at lr 6e-4 on one CPU, below 1e-6 on another). A
    # wrong accumulation changes the loss and gradient norm above, and flips the sign of many elements'
    # gradients: a difference of a whole step (2 lr) there.
    lr = full.cfg.trainer.lr
    for (k, a), b in zip(full.model.named_parameters(), micro.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-2 * lr), k


def test_everything_lives_on_the_trainer_device_and_auto_resolves_by_gpus(make_cfg, monkeypatch):
    cfg = make_cfg(*BASE, "algorithm.kl_coef=0.1", "algorithm.off_policy=tis")
    trainer = PolicyTrainer(cfg)
    assert str(trainer.device) == "cpu" and cfg.trainer.device == "auto"
    data = trainer._prepare(_scored_batch(cfg))
    trainer.train_step(_scored_batch(cfg))
    tensors = {
        **{f"param {k}": p for k, p in trainer.model.named_parameters()},
        **{f"ref {k}": p for k, p in trainer.ref_model.named_parameters()},
        **{f"adam {k}": v for st in trainer.optimizer.state.values() for k, v in st.items() if v.dim()},
        **{f"batch {k}": getattr(data.batch, k) for k in ("input_ids", "attention_mask", "response_mask")},
        **{f"step {k}": getattr(data, k) for k in ("adv", "behaviour", "mask", "old", "is_w", "ref")},
    }
    assert any(k.startswith("adam") for k in tensors)
    assert {str(t.device) for t in tensors.values()} == {"cpu"}
    # master weights and optimizer state are float32 whatever the model dtype
    assert {t.dtype for k, t in tensors.items() if k.startswith(("param", "adam"))} == {torch.float32}
    # auto = cuda exactly when the actor was given a GPU
    assert resolve_device("auto", 0) == "cpu" and resolve_device("cpu", 2) == "cpu"
    with pytest.raises(RuntimeError, match=r"trainer\.device resolves to cuda .* sees no CUDA device"):
        resolve_device("auto", 1)
    # the HF rollout worker resolves its own device from resources.rollout_gpus the same way
    assert str(build_rollout_worker(cfg).device) == "cpu"
    with pytest.raises(RuntimeError, match=r"rollout\.device resolves to cuda"):
        build_rollout_worker(make_cfg("resources.rollout_gpus=1"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto", 1, "rollout") == "cuda" and resolve_device("cuda", 1) == "cuda"
    with pytest.raises(ConfigError, match=r"set resources\.trainer_gpus >= 1"):
        make_cfg("trainer.device=cuda")
    with pytest.raises(ConfigError, match=r"set resources\.rollout_gpus >= 1"):
        make_cfg("rollout.device=cuda")


class AdamWReference:
    """AdamW written out from its definition (decoupled weight decay, bias-corrected moments: Loshchilov
    and Hutter; the algorithm torch documents), in float64, fed the gradients the trainer computed: the
    fp32 trajectory the master weights must follow whatever precision the forward pass runs in."""

    def __init__(self, params: list[torch.Tensor]):
        self.w = [p.detach().double().clone() for p in params]
        self.m = [torch.zeros_like(w) for w in self.w]
        self.v = [torch.zeros_like(w) for w in self.w]
        self.t = 0

    def step(self, grads: list[torch.Tensor], lr: float, betas: tuple[float, float], eps: float, wd: float):
        self.t += 1
        b1, b2 = betas
        for w, m, v, g in zip(self.w, self.m, self.v, grads, strict=True):
            w.mul_(1 - lr * wd)
            m.mul_(b1).add_((1 - b1) * g)
            v.mul_(b2).add_((1 - b2) * g * g)
            m_hat, v_hat = m / (1 - b1**self.t), v / (1 - b2**self.t)
            w.sub_(lr * m_hat / (v_hat.sqrt() + eps))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_master_weights_follow_the_fp32_adamw_trajectory_whatever_the_compute_precision(make_cfg, dtype):
    """At a learning rate far below bf16's resolution (1e-6; bf16 keeps 8 significant bits), the master
    weights after each step are the fp32 AdamW update of the gradients the trainer computed (bf16
    autocast or not), to fp32 rounding: the step is never rounded to bf16, and the weights that moved
    are not bf16-representable (rounded to bf16 every step, they would all be)."""
    cfg = make_cfg(*BASE, "trainer.lr=1e-6", f"model.dtype={dtype}")
    trainer = PolicyTrainer(cfg)
    assert trainer.precision == ("bf16" if dtype == "bfloat16" else "fp32")
    [group] = trainer.optimizer.param_groups
    params = list(group["params"])
    assert {p.dtype for p in params} == {torch.float32}  # master weights
    reference, start = AdamWReference(params), [p.detach().clone() for p in params]

    def before_step(optimizer, args, kwargs) -> None:  # the gradients the AdamW step is about to use
        grads = [p.grad.detach().double() for p in params]
        reference.step(grads, group["lr"], group["betas"], group["eps"], group["weight_decay"])

    handle = trainer.optimizer.register_step_pre_hook(before_step)
    batch = _scored_batch(make_cfg(*BASE))
    steps = 5
    for _ in range(steps):
        trainer.train_step(batch)
    handle.remove()
    assert reference.t == trainer.optimizer_steps >= steps
    moved = total = representable = 0
    for p, w0, want in zip(params, start, reference.w, strict=True):
        got = p.detach().double()
        # fp32 rounding of each step's result: a few units in the last place of |w| per step
        tolerance = reference.t * 2 * torch.finfo(torch.float32).eps * want.abs() + 1e-3 * cfg.trainer.lr
        assert ((got - want).abs() <= tolerance).all(), float((got - want).abs().max())
        changed = p.detach() != w0
        moved += int(changed.sum())
        total += changed.numel()
        representable += int((p.detach()[changed] == p.detach()[changed].bfloat16().float()).sum())
    assert moved > 0.5 * total  # (unused embedding rows never change)
    assert representable <= 0.01 * moved, (representable, moved)
    # The rollout keeps serving the model's dtype: the weight stream is cast to it.
    assert trainer.weight_stream().manifest.dtype == dtype


def test_gradient_checkpointing_is_honoured_and_changes_nothing_but_memory(make_cfg, monkeypatch):
    results = {}
    batch = _scored_batch(make_cfg(*BASE))
    for on in (False, True):
        trainer = PolicyTrainer(make_cfg(*BASE, f"model.gradient_checkpointing={str(on).lower()}"))
        mlp_cls = type(trainer.model.get_decoder().layers[0].mlp)
        calls: list[int] = []
        forward = mlp_cls.forward

        def counted(self, *a, _calls=calls, _forward=forward, **k):
            _calls.append(1)
            return _forward(self, *a, **k)

        # counted on the class: the recompute calls forward directly (module hooks stay outside it)
        monkeypatch.setattr(mlp_cls, "forward", counted)
        trainer.train_step(batch)
        monkeypatch.setattr(mlp_cls, "forward", forward)
        results[on] = (len(calls), _params(trainer))
    layers = len(trainer.model.get_decoder().layers)
    assert results[False][0] == layers  # one forward of each layer
    assert results[True][0] == 2 * layers  # every layer ran again in the backward pass
    for k, p in results[False][1].items():
        assert torch.allclose(p, results[True][1][k], atol=1e-6), k


def test_an_output_layer_that_cannot_be_chunked_takes_the_full_logits_path(make_cfg):
    cfg = make_cfg(*BASE, "data.task=add")
    trainer = PolicyTrainer(cfg)
    batch = trainer.pack_samples(_scored_batch(cfg))
    mb = select(batch, torch.arange(16), trainer.pad_id)
    assert trainer.policy._linear  # the chunked path first
    chunked = trainer._forward(trainer.policy, mb, with_entropy=True)
    trainer.policy._linear = False  # as for soft-capped logits (linear_head_of finds no plain head)
    full = trainer._forward(trainer.policy, mb, with_entropy=True)
    mask = batch.response_mask.bool()
    for a, b in zip(chunked, full, strict=True):
        assert (a - b)[mask].abs().max() <= 1e-5
