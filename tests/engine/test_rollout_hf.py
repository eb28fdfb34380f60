"""HF rollout worker: sampling contract, behaviour log-probs vs the trainer, interrupt/resume, weights."""

from __future__ import annotations

import threading

import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.data import PromptStream
from rl_engine.rollout.sampling import DecodeSampler
from rl_engine.trainer import PolicyTrainer

# Rollout (incremental KV-cache decode, its own padding) and trainer (one full forward, batch padding)
# run the same float32 maths in a different order: differences stay at float rounding level.
LOGPROB_ATOL = 1e-4


def _worker_and_prompts(make_cfg, *overrides: str, k: int = 4):
    cfg = make_cfg(*overrides)
    worker = build_rollout_worker(cfg)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(k)
    return cfg, worker, prompts


def test_generate_returns_grouped_samples_with_versions_and_finish_reasons(make_cfg):
    _, worker, prompts = _worker_and_prompts(
        make_cfg, "rollout.max_new_tokens=6", "rollout.micro_batch_size=5"
    )
    samples = worker.generate(prompts, 3)
    assert len(samples) == 12
    assert [s.group_id for s in samples] == [p.uid for p in prompts for _ in range(3)]
    eos = set(worker.special.eos_ids)
    for s in samples:
        assert 1 <= len(s.response_ids) <= 6
        assert len(s.logprobs) == len(s.response_ids)
        assert all(lp <= 0.0 for lp in s.logprobs)
        assert (s.finish_reason == "stop") == (s.response_ids[-1] in eos)
        assert s.finish_reason in ("stop", "length")
        if s.finish_reason == "length":
            assert len(s.response_ids) == 6
        assert eos.isdisjoint(s.response_ids[:-1])  # generation stopped at the first eos
        assert s.param_version_start == s.param_version_end == 0
        assert s.answer and s.prompt_text
        assert s.response_text == worker.tokenizer.decode(s.response_ids, skip_special_tokens=True)


def test_same_seed_same_samples(make_cfg):
    a = _worker_and_prompts(make_cfg)
    b = _worker_and_prompts(make_cfg)
    assert [s.response_ids for s in a[1].generate(a[2], 2)] == [
        s.response_ids for s in b[1].generate(b[2], 2)
    ]


def test_a_restored_sampler_state_draws_what_the_saved_run_drew_next(make_cfg):
    """The checkpoint's part of the worker: its sampling state saved after some draws and loaded into
    a fresh worker (another process's, seeded alike) makes it draw exactly what the saved worker draws
    next: the same tokens and log-probs, also for a resumed (interrupted) response."""
    cfg, worker, prompts = _worker_and_prompts(make_cfg, "rollout.max_new_tokens=6")
    worker.generate(prompts[:2], 2)  # some draws before the checkpoint
    state = worker.sampler_state()
    assert isinstance(state, bytes) and state
    then = worker.generate(prompts[2:], 2)
    fresh = build_rollout_worker(cfg)
    assert [s.response_ids for s in fresh.generate(prompts[2:], 2)] != [s.response_ids for s in then]
    fresh = build_rollout_worker(cfg)
    fresh.load_sampler_state(state)
    again = fresh.generate(prompts[2:], 2)
    assert [(s.response_ids, s.logprobs) for s in again] == [(s.response_ids, s.logprobs) for s in then]
    assert worker.sampler_state() == fresh.sampler_state()  # and both go on alike


@pytest.mark.smoke
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_match_trainer_recomputation(make_cfg, temperature):
    cfg, worker, prompts = _worker_and_prompts(
        make_cfg, f"rollout.temperature={temperature}", "rollout.max_new_tokens=8", "data.task=add", k=6
    )
    samples = worker.generate(prompts, 4)
    assert len({len(s.prompt_ids) for s in samples}) > 1  # prompts of several lengths: padding matters
    trainer = PolicyTrainer(cfg)
    recomputed = trainer.compute_logprobs(samples)
    diffs = [
        abs(a - b)
        for s, r in zip(samples, recomputed, strict=True)
        for a, b in zip(s.logprobs, r, strict=True)
    ]
    assert max(diffs) < LOGPROB_ATOL


def _interrupt_after_forwards(worker, n: int) -> None:
    """Call ``worker.interrupt()`` from inside the n-th model forward, as another thread would mid-decode.
    (Hooked on the model's body: every decode forward runs it; the output layer may be applied outside
    the model's own forward, see ``HFRolloutWorker._forward``.)"""
    calls = {"n": 0}

    def hook(*_):
        calls["n"] += 1
        if calls["n"] == n:
            worker.interrupt()

    worker.model.get_decoder().register_forward_hook(hook)


def test_interrupt_then_resume_continues_the_prefix(make_cfg):
    cfg, worker, prompts = _worker_and_prompts(
        make_cfg, "rollout.max_new_tokens=10", "rollout.chunk_tokens=3", "rollout.micro_batch_size=4"
    )
    _interrupt_after_forwards(worker, 2)  # prefill + first decode step of the first micro-batch
    partial = worker.generate(prompts[:2], 4)
    # The first micro-batch stops at its first chunk boundary (3 tokens) unless a response already
    # ended; the second micro-batch never starts.
    for s in partial[:4]:
        assert (s.finish_reason, len(s.response_ids)) == ("abort", 3) or (
            s.finish_reason == "stop" and len(s.response_ids) <= 3
        )
    assert [(s.finish_reason, len(s.response_ids)) for s in partial[4:]] == [("abort", 0)] * 4
    assert sum(s.finish_reason == "abort" for s in partial[:4]) >= 2  # eos has p ~ 1/54 per token
    worker.clear_interrupt()
    trainer = PolicyTrainer(cfg)
    trainer.model.load_state_dict(worker.model.state_dict())
    worker.update_weights(trainer.weights_numpy(), 1)
    done = worker.resume(partial)
    for before, after in zip(partial, done, strict=True):
        if before.finish_reason != "abort":
            assert after is before
            continue
        assert after.response_ids[: len(before.response_ids)] == before.response_ids
        assert after.logprobs[: len(before.logprobs)] == before.logprobs
        assert after.finish_reason in ("stop", "length")
        assert len(after.response_ids) <= 10
        assert (after.param_version_start, after.param_version_end) == (0, 1)
        assert after.num_interruptions == 1
    recomputed = trainer.compute_logprobs(done)
    for s, r in zip(done, recomputed, strict=True):
        assert max(abs(a - b) for a, b in zip(s.logprobs, r, strict=True)) < LOGPROB_ATOL
    assert worker.resume(done) == done  # finished samples pass through unchanged


# Most of the vocabulary ends a response: without min_new_tokens nearly every token is an eos.
MANY_EOS = "model.generation_config={eos_token_id: [" + ", ".join(map(str, range(2, 42))) + "]}"


def test_min_new_tokens_decodes_exactly_the_budget(make_cfg):
    _, worker, prompts = _worker_and_prompts(make_cfg, MANY_EOS, "rollout.max_new_tokens=12")
    eos = set(worker.special.eos_ids)
    free = worker.generate(prompts, 4)
    assert max(len(s.response_ids) for s in free) < 12  # the control: eos ends responses early
    worker.min_new_tokens = 12
    fixed = worker.generate(prompts, 4)
    assert [(len(s.response_ids), s.finish_reason) for s in fixed] == [(12, "length")] * 16
    assert all(eos.isdisjoint(s.response_ids) for s in fixed)


def test_min_new_tokens_holds_across_an_interrupt_with_masked_logprobs(make_cfg):
    """The floor counts the whole response (resume continues it), and the behaviour log-probs are of
    the eos-masked distribution exactly where the mask applied: above the trainer's there, equal after."""
    cfg, worker, prompts = _worker_and_prompts(
        make_cfg,
        MANY_EOS,
        "rollout.max_new_tokens=20",
        "rollout.chunk_tokens=3",
        "rollout.micro_batch_size=16",
    )
    worker.min_new_tokens = floor = 8
    _interrupt_after_forwards(worker, 2)  # the first chunk boundary: 3 tokens
    partial = worker.generate(prompts, 4)
    assert [(s.finish_reason, len(s.response_ids)) for s in partial] == [("abort", 3)] * 16
    worker.clear_interrupt()
    done = worker.resume(partial)
    eos = set(worker.special.eos_ids)
    for s in done:
        assert eos.isdisjoint(s.response_ids[:floor])
        assert s.finish_reason == "stop" or len(s.response_ids) == 20
    # eos has p ~ 3/4 per token once allowed: most responses end within a few tokens of the floor (a
    # floor counted again from the resume, 3 + 8, would allow no response shorter than 12)
    assert sum(len(s.response_ids) < 12 for s in done) >= 8
    recomputed = PolicyTrainer(cfg).compute_logprobs(done)
    for s, r in zip(done, recomputed, strict=True):
        assert all(a - b > 0.1 for a, b in zip(s.logprobs[:floor], r[:floor], strict=True))
        assert all(abs(a - b) < LOGPROB_ATOL for a, b in zip(s.logprobs[floor:], r[floor:], strict=True))


def test_update_weights_changes_the_policy_and_rejects_bad_names(make_cfg):
    cfg, worker, prompts = _worker_and_prompts(make_cfg)
    trainer = PolicyTrainer(cfg)
    before = trainer.compute_logprobs(worker.generate(prompts, 1))
    weights = {k: v * 1.5 for k, v in trainer.weights_numpy().items()}
    worker.update_weights(weights, version=7)
    assert worker.version == 7
    for name, p in worker.model.named_parameters():
        assert torch.equal(p.detach(), torch.from_numpy(weights[name]))
    new_samples = worker.generate(prompts, 1)
    assert new_samples[0].param_version_start == 7
    assert before  # sanity: the trainer could score the old samples
    with pytest.raises(KeyError, match="unknown parameter names"):
        worker.update_weights({"nope.weight": weights["model.norm.weight"]}, 8)
    bad = {k: v * 2.0 for k, v in weights.items()}  # differs from the loaded weights everywhere...
    bad["model.norm.weight"] = weights["model.norm.weight"][:3]  # ...and one tensor has a wrong shape
    before_bad = [p.detach().clone() for p in worker.model.parameters()]
    with pytest.raises(ValueError, match="has shape"):
        worker.update_weights(bad, 8)
    # A rejected update changes nothing, not even the tensors listed before the bad one.
    assert all(torch.equal(a, b) for a, b in zip(before_bad, worker.model.parameters(), strict=True))
    assert worker.version == 7


def _plain_step(logits: torch.Tensor, temperature: float, top_p: float, g: torch.Generator):
    """The decode loop's sampling written plainly (the allocating version the sampler replaced):
    log-softmax of logits / T, exp, the nucleus by sort + cumsum, ``torch.multinomial``."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    tok = torch.multinomial(probs, 1, generator=g).squeeze(-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


class _PlainSampler:
    def __init__(self, top_p: float) -> None:
        self.top_p = top_p

    def step(self, logits, temperature, generator):
        return _plain_step(logits, temperature, self.top_p, generator)


def test_top_p_keeps_only_the_nucleus():
    logits = torch.tensor([[3.0, 2.0, 0.0, -1.0]] * 200)
    g = torch.Generator().manual_seed(0)

    def draws(top_p: float) -> set[int]:
        return set(DecodeSampler(200, 4, torch.device("cpu"), top_p).step(logits, 1.0, g)[0].tolist())

    # p = .66, .24, .03, .01: top_p=0.5 leaves only the first token; 0.8 the first two.
    assert draws(0.5) == {0}
    assert draws(0.8) == {0, 1}
    assert len(draws(1.0)) > 2


@pytest.mark.parametrize("top_p", [1.0, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampler_in_place_draws_exactly_what_the_plain_loop_draws(top_p, dtype):
    rows, vocab, temperature = 5, 3000, 0.7
    sampler = DecodeSampler(rows, vocab, torch.device("cpu"), top_p)
    g_new, g_ref = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    data = torch.Generator().manual_seed(4)
    for _ in range(20):  # the buffers are reused across steps: each step must start from scratch
        logits = (torch.randn(rows, vocab, generator=data) * 4).to(dtype)
        tok, lp = sampler.step(logits, temperature, g_new)
        ref_tok, ref_lp = _plain_step(logits, temperature, top_p, g_ref)
        assert torch.equal(tok, ref_tok) and torch.equal(lp, ref_lp)
    assert torch.equal(g_new.get_state(), g_ref.get_state())  # the same generator calls, too


def test_sampler_step_allocates_no_vocabulary_sized_tensor():
    from torch.profiler import ProfilerActivity, profile

    rows, vocab = 4, 50_000
    sampler = DecodeSampler(rows, vocab, torch.device("cpu"), 1.0)
    g, logits = torch.Generator().manual_seed(0), torch.randn(rows, vocab)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(3):
            sampler.step(logits, 0.8, g)
    big = [(e.name, e.cpu_memory_usage) for e in prof.events() if e.cpu_memory_usage >= rows * vocab]
    assert not big, big
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _plain_step(logits, 0.8, 1.0, g)  # the check sees the allocations of the plain version
    assert [e for e in prof.events() if e.cpu_memory_usage >= rows * vocab]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_generate_samples_and_logprobs_match_the_plain_sampling_loop(make_cfg, dtype):
    """The whole worker, one seed: the output layer into the sampler's buffer and the in-place sampler
    against the model's own forward and the plain sampling, same tokens and log-probs, bit for bit
    (bfloat16: the logits buffer is a bfloat16 one, cast into the float32 work buffer as before)."""
    overrides = ("rollout.max_new_tokens=12", "rollout.temperature=0.8", "rollout.top_p=0.95")
    cfg, worker, prompts = _worker_and_prompts(
        make_cfg, *overrides, "rollout.micro_batch_size=3", f"model.dtype={dtype}"
    )
    assert worker.model.dtype == getattr(torch, dtype) and worker._body is not None
    ref = build_rollout_worker(cfg)  # the same seed, weights and micro-batches
    ref._body = None  # the model's own forward makes the logits
    ref._sampler_for = lambda rows, vocab: _PlainSampler(cfg.rollout.top_p)
    got, want = worker.generate(prompts, 2), ref.generate(prompts, 2)
    assert [s.response_ids for s in got] == [s.response_ids for s in want]
    assert [s.logprobs for s in got] == [s.logprobs for s in want]
    assert len({tuple(s.response_ids) for s in got}) > 1  # really sampled


def _reference_decode(worker, prompts, n: int, temperature: float, top_p: float, state: torch.Tensor):
    """The decode loop written from its definitions, independently of the worker's code: each row on its
    own (no padding), a full forward of prompt + tokens so far (no KV cache) through the model's own
    output layer, the log-softmax of logits / T in float64, the nucleus cut in float64, and the draw as
    ``torch.multinomial`` makes it, ``argmax(p / q)`` with ``q ~ Exp(1)``: one [rows, V] float32 draw
    per step from the generator, for every row, finished or not, until all rows are finished."""
    g = torch.Generator().set_state(state)
    eos = set(worker.special.eos_ids)
    rows = [list(p.token_ids) for p in prompts for _ in range(n)]
    new: list[list[int]] = [[] for _ in rows]
    lps: list[list[float]] = [[] for _ in rows]
    done = [False] * len(rows)
    vocab = worker.model.config.vocab_size
    for _ in range(worker.cfg.max_new_tokens):
        q = torch.empty(len(rows), vocab).exponential_(1.0, generator=g).double()
        for i, ids in enumerate(rows):
            if done[i]:
                continue
            with torch.no_grad():
                logits = worker.model(input_ids=torch.tensor([ids + new[i]]), use_cache=False).logits[0, -1]
            logp = torch.log_softmax(logits.double() / temperature, dim=-1)
            p = logp.exp()
            if top_p < 1.0:
                srt, order = p.sort(descending=True)
                p = torch.zeros_like(p).scatter(0, order, srt.masked_fill(srt.cumsum(0) - srt >= top_p, 0.0))
            tok = int((p / q[i]).argmax())
            new[i].append(tok)
            lps[i].append(float(logp[tok]))
            done[i] = tok in eos or len(new[i]) == worker.cfg.max_new_tokens
        if all(done):
            break
    return new, lps


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_generate_draws_what_an_independent_reference_draws(make_cfg, top_p):
    """Same seed, same tokens and log-probs as the reference decode above (float64, no cache, no
    padding): the in-place sampler, the output layer applied into its buffer and the generator calls
    change nothing of what is sampled."""
    overrides = ("rollout.max_new_tokens=10", "rollout.temperature=0.7", f"rollout.top_p={top_p}")
    _, worker, prompts = _worker_and_prompts(make_cfg, *overrides, "data.task=add", k=3)
    assert worker._body is not None  # the tiny model's plain output layer: applied by the worker
    state = worker.generator.get_state()
    got = worker.generate(prompts, 3)  # one micro-batch of 9 rows, prompts of several lengths
    assert len({len(p.token_ids) for p in prompts}) > 1
    ids, lps = _reference_decode(worker, prompts, 3, 0.7, top_p, state)
    assert [s.response_ids for s in got] == ids
    assert len({tuple(r) for r in ids}) > 1  # really sampled
    for s, ref in zip(got, lps, strict=True):
        assert max(abs(a - b) for a, b in zip(s.logprobs, ref, strict=True)) < LOGPROB_ATOL


def test_an_output_layer_with_a_bias_is_applied_as_the_model_applies_it(make_cfg):
    """A plain output layer with a bias (``addmm`` into the logits buffer) gives bit for bit the tokens
    and log-probs of the model's own forward."""
    cfg, worker, prompts = _worker_and_prompts(make_cfg, "rollout.max_new_tokens=8", "rollout.top_p=0.95")
    ref = build_rollout_worker(cfg)
    bias = torch.randn(worker.model.config.vocab_size, generator=torch.Generator().manual_seed(5))
    for w in (worker, ref):
        weight = w.model.get_output_embeddings().weight
        head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=True)
        with torch.no_grad():
            head.weight.copy_(weight)
            head.bias.copy_(bias)
        w.model.set_output_embeddings(head)
        w._head = head
    ref._body = None  # the model's own forward makes the logits
    assert worker._body is not None and worker._head.bias is not None
    got, want = worker.generate(prompts, 2), ref.generate(prompts, 2)
    assert [s.response_ids for s in got] == [s.response_ids for s in want]
    assert [s.logprobs for s in got] == [s.logprobs for s in want]


def test_generation_builds_no_autograd_graph(make_cfg):
    _, worker, prompts = _worker_and_prompts(make_cfg)
    grad_modes: list[bool] = []
    worker.model.get_decoder().register_forward_hook(lambda *_: grad_modes.append(torch.is_grad_enabled()))
    samples = worker.generate(prompts, 2)
    worker.resume([s for s in samples if s.finish_reason == "abort"])
    assert grad_modes and not any(grad_modes)


def test_weights_updated_from_another_thread_apply_between_micro_batches(make_cfg):
    cfg, worker, prompts = _worker_and_prompts(
        make_cfg, "rollout.micro_batch_size=4", "rollout.max_new_tokens=6", k=4
    )
    new_weights = {k: v * 1.01 for k, v in PolicyTrainer(cfg).weights_numpy().items()}
    started = threading.Event()
    worker.model.get_decoder().register_forward_hook(lambda *_: started.set())
    result: list = []
    gen = threading.Thread(target=lambda: result.extend(worker.generate(prompts, 4)))
    gen.start()
    started.wait(30)
    worker.update_weights(new_weights, 1)  # waits for the running micro-batch, never tears it
    gen.join(60)
    versions = [(s.param_version_start, s.param_version_end) for s in result]
    assert len(versions) == 16 and all(a == b for a, b in versions)
    per_batch = [versions[i][0] for i in range(0, 16, 4)]
    assert per_batch[0] == 0 and per_batch == sorted(per_batch)
    assert all(versions[i] == versions[i - i % 4] for i in range(16))  # one version per micro-batch
    assert worker.version == 1
