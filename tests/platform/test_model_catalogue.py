"""``GET /api/models``: the model directories a config may name, read from their files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.platform.conftest import client_for

CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def write_model(folder: Path, *, arch="LlamaForCausalLM", hidden=64, heads=1, head_dim=None, vocab=50,
                chat=True, shards=1, extra=None) -> int:  # fmt: skip
    """A model directory with random tensors in ``shards`` safetensors files; returns how many numbers
    the tensors hold (the reference parameter count)."""
    folder.mkdir(parents=True)
    cfg = {"architectures": [arch], "model_type": "llama", "hidden_size": hidden, "num_attention_heads": heads,
           "num_hidden_layers": 2, "vocab_size": vocab, "max_position_embeddings": 128, **(extra or {})}  # fmt: skip
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    (folder / "config.json").write_text(json.dumps(cfg))
    if chat:
        (folder / "chat_template.jinja").write_text(CHATML)
    rng = np.random.default_rng(0)
    total = 0
    for shard in range(shards):
        tensors = {
            f"model.layers.{shard}.w": rng.standard_normal((hidden, 3 * hidden + shard)).astype(np.float32),
            f"model.layers.{shard}.norm": np.ones(hidden, dtype=np.float32),
        }
        total += sum(t.size for t in tensors.values())
        save_file(tensors, str(folder / f"model-{shard:05d}-of-{shards:05d}.safetensors"))
    return total


@pytest.fixture
def roots(settings, tmp_path):
    settings.MODEL_ROOTS = [tmp_path / "models", tmp_path / "more"]
    settings.ALLOWED_MODELS = []
    return settings.MODEL_ROOTS


def listed(user) -> dict:
    resp = client_for(user).get("/api/models")
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_every_model_directory_under_the_roots_with_what_its_files_say(team, roots, settings, tmp_path):
    a_params = write_model(roots[0] / "a-llama", head_dim=64, shards=2)
    write_model(roots[0] / "org" / "b-tiny", hidden=64, heads=4, chat=False)  # head size 16
    write_model(roots[1] / "c-other", arch="SomethingNewForCausalLM", extra={"auto_map": {"x": "y"}})
    write_model(roots[0] / "projects" / "project-1" / "built")  # what runs build: not listed
    write_model(roots[0] / ".d-fetching")  # a fetch in progress: not listed
    (roots[0] / "not-a-model").mkdir()
    write_model(tmp_path / "outside" / "e-linked")
    (roots[0] / "e-link").symlink_to(tmp_path / "outside" / "e-linked")  # links are not followed
    write_model(tmp_path / "shared" / "f-allowed")
    settings.ALLOWED_MODELS = [str(tmp_path / "shared" / "f-allowed"), "Qwen/Qwen2.5-0.5B"]

    body = listed(team["viewer"])
    by_name = {m["name"]: m for m in body["models"]}
    assert list(by_name) == ["a-llama", "b-tiny", "c-other", "f-allowed"]
    a, b, c = by_name["a-llama"], by_name["b-tiny"], by_name["c-other"]
    assert a["path"] == str(roots[0] / "a-llama") and a["parameters"] == a_params
    assert (a["head_dim"], a["vocab_size"], a["num_layers"], a["chat_template"]) == (64, 50, 2, True)
    assert a["backends"] == ["hf", "vllm", "sglang", "vllm-cpu"]
    assert b["head_dim"] == 16 and b["backends"] == ["hf", "vllm", "sglang"] and not b["chat_template"]
    assert c["backends"] == ["hf"] and c["remote_code"] is True
    assert a["size_bytes"] == sum(p.stat().st_size for p in (roots[0] / "a-llama").iterdir())
    assert [u["name"] for u in body["not_fetched"]] == ["smollm2-135m-instruct"]
    assert body["not_fetched"][0]["command"] == "python -m rl_engine models fetch smollm2-135m-instruct"


def test_a_fetched_catalogue_model_is_not_listed_as_missing_and_its_card_is_read(team, roots):
    write_model(roots[0] / "smollm2-135m-instruct", head_dim=64)
    (roots[0] / "smollm2-135m-instruct" / "README.md").write_text(
        "---\nlicense: apache-2.0\nrl_engine:\n  quantisation: Q4_1\n---\n\n# card\n"
    )
    body = listed(team["member"])
    assert body["not_fetched"] == []
    assert body["models"][0]["card"] == {"license": "apache-2.0", "rl_engine": {"quantisation": "Q4_1"}}


def test_a_broken_safetensors_header_gives_no_count_not_an_error(team, roots):
    write_model(roots[0] / "m")
    with (roots[0] / "m" / "model-00000-of-00001.safetensors").open("r+b") as fh:
        fh.write(struct.pack("<Q", 1 << 62))  # a header length no file holds
    (roots[0] / "m" / "config.json").write_text("{not json")
    (model,) = listed(team["member"])["models"]
    assert model["parameters"] is None and model["architecture"] is None and model["backends"] == ["hf"]


def test_only_signed_in_users_see_the_catalogue(db, roots):
    assert client_for().get("/api/models").status_code in (401, 403)
