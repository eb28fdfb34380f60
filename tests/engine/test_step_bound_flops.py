"""benchmarks/step_bound.py's FLOP count against an independent count: torch's ``FlopCounterMode`` on the
tiny model's real forward and backward (the trainer's ``PolicyForward`` on a left-aligned micro-batch)
and on the HF rollout worker's real generation (prefill + KV-cached decode).

FlopCounterMode counts the FLOPs of the matmul ops it has formulas for (mm, addmm, bmm). It has none for
CPU's flash SDPA kernel, so the counted passes run SDPA's math backend (``sdpa_kernel(MATH)``: the same
values, attention as two bmm per layer, over the whole query x key rectangle). The benchmark counts the
trainer's attention as the causal triangle the flash kernel computes, so the test checks the trainer's
attention against the rectangle and then the benchmark's total with the triangle in its place;
generation attends under a padding mask over the whole rectangle in both. Tolerance: exact (integers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import step_bound
from harness.trainer_group import synthetic_samples
from rl_engine.backends import build_rollout_worker
from rl_engine.trainer import PolicyTrainer
from rl_engine.trainer.microbatch import select
from rl_engine.types import Prompt


def _addmm_inplace(self_shape, a_shape, b_shape, out_shape=None, **kwargs) -> int:
    """torch's registry has no formula for in-place ``addmm_`` (what the chunked output layer's backward
    accumulates its weight gradient with): the matmul's 2 m k n."""
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


@contextlib.contextmanager
def _counter() -> Iterator[FlopCounterMode]:
    mapping = {torch.ops.aten.addmm_: _addmm_inplace}
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False, custom_mapping=mapping) as c:
        yield c


def _split(counter: FlopCounterMode) -> tuple[int, int]:
    """(the linear maps' FLOPs: mm and addmm, the attention's: bmm) of everything the counter saw."""
    flops = {str(op): v for op, v in counter.get_flop_counts()["Global"].items()}
    assert set(flops) <= {"aten.mm", "aten.addmm", "aten.addmm_", "aten.bmm"}, flops
    attn = flops.get("aten.bmm", 0)
    return sum(flops.values()) - attn, attn


def test_trainer_forward_and_backward_flops_match_torchs_count(make_cfg):
    cfg = make_cfg("trainer.batch_size=8", "trainer.mini_batch_size=8")
    trainer = PolicyTrainer(cfg)
    shape = step_bound.Shape.of(trainer.model.config)
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    samples = synthetic_samples(8, 4, vocab, seed=1, prompt_len=(3, 11), response_len=(2, 9))
    mb = select(trainer.pack_samples(samples), torch.arange(8), trainer.pad_id)
    rows, width = mb.input_ids.shape
    lens = [[(len(s.prompt_ids), len(s.response_ids)) for s in samples]]
    assert width == max(p + r for p, r in lens[0])  # the layout the count assumes: right-padded rows

    with _counter() as fwd_count:
        logp, _ = trainer.policy(mb.input_ids, mb.position_ids, mb.rows, mb.cols, mb.targets, False, False)
    with _counter() as bwd_count:
        logp.sum().backward()

    work = step_bound.count_train(shape, lens)
    fwd_linear, fwd_attn = _split(fwd_count)
    bwd_linear, bwd_attn = _split(bwd_count)
    n_resp = sum(r for _, r in lens[0])
    # the linear maps and the output layer: exact
    assert fwd_linear == step_bound.forward_flops(shape, rows * width, 0, n_resp)
    assert bwd_linear == 2 * fwd_linear + 2 * shape.head_params * n_resp  # + the head's recomputed logits
    # the attention: torch counts the rectangle, the benchmark the causal triangle the kernel computes
    rect = rows * width * width
    assert fwd_attn == step_bound.forward_flops(shape, 0, rect, 0)
    assert bwd_attn == 2 * fwd_attn  # the math backend's backward: 4 bmm per layer
    # the benchmark's forward total is these pieces with the triangle in place of the rectangle
    triangle = rows * step_bound.causal_pairs(width)
    expected_fwd = fwd_linear + fwd_attn * triangle / rect
    assert work["train_forward"].total == pytest.approx(expected_fwd, rel=1e-12)
    assert work["train_backward"].total == pytest.approx(2 * expected_fwd + 2 * shape.head_params * n_resp)
    assert work["train_backward"].recompute == 2 * shape.head_params * n_resp
    # padding: what the rows' right padding costs, by the same formula on the real lengths
    real = step_bound.forward_flops(
        shape, sum(p + r for p, r in lens[0]), sum(step_bound.causal_pairs(p + r) for p, r in lens[0]), n_resp
    )
    assert work["train_forward"].real == pytest.approx(real)
    assert work["train_forward"].padding == pytest.approx(expected_fwd - real)
    assert work["train_forward"].padding > 0  # uneven lengths: some padding


def test_generation_flops_match_torchs_count(make_cfg):
    new = 5
    cfg = make_cfg(f"rollout.max_new_tokens={new}", "rollout.micro_batch_size=8")
    worker = build_rollout_worker(cfg)
    worker.min_new_tokens = new  # no early eos: every row decodes its whole budget
    lengths = [3, 7, 4, 9]
    prompts = [
        Prompt(uid=f"p{i}", token_ids=[5 + (3 * i + j) % 40 for j in range(n)], text="", answer="", index=i)
        for i, n in enumerate(lengths)
    ]
    with _counter() as count:
        samples = worker.generate(prompts, 1)
    assert [len(s.response_ids) for s in samples] == [new] * 4
    linear, attn = _split(count)
    shape = step_bound.Shape.of(worker.model.config)
    work = step_bound.count_generation(shape, lengths, [new] * 4)
    # exact: prefill over the padded prompts, then new - 1 cached steps
    assert linear + attn == work["prefill"].total + work["decode"].total
    # every response as long as the budget: the prompts' left padding is the only waste, in the prefill
    # and in each cached step's attention over the padded keys
    pad_tokens = 4 * max(lengths) - sum(lengths)
    assert work["prefill"].padding >= 2 * shape.body_params * pad_tokens
    assert work["decode"].padding == step_bound.forward_flops(shape, 0, (new - 1) * pad_tokens, 0)
    # rows that stop early keep decoding: the shorter ones' steps past their end are padding
    short = step_bound.count_generation(shape, lengths, [new, 2, new, 1])["decode"]
    assert short.total == work["decode"].total
    # rows 1 and 3 end after 2 and 1 tokens: their forwards at steps 2-4 and 1-4 (each attending over its
    # own prompt and steps) are padding too
    skipped = [(lengths[1], s) for s in (2, 3, 4)] + [(lengths[3], s) for s in (1, 2, 3, 4)]
    extra = step_bound.forward_flops(shape, len(skipped), sum(p + s for p, s in skipped), len(skipped))
    assert short.padding == work["decode"].padding + extra
