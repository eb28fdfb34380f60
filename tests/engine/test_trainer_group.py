"""The trainer group: 2 and 3 gloo processes end with the parameters one rank reaches on the same batches.

Real processes, a real process group and FSDP2 (``fully_shard``); the reference is the plain one-rank
``PolicyTrainer``. Each case has gradient clipping by the global norm active, token-budget micro-batches
(several per rank), and samples of very different lengths, so the token split across ranks is uneven.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from harness.trainer_group import TrainJob, spawn_group, synthetic_samples
from rl_engine.trainer import PolicyTrainer
from rl_engine.trainer.distributed import row_blocks, split_by_tokens

LR = 1e-3
STEPS = 3
# (loss aggregation, off-policy correction, KL coefficient, entropy coefficient): every aggregation mode,
# and the recomputed log-probs (tis / decoupled: old log-probs; KL: the reference model) split across ranks
CASES = [
    ("token_mean", "decoupled", 0.05, 0.0),
    ("seq_mean_token_mean", "tis", 0.0, 0.01),
    ("seq_mean_token_sum_norm", "none", 0.0, 0.0),
]


def _cfg(make_cfg, agg: str, off_policy: str, kl: float, ent: float):
    return make_cfg(
        "trainer.batch_size=12",
        "trainer.mini_batch_size=6",  # two optimizer steps per trainer step
        "trainer.max_tokens_per_micro_batch=48",  # several micro-batches per rank
        "trainer.grad_clip=0.001",  # the global norm is far above it: clipping is active
        f"trainer.lr={LR}",
        "trainer.precision=fp32",
        "rollout.n=3",
        "rollout.max_new_tokens=16",
        f"algorithm.loss_agg={agg}",
        f"algorithm.off_policy={off_policy}",
        f"algorithm.kl_coef={kl}",
        f"algorithm.entropy_coef={ent}",
    )


def _steps(vocab: int) -> list[list]:
    return [
        synthetic_samples(12, 3, vocab, seed=s, prompt_len=(2, 10), response_len=(1, 16))
        for s in range(STEPS)
    ]


@pytest.fixture(scope="module")
def jobs(request):
    make_cfg = request.getfixturevalue("make_cfg")
    out = []
    for case in CASES:
        cfg = _cfg(make_cfg, *case)
        vocab = PolicyTrainer(cfg).model.get_output_embeddings().weight.shape[0]
        out.append(TrainJob(cfg, _steps(vocab)))
    return out


@pytest.fixture(scope="module")
def single(jobs):
    """The one-rank reference: the plain trainer in this process."""
    results = []
    for job in jobs:
        trainer = PolicyTrainer(job.cfg)
        metrics = [trainer.train_step(s) for s in job.steps]
        results.append({"metrics": metrics, "weights": trainer.weights_numpy()})
    return results


@pytest.fixture(scope="module")
def make_cfg(tiny_model_dir):  # module scope for the module-scoped fixtures above
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    def make(*overrides: str):
        data = get_preset("demo-cpu")
        data["model"].pop("tiny")
        return parse_config(apply_overrides(data, [f"model.path={tiny_model_dir}", *overrides]))

    return make


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.extended)])  # 3: an uneven split
def test_group_reaches_the_single_rank_parameters(world, jobs, single):
    group = spawn_group(world, "harness.trainer_group:train_on", jobs, timeout_s=900)
    for case, ref, got in zip(CASES, single, group[0], strict=True):
        ref_w, got_w = ref["weights"], got["weights"]
        assert ref_w.keys() == got_w.keys()
        start = PolicyTrainer(jobs[0].cfg).weights_numpy()
        moved = max(float(np.abs(ref_w[k] - start[k]).max()) for k in ref_w)
        assert moved > LR  # the parameters did move, by several learning-rate steps
        diff = max(float(np.abs(ref_w[k] - got_w[k]).max()) for k in ref_w)
        # summation order differs (shares, reduce-scatter); Adam turns that into at most 1% of an LR step
        assert diff <= 1e-2 * LR, (case, world, diff / LR)
        for a, b in zip(ref["metrics"], got["metrics"], strict=True):
            # the clip was active and the global norm is the same one
            assert a["actor/grad_norm"] > 0.001
            assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4)
            assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"], rel=1e-4, abs=1e-6)
            assert b["actor/entropy"] == pytest.approx(a["actor/entropy"], rel=1e-4)
    for other in group[1:]:  # every rank reports the same (all-reduced) metrics
        for a, b in zip(group[0], other, strict=True):
            for ma, mb in zip(a["metrics"], b["metrics"], strict=True):
                assert {k: v for k, v in ma.items() if not k.startswith("timing/")} == {
                    k: v for k, v in mb.items() if not k.startswith("timing/")
                }


def test_token_split_balances_tokens_and_keeps_every_row_once():
    costs = [50, 3, 3, 3, 40, 7, 7, 1]
    for world in (1, 2, 3):
        shares = split_by_tokens(costs, world)
        assert sorted(i for s in shares for i in s) == list(range(len(costs)))
        assert all(s == sorted(s) for s in shares)
        loads = [sum(costs[i] for i in s) for s in shares]
        assert max(loads) - min(loads) <= max(costs)  # greedy longest-first bound
    assert split_by_tokens([5], 3) == [[0], [], []]  # fewer rows than ranks: some ranks idle


def test_row_blocks_are_the_rows_torch_chunk_gives_each_rank():
    """The row layout the weight stream broadcasts from is dim-0 sharding's: ``torch.chunk`` of the rows."""
    import torch

    for rows in range(0, 23):
        for world in range(1, 6):
            chunks = torch.arange(rows).chunk(world) if rows else ()
            want = [chunks[r].tolist() if r < len(chunks) else [] for r in range(world)]
            assert [list(range(lo, hi)) for lo, hi in row_blocks(rows, world)] == want, (rows, world)


@pytest.mark.slow
def test_sharded_checkpoint_resumes_on_three_ranks_and_on_one_and_exports(jobs, single, tmp_path):
    """2 ranks train 2 steps, write a sharded checkpoint, train a third; resuming that checkpoint on 3
    ranks and on 1 rank and training the third step gives the same parameters; the export loads."""
    from transformers import AutoModelForCausalLM

    from rl_engine.export import export_checkpoint

    job, path = jobs[0], str(tmp_path / "step_00000002")
    saved = spawn_group(2, "tests.engine.group_jobs:train_save_train", (job, path, 2), timeout_s=900)[0]
    assert sorted(p.name for p in (tmp_path / "step_00000002").iterdir()) == [
        "dcp", "extra.pt", "model", "rng.pt", "scheduler.pt", "trainer_state.json",
    ]  # fmt: skip
    three = spawn_group(3, "tests.engine.group_jobs:resume_train", (job, path, 2), timeout_s=900)[0]
    one = PolicyTrainer(job.cfg)
    extra = one.load_checkpoint(tmp_path / "step_00000002")
    one.train_step(job.steps[2])
    assert three["resumed_at"] == 2 and extra == three["extra"] == {"data_cursor": 7, "queued": ["a", "b"]}
    ref = single[0]["weights"]  # one rank, three steps, never interrupted
    for got in (saved["final"], three["final"], one.weights_numpy()):
        assert max(float(np.abs(ref[k] - got[k]).max()) for k in ref) <= 1e-2 * LR
    out = export_checkpoint(path, tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(out.out)
    exported = {k: v.detach().numpy() for k, v in model.named_parameters()}
    assert exported.keys() == saved["at_save"].keys()
    for k, v in exported.items():
        np.testing.assert_array_equal(v, saved["at_save"][k])


@pytest.mark.slow
def test_a_stop_on_the_leader_abandons_the_step_on_every_rank_at_the_same_micro_batch(jobs, single):
    """The stop question is a max over the group: rank 0 alone asks to stop, both ranks leave the step
    (neither waits in a collective the other never enters) with nothing applied, and the step trained
    whole afterwards equals one rank's first step."""
    job = jobs[0]
    ranks = spawn_group(2, "tests.engine.group_jobs:abandon_then_train", (job, 2), timeout_s=900)
    assert [r["aborted"] for r in ranks] == [True, True]
    assert [r["version_after_abort"] for r in ranks] == [0, 0]
    reference = PolicyTrainer(job.cfg)
    reference.train_step(job.steps[0])
    ref = reference.weights_numpy()
    got = ranks[0]["weights"]
    assert max(float(np.abs(ref[k] - got[k]).max()) for k in ref) <= 1e-2 * LR


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "hang"])
def test_a_rank_that_dies_or_hangs_fails_the_step_naming_it(jobs, how):
    """Rank 1 exits (or sleeps) instead of training: the step fails with an error naming the dead rank,
    or, for the hang, rank 0's collective times out naming rank 0 and the operation it waited in."""
    with pytest.raises(RuntimeError) as err:
        spawn_group(2, "tests.engine.group_jobs:stall_rank", (jobs[2], 1, how), timeout_s=15)
    if how == "exit":
        assert "trainer rank 1 died" in str(err.value)
    else:
        # the step's first collective: the stop question every rank answers before each micro-batch
        assert "trainer rank 0/2: collective 'stop check'" in str(err.value)


@pytest.mark.slow
def test_weight_stream_from_shards_equals_the_whole_models_stream_one_parameter_at_a_time(jobs):
    """Two ranks stream their weights (buckets of 4 KiB in the rollout dtype): rank 0's buckets are byte for byte the
    buckets of the same weights held whole, and beyond its shards and the bucket it never held more than one
    bucket's bytes, although the embedding is many times that (it is broadcast by rows, never gathered whole)."""
    import torch

    from rl_engine.weights.buckets import LocalWeightStream

    job = jobs[2]
    got = spawn_group(2, "tests.engine.group_jobs:stream_weights", (job, 4096), timeout_s=900)[0]
    whole = {k: torch.from_numpy(v) for k, v in got["weights"].items()}
    want = LocalWeightStream.of(whole.items(), got["manifest"].torch_dtype, 4096)
    assert got["manifest"] == want.manifest and len(got["manifest"].buckets) > 10
    expected = [b.to_bytes().copy() for b in want]
    assert len(got["buckets"]) == len(expected)
    for a, b in zip(got["buckets"], expected, strict=True):
        np.testing.assert_array_equal(a, b)
    largest = max(v.numel() * 4 for v in whole.values())
    assert largest >= 8 * 4096  # gathering it whole would break the bound below
    assert 0 < got["held"] <= 4096 and 0 < got["bucket_max"] <= 4096


def test_world_size_comes_from_the_gpus_on_gpu_and_a_mismatch_is_refused(make_cfg):
    from rl_engine.config import ConfigError

    cfg = make_cfg("trainer.world_size=3")
    assert cfg.resources.trainer_world_size(cfg.trainer.world_size) == 3
    gpu = make_cfg("resources.trainer_gpus=2", "resources.rollout_gpus=1")
    assert gpu.resources.trainer_world_size(gpu.trainer.world_size) == 2
    with pytest.raises(ConfigError, match=re.escape("trainer.world_size (3) and resources.trainer_gpus (2)")):
        make_cfg("trainer.world_size=3", "resources.trainer_gpus=2")
