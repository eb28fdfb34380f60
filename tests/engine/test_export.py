"""``python -m rl_engine export``: a trained checkpoint becomes a standard HF model directory that plain
``from_pretrained`` loads with the checkpoint's log-probs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_engine.cli import main
from rl_engine.pipeline.checkpoint import checkpoint_path
from rl_engine.trainer import PolicyTrainer
from tests.engine.test_trainer import _scored_batch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """A checkpoint after two real trainer steps (weights differ from the tiny model's), and a batch."""
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    cfg = parse_config(apply_overrides(data, [
        f"model.path={tiny_model_dir}", "trainer.batch_size=16", "trainer.mini_batch_size=8",
        "rollout.max_new_tokens=4", "rollout.temperature=0.7", "trainer.lr=0.01"]))  # fmt: skip
    trainer = PolicyTrainer(cfg)
    for _ in range(2):
        trainer.train_step(_scored_batch(cfg))
    root = tmp_path_factory.mktemp("ckpts")
    trainer.save_checkpoint(checkpoint_path(root, 2), {})
    return cfg, root, _scored_batch(cfg)


def _hf_logprobs(model_dir: Path, samples, temperature: float, dtype=None) -> list[list[float]]:
    """Log-probs of each response under plain transformers, one unpadded sequence at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **({"dtype": dtype} if dtype else {})).eval()
    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.response_ids])
            logits = model(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1].float()
            logp = torch.log_softmax(logits / temperature, dim=-1)
            out.append(logp.gather(-1, torch.tensor(s.response_ids)[:, None]).squeeze(-1).tolist())
    return out


def test_exported_model_loads_with_from_pretrained_and_matches_the_checkpoint(
    trained, tmp_path, tiny_model_dir
):
    from transformers import AutoTokenizer

    cfg, root, samples = trained
    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(root), "--out", str(out)]) == 0  # the run's dir: newest step
    names = {f.name for f in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "rl_engine_export.json"} <= names  # fmt: skip
    assert not names & {"optimizer.pt", "rng.pt", "extra.pt", "trainer_state.json"}
    info = json.loads((out / "rl_engine_export.json").read_text())
    assert (
        info["step"] == 2
        and info["dtype"] == "float32"
        and info["source_checkpoint"].endswith("step_00000002")
    )

    # the checkpoint's own log-probs: a trainer restored from it, on its padded batch layout
    restored = PolicyTrainer(cfg)
    restored.load_checkpoint(checkpoint_path(root, 2))
    want = restored.compute_logprobs(samples)
    got = _hf_logprobs(out, samples, cfg.rollout.temperature)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(torch.tensor(g), torch.tensor(w), rtol=0, atol=1e-5)
    initial = _hf_logprobs(tiny_model_dir, samples, cfg.rollout.temperature)
    assert (
        max(abs(a - b) for x, y in zip(initial, got, strict=True) for a, b in zip(x, y, strict=True)) > 1e-3
    )

    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.decode(tok("copy k: 3+4=7")["input_ids"]) == "copy k: 3+4=7"
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<s>user: hi</s>assistant: "
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == tok.eos_token_id and gen["pad_token_id"] == tok.pad_token_id


def test_export_casts_to_bfloat16_on_request(trained, tmp_path):
    cfg, root, samples = trained
    out = tmp_path / "bf16"
    assert (
        main(
            [
                "export",
                "--checkpoint",
                str(checkpoint_path(root, 2)),
                "--out",
                str(out),
                "--dtype",
                "bfloat16",
            ]
        )
        == 0
    )
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(out / "model.safetensors")).values()} == {torch.bfloat16}
    full = _hf_logprobs(checkpoint_path(root, 2) / "model", samples[:4], cfg.rollout.temperature)
    half = _hf_logprobs(out, samples[:4], cfg.rollout.temperature, dtype=torch.bfloat16)
    for f, h in zip(full, half, strict=True):
        torch.testing.assert_close(torch.tensor(h), torch.tensor(f), rtol=0, atol=0.1)


def test_export_errors_are_one_line(trained, tmp_path):
    _, root, _ = trained
    (tmp_path / "taken").mkdir()
    cases = [
        (["--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o1")], "no such directory"),
        (["--checkpoint", str(tmp_path), "--out", str(tmp_path / "o2")], "is not a checkpoint"),
        (
            ["--checkpoint", str(root), "--out", str(tmp_path / "taken")],
            "already exists; choose a new directory",
        ),
    ]
    for args, message in cases:
        proc = subprocess.run([sys.executable, "-m", "rl_engine", "export", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.strip().startswith("error: ") and message in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert list((tmp_path / "taken").iterdir()) == []  # nothing written over
