"""``model.lora``: LoRA adapters through peft for real (no hand-written LoRA) on the tiny model.

What is checked: the config's bounds at their field paths; only the adapters are in AdamW and receive
gradients, the frozen weights keep their bytes; the KL reference with the adapters disabled is a fresh
base model; an adapter-only sync makes the HF worker's log-probs the trainer's; a checkpoint resumes
bit-identically; the export loads in peft and in transformers with the trainer's greedy answers.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from harness.trainer_group import synthetic_samples
from rl_engine.backends import build_rollout_worker
from rl_engine.backends.registry import BACKENDS
from rl_engine.config import ConfigError, LoraConfig, parse_config
from rl_engine.config.lora import LORA_BACKENDS, sync_mode, unknown_targets
from rl_engine.trainer import PolicyTrainer
from tests.engine.test_trainer import _scored_batch

LORA = "model.lora={rank: 4, alpha: 8}"
TRAIN = ("trainer.batch_size=16", "trainer.mini_batch_size=8", "rollout.max_new_tokens=6", "trainer.lr=0.02")


def _lora_cfg(make_cfg, *more: str):
    return make_cfg(LORA, *TRAIN, *more)


def _trained(cfg, steps: int = 2) -> PolicyTrainer:
    trainer = PolicyTrainer(cfg)
    for _ in range(steps):
        trainer.train_step(_scored_batch(cfg))
    return trainer


# --- config ---------------------------------------------------------------------------------------------


def test_defaults_and_bad_values_name_their_field(make_cfg):
    lora = LoraConfig()
    assert (lora.rank, lora.alpha, lora.dropout, lora.target_modules) == (16, 32.0, 0.0, "all-linear")
    cases = {
        "model.lora.rank": "model.lora={rank: 0}",
        "model.lora.dropout": "model.lora={dropout: 1.0}",
        "model.lora.target_modules": "model.lora={target_modules: []}",
    }
    for path, override in cases.items():
        with pytest.raises(ConfigError) as err:
            make_cfg(override)
        assert [p for p, _ in err.value.errors] == [path], err.value.errors
    with pytest.raises(ConfigError) as err:
        make_cfg("model.lora={target_modules: ['q_proj; rm -rf']}")
    assert err.value.errors[0][0] == "model.lora.target_modules"
    # a backend that does not apply adapters gets the merged weights; asking it to apply them is refused
    vllm = {"model": {"path": "m", "lora": {}}, "rollout": {"backend": "vllm", "device": "cpu"}}
    assert sync_mode(parse_config(vllm).model.lora, "vllm") == "merged"
    with pytest.raises(ConfigError) as err:
        parse_config({**vllm, "model": {"path": "m", "lora": {"sync": "adapters"}}})
    assert [p for p, _ in err.value.errors] == ["model.lora.sync"] and "rollout.backend" in str(err.value)
    with pytest.raises(ConfigError) as err:
        make_cfg("model.lora={sync: merged}", "trainer.world_size=2")
    assert [p for p, _ in err.value.errors] == ["model.lora.sync"] and "one trainer rank" in str(err.value)


def test_the_configs_lora_backends_are_the_registrys():
    assert set(LORA_BACKENDS) == {name for name, b in BACKENDS.items() if b.adapters}


def test_a_model_folders_module_names_come_from_its_safetensors_headers_without_torch(tiny_model_dir):
    from rl_engine.catalogue import module_names

    names = module_names(tiny_model_dir)
    assert "model.layers.1.mlp.down_proj" in names and "model.embed_tokens" in names
    assert unknown_targets(LoraConfig(target_modules=["q_proj", "mlp.up_proj", "w_pack"]), names) == [
        "w_pack"
    ]
    assert module_names(tiny_model_dir.parent) is None  # no safetensors file there


def test_validate_checks_the_target_modules_against_the_model_folder(tiny_model_dir, capsys):
    from rl_engine.cli import main

    args = ["validate", "--config", "preset:demo-cpu", "--set", f"model.path={tiny_model_dir}", "--set"]
    assert main([*args, "model.lora={target_modules: [q_proj, wq]}"]) == 1
    assert capsys.readouterr().out.startswith(
        "model.lora.target_modules: the model has no module 'wq'; its modules:"
    )
    assert main([*args, "model.lora={target_modules: [q_proj, v_proj]}"]) == 0


def test_target_modules_the_model_does_not_have_are_a_field_error(make_cfg):
    assert unknown_targets(LoraConfig(target_modules=["q_proj", "nope"]), ["a.q_proj", "b.k_proj"]) == [
        "nope"
    ]
    assert unknown_targets(LoraConfig(), []) == []  # all-linear: whatever the model has
    for targets, says in (("[nope_proj]", "no module 'nope_proj'"), ("[lm_head]", "output layer")):
        cfg = make_cfg(f"model.lora={{target_modules: {targets}}}")
        with pytest.raises(ConfigError) as err:
            PolicyTrainer(cfg)
        assert err.value.errors[0][0] == "model.lora.target_modules" and says in err.value.errors[0][1]
    PolicyTrainer(make_cfg("model.lora={target_modules: [q_proj, v_proj]}"))  # names it has: fine


# --- trainer --------------------------------------------------------------------------------------------


def test_only_adapters_are_trained_and_the_frozen_weights_keep_their_bytes(make_cfg):
    cfg = _lora_cfg(make_cfg, "model.gradient_checkpointing=true")
    trainer = PolicyTrainer(cfg)
    named = dict(trainer.model.named_parameters())
    adapters = {n for n, p in named.items() if "lora_" in n}
    # all-linear on the tiny Llama: q, k, v, o, gate, up, down of 2 layers, an A and a B each
    assert len(adapters) == 2 * 7 * 2
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(named[n]) for n in adapters}
    frozen = {n: p.detach().clone() for n, p in named.items() if n not in adapters}
    before = {n: named[n].detach().clone() for n in adapters}
    samples = _scored_batch(cfg)
    trainer.optimizer.zero_grad(set_to_none=False)  # a frozen weight would get a gradient tensor here
    metrics = trainer.train_step(samples)
    assert metrics["actor/grad_norm"] > 0
    for n, p in named.items():
        if n in adapters:
            assert not torch.equal(p, before[n]) or "lora_A" in n, n  # every B moved (A: where B was 0)
        else:
            assert p.grad is None, n
            assert p.detach().numpy().tobytes() == frozen[n].numpy().tobytes(), n
    assert sum(not torch.equal(named[n], before[n]) for n in adapters) >= len(adapters) // 2
    assert trainer.state_bytes() < sum(p.numel() * 4 for p in named.values()) * 1.5  # not 3x the model


def test_the_kl_reference_is_the_base_model_with_the_adapters_disabled(make_cfg):
    cfg = _lora_cfg(make_cfg, "algorithm.kl_coef=0.1")
    trainer = _trained(cfg, 2)
    assert trainer.ref_model is None  # no second copy of the weights
    samples = _scored_batch(cfg)
    with trainer.model.disable_adapter():
        disabled = trainer.compute_logprobs(samples)
    base = PolicyTrainer(make_cfg(*TRAIN)).compute_logprobs(samples)  # a freshly loaded base model
    diff = max(abs(a - b) for x, y in zip(disabled, base, strict=True) for a, b in zip(x, y, strict=True))
    assert diff <= 1e-6, diff
    policy = trainer.compute_logprobs(samples)
    moved = max(abs(a - b) for x, y in zip(policy, base, strict=True) for a, b in zip(x, y, strict=True))
    assert moved > 1e-3  # the adapters did change the policy
    assert trainer.train_step(samples)["actor/kl_ref"] > 0


# --- weight sync ----------------------------------------------------------------------------------------


def test_an_adapter_sync_makes_the_workers_logprobs_the_trainers(make_cfg):
    cfg = _lora_cfg(make_cfg)
    trainer = _trained(cfg, 2)
    worker = build_rollout_worker(cfg)
    stream = trainer.weight_stream()
    assert set(stream.manifest.shapes()) == {n for n, _ in trainer.model.named_parameters() if "lora_" in n}
    full = sum(p.numel() for n, p in trainer.model.named_parameters() if "lora_" not in n) * 4
    assert stream.manifest.nbytes < full / 2
    before = worker.generate(_prompts(cfg, worker), 2)
    stale = trainer.compute_logprobs(before)
    assert _max_diff(stale, [s.logprobs for s in before]) > 1e-3  # the worker still serves the base
    worker.update_weights(stream, 1)
    after = worker.generate(_prompts(cfg, worker), 2)
    assert all(s.param_version_start == 1 for s in after)
    diff = _max_diff(trainer.compute_logprobs(after), [s.logprobs for s in after])
    assert diff < 1e-4, diff  # as the full-weight path (tests/engine/test_rollout_hf.py)


def test_a_merged_sync_gives_a_worker_without_adapters_the_trainers_weights(make_cfg):
    """What vLLM and SGLang get (``model.lora.sync: merged``), taken here by the HF worker: every weight
    under the base model's names, the adapters merged in; checked against peft's own merge_and_unload."""
    cfg = _lora_cfg(make_cfg, "model.lora.sync=merged")
    trainer = _trained(cfg, 2)
    worker = build_rollout_worker(cfg)
    plain = dict(worker.model.named_parameters())
    assert not any("lora_" in n for n in plain)  # the worker is the plain model
    reference = {
        n: t.detach().clone() for n, t in copy.deepcopy(trainer.model).merge_and_unload().named_parameters()
    }
    assert set(reference) == set(plain)
    streamed = dict(trainer.weight_stream(bucket_bytes=64 * 1024).items())  # small buckets: split tensors
    assert list(streamed) == list(plain)  # every weight once, in the plain model's order and names
    adapted = [n for n in streamed if n.endswith("q_proj.weight")]
    assert adapted and all(not torch.equal(streamed[n], plain[n].detach()) for n in adapted)
    for name, tensor in streamed.items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6)
    assert all(p.requires_grad is False for n, p in trainer.model.named_parameters() if "lora_" not in n)
    before = worker.generate(_prompts(cfg, worker), 2)
    assert _max_diff(trainer.compute_logprobs(before), [s.logprobs for s in before]) > 1e-3
    worker.update_weights(trainer.weight_stream(), 1)
    after = worker.generate(_prompts(cfg, worker), 2)
    diff = _max_diff(trainer.compute_logprobs(after), [s.logprobs for s in after])
    assert diff < 1e-4, diff


def _prompts(cfg, worker):
    from rl_engine.data import PromptStream

    return PromptStream(cfg, worker.tokenizer).next_batch(8)


def _max_diff(a, b) -> float:
    return max(abs(x - y) for u, v in zip(a, b, strict=True) for x, y in zip(u, v, strict=True))


# --- checkpoints and export -----------------------------------------------------------------------------


def test_a_checkpoint_holds_the_adapters_and_resumes_bit_identically(make_cfg, tmp_path):
    cfg = _lora_cfg(make_cfg, "trainer.lr_schedule=cosine", "trainer.total_steps=6")
    vocab = PolicyTrainer(cfg).model.get_output_embeddings().weight.shape[0]
    steps = [
        synthetic_samples(16, 8, vocab, seed=s, prompt_len=(2, 8), response_len=(1, 6)) for s in range(4)
    ]
    a = PolicyTrainer(cfg)
    for s in steps[:2]:
        a.train_step(s)
    a.save_checkpoint(tmp_path / "ck", {"cursor": 3})
    files = {p.relative_to(tmp_path / "ck").as_posix() for p in (tmp_path / "ck").rglob("*") if p.is_file()}
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors", "optimizer.pt"} <= files
    assert not any(f.startswith("model/") and f.endswith(".safetensors") for f in files)  # no base weights
    assert json.loads((tmp_path / "ck" / "trainer_state.json").read_text())["lora"] is True
    b = PolicyTrainer(cfg)
    assert b.load_checkpoint(tmp_path / "ck") == {"cursor": 3}
    for s in steps[2:]:
        a.train_step(s)
        b.train_step(s)
    for (n, p), (m, q) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        assert n == m and torch.equal(p, q), n
    with pytest.raises(ValueError, match=r"with model\.lora"):
        PolicyTrainer(make_cfg(*TRAIN)).load_checkpoint(tmp_path / "ck")


def test_the_export_loads_in_peft_and_transformers_with_the_trainers_greedy_answers(
    make_cfg, tmp_path, tiny_model_dir
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rl_engine.export import export_checkpoint

    cfg = _lora_cfg(make_cfg)
    trainer = _trained(cfg, 3)
    trainer.save_checkpoint(tmp_path / "step_00000003", {})
    out = export_checkpoint(tmp_path / "step_00000003", tmp_path / "out")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        f.name for f in (tmp_path / "out" / "adapter").iterdir()
    }
    merged = AutoModelForCausalLM.from_pretrained(out.out).eval()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "out" / "adapter")).eval()
    worker = build_rollout_worker(cfg)
    prompts = _prompts(cfg, worker)
    ids = [torch.tensor([p.token_ids]) for p in prompts]
    trainer.model.eval()

    def greedy(model) -> list[list[int]]:
        with torch.no_grad():
            return [
                model.generate(input_ids=x, max_new_tokens=8, do_sample=False, pad_token_id=0)[0].tolist()
                for x in ids
            ]

    want = greedy(trainer.model)
    assert greedy(adapted) == want
    assert greedy(merged) == want
    assert want != greedy(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval())  # it learned


# --- the trainer group ----------------------------------------------------------------------------------


@pytest.mark.slow  # 2 rank processes and a resume: 5-30 s on 2 cores, by load
def test_a_two_rank_group_with_lora_reaches_the_one_rank_adapters(make_cfg, tmp_path):
    """FSDP2 shards the adapters with their decoder layer (dim 0, as every parameter); 2 gloo ranks end
    3 steps (6 AdamW steps, clipping active, several micro-batches per rank, a KL reference with the
    adapters disabled, tis) within 1% of a learning-rate step of one rank; the frozen weights untouched;
    the group's sharded checkpoint holds the adapters only, resumes on one rank and exports merged."""
    import numpy as np

    from harness.trainer_group import TrainJob, spawn_group
    from rl_engine.export import export_checkpoint

    lr = 1e-3
    cfg = make_cfg(
        LORA, "trainer.batch_size=12", "trainer.mini_batch_size=6", "trainer.max_tokens_per_micro_batch=48",
        "trainer.grad_clip=0.001", f"trainer.lr={lr}", "trainer.precision=fp32", "rollout.n=3",
        "rollout.max_new_tokens=16", "algorithm.off_policy=tis", "algorithm.kl_coef=0.05",
    )  # fmt: skip
    one = PolicyTrainer(cfg)
    start = one.weights_numpy()
    vocab = one.model.get_output_embeddings().weight.shape[0]
    steps = [
        synthetic_samples(12, 3, vocab, seed=s, prompt_len=(2, 10), response_len=(1, 16)) for s in range(3)
    ]
    job = TrainJob(cfg, steps)
    metrics = [one.train_step(s) for s in steps]
    ref = one.weights_numpy()
    path = str(tmp_path / "step_00000002")
    group = spawn_group(2, "tests.engine.group_jobs:train_save_train", (job, path, 2), timeout_s=900)
    got = group[0]["final"]
    assert ref.keys() == got.keys()
    for k in ref:
        if "lora_" not in k:
            np.testing.assert_array_equal(got[k], start[k])  # frozen on every rank
    moved = max(float(np.abs(ref[k] - start[k]).max()) for k in ref if "lora_B" in k)
    assert moved > lr
    diff = max(float(np.abs(ref[k] - got[k]).max()) for k in ref)
    assert diff <= 1e-2 * lr, diff / lr
    assert metrics[-1]["actor/kl_ref"] > 0
    from torch.distributed.checkpoint import FileSystemReader

    held = FileSystemReader(str(tmp_path / "step_00000002" / "dcp")).read_metadata().state_dict_metadata
    assert {k for k in held if k.startswith("model.")} == {f"model.{k}" for k in ref if "lora_" in k}
    resumed = PolicyTrainer(cfg)  # the group's checkpoint on one rank
    resumed.load_checkpoint(path)
    resumed.train_step(steps[2])
    again = resumed.weights_numpy()
    assert max(float(np.abs(ref[k] - again[k]).max()) for k in ref) <= 1e-2 * lr
    out = export_checkpoint(path, tmp_path / "hf")
    from transformers import AutoModelForCausalLM

    merged = dict(AutoModelForCausalLM.from_pretrained(out.out).named_parameters())
    at_save = group[0]["at_save"]
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    scale = cfg.model.lora.alpha / cfg.model.lora.rank
    want = (
        at_save[f"{q}.base_layer.weight"]
        + scale * at_save[f"{q}.lora_B.default.weight"] @ at_save[f"{q}.lora_A.default.weight"]
    )
    np.testing.assert_allclose(
        merged["model.layers.0.self_attn.q_proj.weight"].detach().numpy(), want, atol=1e-6
    )


@pytest.mark.slow
def test_a_two_rank_groups_adapter_sync_is_the_one_rank_sync_byte_for_byte(make_cfg):
    """The sync from FSDP2 shards (2 ranks, one step, buckets of 1 KiB) carries the adapters alone, byte for
    byte what the same adapters held whole stream."""
    import numpy as np

    from harness.trainer_group import TrainJob, spawn_group
    from rl_engine.weights.buckets import LocalWeightStream

    cfg = make_cfg(LORA, "trainer.batch_size=12", "trainer.mini_batch_size=6", "rollout.n=3")
    vocab = PolicyTrainer(cfg).model.get_output_embeddings().weight.shape[0]
    job = TrainJob(cfg, [synthetic_samples(12, 3, vocab, seed=0, prompt_len=(2, 10), response_len=(1, 16))])
    got = spawn_group(2, "tests.engine.group_jobs:stream_weights", (job, 1024), timeout_s=900)[0]
    adapters = {k: torch.from_numpy(v) for k, v in got["weights"].items() if "lora_" in k}
    want = LocalWeightStream.of(adapters.items(), got["manifest"].torch_dtype, 1024)
    assert got["manifest"] == want.manifest and set(want.manifest.shapes()) == set(adapters)
    for a, b in zip(got["buckets"], [b.to_bytes().copy() for b in want], strict=True):
        np.testing.assert_array_equal(a, b)
