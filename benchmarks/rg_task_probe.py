"""Which reasoning-gym task should a 135M model learn on 2 cores? The base model's greedy held-out score on
a few candidate tasks, through the engine's own pieces (the ``rg-sums-smollm2-cpu`` preset with the
task swapped in: its prompt, chat template, reward and evaluator), so the figure is the one a run's
``val/pass@1`` before training would show. A good task starts well below its ceiling but not at zero
(GRPO learns nothing from a group whose samples all score the same).

    .venv/bin/python benchmarks/rg_task_probe.py --prompts 64 --extract last_number --out var/bench/rg-probe.json
    # the same tasks on a trained run's export (transfer to tasks it never saw):
    .venv/bin/python benchmarks/rg_task_probe.py --prompts 64 --extract last_number --model-path EXPORTED
    .venv/bin/python benchmarks/rg_task_probe.py --smoke          # the tiny model, two tasks, 4 prompts (CI)

Greedy decoding makes the scores independent of the machine's load (only the seconds are not).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl_engine.presets import get_preset  # noqa: E402 (the repository on the path first)

PRESET = "rg-sums-smollm2-cpu"
_PRESET_TASK = get_preset(PRESET)["data"]["datasets"][0]
# label -> (reasoning-gym dataset, its config): small instances, answers a few tokens long
CANDIDATES: dict[str, tuple[str, dict[str, Any]]] = {
    "chain_sum": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    # the preset's own task (sums of two numbers of one or two digits), as the preset names it
    "chain_sum_2x2_add": (_PRESET_TASK["name"], _PRESET_TASK["config"]),
    "basic_arithmetic": (
        "basic_arithmetic",
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    ),
    "products": ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}),
    "leg_counting": (
        "leg_counting",
        {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 2},
    ),
    "letter_counting": ("letter_counting", {"min_words": 3, "max_words": 5}),
    "number_sorting": (
        "number_sorting",
        {"min_numbers": 3, "max_numbers": 4, "min_decimals": 0, "max_decimals": 0},
    ),
    "count_bits": ("count_bits", {"min_n": 1, "max_n": 64}),
}


def config_for(
    task: str,
    options: dict[str, Any],
    prompts: int,
    model: str | None,
    extract: str,
    model_path: str | None = None,
) -> Any:
    from rl_engine.config import parse_config
    from rl_engine.presets import get_preset

    data = copy.deepcopy(get_preset(PRESET))
    data["data"]["datasets"] = [{"name": task, "config": options}]
    data["data"]["test_size"] = prompts
    data["reward"]["combine"][0]["kwargs"]["extract"] = extract
    data["eval"]["prompts_per_call"] = min(prompts, 32)
    if model:
        data["model"] = {"path": model}
        data["data"]["chat_template"] = "off"
        data["rollout"].update({"max_prompt_tokens": 1024, "max_new_tokens": 8})  # a character tokenizer
    elif model_path:
        data["model"] = {"path": model_path}  # e.g. a run's exported checkpoint: how far it transfers
    return parse_config(data)


def probe(
    task: str,
    options: dict[str, Any],
    prompts: int,
    model: str | None,
    extract: str,
    model_path: str | None = None,
) -> dict[str, Any]:
    from rl_engine.backends import build_rollout_worker
    from rl_engine.evaluation import Evaluator

    cfg = config_for(task, options, prompts, model, extract, model_path)
    worker = build_rollout_worker(cfg)
    evaluator = Evaluator.from_config(cfg, worker.tokenizer)
    assert evaluator is not None
    t0 = time.monotonic()
    result = evaluator.run(worker)
    m = result.metrics
    parts = {k: v for k, v in m.items() if k.startswith("val/reward/")}
    example = result.samples[0]
    return {
        "task": task,
        "config": options,
        "prompts": len(result.samples),
        "pass_at_1": m["val/pass@1"],
        "reward_mean": m["val/reward_mean"],
        "truncated": m["val/truncated_ratio"],
        "response_tokens": m["val/response_length"],
        "components": parts,
        "seconds": round(time.monotonic() - t0, 1),
        "example": {
            "prompt": example.prompt_text[-300:],
            "response": example.response_text,
            "answer": example.answer,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tasks", default=",".join(CANDIDATES))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--extract", default="auto", help="the reasoning_gym reward's extract mode")
    parser.add_argument("--model-path", default=None, help="another model folder (an exported run: transfer)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    model = None
    tasks = args.tasks.split(",")
    if args.smoke:
        import tempfile

        from rl_engine.config import TinyModelSpec
        from rl_engine.models.tiny import save_tiny_model

        model = str(save_tiny_model(TinyModelSpec(), Path(tempfile.mkdtemp()) / "tiny"))
        tasks, args.prompts = ["chain_sum", "leg_counting"], 4
    rows = []
    for task in tasks:
        try:
            name, options = CANDIDATES[task]
            row = {
                "label": task,
                "extract": args.extract,
                "model": args.model_path or "base",
                **probe(name, options, args.prompts, model, args.extract, args.model_path),
            }
        except ValueError as exc:  # the options allow too few questions for the split, say
            print(json.dumps({"task": task, "refused": str(exc)[:300]}), flush=True)
            continue
        rows.append(row)
        shown = ("label", "pass_at_1", "reward_mean", "truncated", "response_tokens", "seconds", "example")
        print(json.dumps({k: row[k] for k in shown}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
