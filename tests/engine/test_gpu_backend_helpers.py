"""Pure helpers of the vLLM / SGLang workers, tested without the engines.

The engines need CUDA and cannot run here: their outputs are stood in for by plain objects shaped as
the released APIs document them (docs/engine.md). The workers themselves are tested in tests/gpu/.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rl_engine.backends.sglang import worker as sg
from rl_engine.backends.vllm import worker as vl
from rl_engine.config import SGLangRolloutConfig, VLLMRolloutConfig
from rl_engine.rollout.common import eos_floor, extend_sample, normalise_finish
from rl_engine.types import Sample

EOS = [2]


def _completion(ids, lps, reason):
    steps = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps, strict=True)]
    return SimpleNamespace(token_ids=ids, logprobs=steps, finish_reason=reason)


def test_vllm_completion_conversion():
    assert vl.convert_completion(_completion([5, 6, 2], [-0.1, -0.2, -0.3], "stop"), EOS) == (
        [5, 6, 2],
        [-0.1, -0.2, -0.3],
        "stop",
    )
    assert vl.convert_completion(_completion([5, 6], [-0.1, -0.2], "length"), EOS)[2] == "length"
    assert vl.convert_completion(_completion([5], [-0.1], "abort"), EOS)[2] == "abort"
    assert vl.convert_completion(_completion([], [], None), EOS) == ([], [], "abort")
    with pytest.raises(ValueError, match="log-prob entries"):
        vl.convert_completion(
            SimpleNamespace(
                token_ids=[1, 2], logprobs=[{1: SimpleNamespace(logprob=0.0)}], finish_reason="stop"
            ),
            EOS,
        )


def test_vllm_sampling_kwargs_follow_the_config():
    cfg = VLLMRolloutConfig(temperature=0.7, max_new_tokens=128)
    kw = vl.sampling_kwargs(cfg, 100, [2, 7])
    assert kw == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 1.0,
        # pinned neutral: only logits / temperature shape the distribution (the log-prob convention)
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "max_tokens": 100,
        "min_tokens": 0,  # eos may end a response at once unless RolloutWorker.min_new_tokens says not
        "logprobs": 0,
        "stop_token_ids": [2, 7],
        # the worker's own eos ids stop it, not the tokenizer's eos vLLM would add (docs/engine.md)
        "ignore_eos": True,
        "skip_special_tokens": True,
    }
    assert vl.sampling_kwargs(cfg, 100, [2, 7], min_tokens=30)["min_tokens"] == 30


def test_vllm_refuses_top_p_below_one_with_the_reason():
    with pytest.raises(ValueError, match="renormalised over the nucleus"):
        VLLMRolloutConfig(top_p=0.9)
    assert SGLangRolloutConfig(top_p=0.9).top_p == 0.9  # SGLang's log-probs are taken before the cut


def test_sglang_output_conversion():
    out = {
        "output_ids": [5, 2],
        "meta_info": {
            "output_token_logprobs": [(-0.5, 5, "a"), (-0.25, 2, None)],
            "finish_reason": {"type": "stop"},
        },
    }
    assert sg.convert_output(out, EOS) == ([5, 2], [-0.5, -0.25], "stop")
    cut = {
        "output_ids": [5],
        "meta_info": {"output_token_logprobs": [(-0.5, 5, "a")], "finish_reason": {"type": "abort"}},
    }
    assert sg.convert_output(cut, EOS)[2] == "abort"
    bad = {"output_ids": [5, 6], "meta_info": {"output_token_logprobs": [(-0.5, 6, "a"), (-0.1, 5, "b")]}}
    with pytest.raises(ValueError, match="do not follow"):
        sg.convert_output(bad, EOS)
    params = sg.sampling_params(SGLangRolloutConfig(temperature=0.5), 10, EOS)
    assert params["max_new_tokens"] == 10 and params["temperature"] == 0.5 and params["stop_token_ids"] == EOS
    assert (params["top_k"], params["min_p"], params["repetition_penalty"]) == (-1, 0.0, 1.0)
    assert params["min_new_tokens"] == 0
    assert sg.sampling_params(SGLangRolloutConfig(), 10, EOS, min_new_tokens=4)["min_new_tokens"] == 4


def test_eos_floor_counts_the_whole_response_within_the_call_budget():
    assert eos_floor(0, 0, 16) == 0  # off
    assert eos_floor(10, 0, 16) == 10  # a fresh response
    assert eos_floor(10, 4, 12) == 6  # resumed after 4 tokens: what is left of the 10
    assert eos_floor(10, 12, 4) == 0  # already past it
    assert eos_floor(32, 0, 16) == 16  # never more than the call may decode


def test_extend_sample_tracks_versions_and_interruptions():
    s = Sample(
        prompt_uid="p",
        group_id="p",
        prompt_ids=[1],
        response_ids=[],
        logprobs=[],
        finish_reason="abort",
        param_version_start=3,
        param_version_end=3,
    )
    s1 = extend_sample(s, [5, 6], [-1.0, -2.0], "abort", version=3, elapsed_s=0.5, tokenizer=None)
    s2 = extend_sample(s1, [7, 2], [-0.5, -0.1], "stop", version=5, elapsed_s=0.25, tokenizer=None)
    assert s2.response_ids == [5, 6, 7, 2] and s2.logprobs == [-1.0, -2.0, -0.5, -0.1]
    assert (s2.param_version_start, s2.param_version_end) == (3, 5)
    assert s2.num_interruptions == 1 and s2.gen_time_s == 0.75
    # A continuation that produced nothing keeps its end version.
    assert extend_sample(s1, [], [], "abort", version=9, elapsed_s=0, tokenizer=None).param_version_end == 3


def test_normalise_finish():
    assert normalise_finish("length", 2, EOS) == "stop"  # ended on eos: a real stop
    assert normalise_finish("length", 5, EOS) == "length"
    assert normalise_finish(None, None, EOS) == "abort"


def test_gpu_backend_check_skips_cleanly_without_an_engine(capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check_backends.py"
    spec = importlib.util.spec_from_file_location("gpu_check_backends", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([]) == 0
    assert "neither vllm nor sglang" in json.loads(capsys.readouterr().out)["skipped"]


# --- vLLM's reload warnings: which modules a weight sync never sends to ----------------------------------


def _vllm_like_llama(*, tied: bool):
    """The module layout of vLLM's Llama (class names as vLLM's): one rotary module shared by every
    attention layer, holding only its cos/sin cache buffer; an ``lm_head`` tied to the embedding, or
    with its own weight."""
    import torch

    def named(name: str, base: type = torch.nn.Module) -> type:
        return type(name, (base,), {})

    class RotaryEmbedding(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cos_sin_cache", torch.ones(8, 4), persistent=False)

    class Attention(torch.nn.Module):
        def __init__(self, rotary: torch.nn.Module) -> None:
            super().__init__()
            self.qkv_proj = named("QKVParallelLinear", torch.nn.Linear)(4, 12, bias=False)
            self.o_proj = named("RowParallelLinear", torch.nn.Linear)(4, 4, bias=False)
            self.rotary_emb = rotary

    rotary = RotaryEmbedding()
    model = torch.nn.Module()
    model.embed_tokens = named("VocabParallelEmbedding", torch.nn.Embedding)(10, 4)
    model.layers = torch.nn.ModuleList([Attention(rotary) for _ in range(2)])
    model.norm = named("RMSNorm", torch.nn.LayerNorm)(4)
    model.lm_head = named("ParallelLMHead", torch.nn.Embedding)(10, 4)
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_the_modules_a_sync_never_sends_to_are_buffer_only_and_tied_ones(tied):
    from rl_engine.backends.vllm.weights import layers_a_sync_never_loads

    model = _vllm_like_llama(tied=tied)
    # brute force: a module gets a tensor from a sync when one of its parameters is sent under its
    # own name: the names ``named_parameters`` gives (tied parameters once, the first owner's)
    sent = {name.rsplit(".", 1)[0] for name, _ in model.named_parameters()}
    receives = {type(m).__name__ for path, m in model.named_modules() if path in sent}
    holders = {
        type(m).__name__ for m in model.modules() if list(m.parameters(False)) or list(m.buffers(False))
    }
    assert layers_a_sync_never_loads(model) == holders - receives
    assert layers_a_sync_never_loads(model) == (
        {"RotaryEmbedding", "ParallelLMHead"} if tied else {"RotaryEmbedding"}
    )


def test_a_class_with_a_module_that_takes_weights_keeps_its_warning():
    import torch

    from rl_engine.backends.vllm.weights import layers_a_sync_never_loads

    model = torch.nn.Module()
    model.a, model.b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    model.b.weight = model.a.weight  # b's weight is a's; its bias is its own
    model.c = torch.nn.Linear(2, 2, bias=False)
    model.c.weight = model.a.weight  # c holds nothing of its own, but Linear modules do take weights
    assert layers_a_sync_never_loads(model) == set()


def test_the_filter_drops_the_expected_warnings_only(caplog):
    import logging

    from rl_engine.backends.vllm.weights import (
        RELOAD_LOGGER,
        RELOAD_NOTHING_LOADED,
        quiet_expected_reload_warnings,
    )

    logger = logging.getLogger(RELOAD_LOGGER)
    try:
        assert quiet_expected_reload_warnings(_vllm_like_llama(tied=True)) == [
            "ParallelLMHead",
            "RotaryEmbedding",
        ]
        assert quiet_expected_reload_warnings(_vllm_like_llama(tied=True))  # again: replaces, not stacks
        assert len(logger.filters) == 1
        with caplog.at_level(logging.DEBUG, logger=RELOAD_LOGGER):
            for layer in ("ParallelLMHead", "RotaryEmbedding", "QKVParallelLinear", "VocabParallelEmbedding"):
                logger.warning(RELOAD_NOTHING_LOADED, layer)
            logger.warning("%s: Excessive loading", "RotaryEmbedding")
            logger.debug("%s: Delayed processing", "ParallelLMHead")
        assert [r.getMessage() for r in caplog.records] == [
            "QKVParallelLinear: Failed to load weights",  # a module that should have loaded: a real warning
            "VocabParallelEmbedding: Failed to load weights",
            "RotaryEmbedding: Excessive loading",
            "ParallelLMHead: Delayed processing",
        ]
    finally:
        for f in list(logger.filters):
            logger.removeFilter(f)
