"""A whole run on a real two-node Ray cluster on this machine (``harness.ray_cluster``: ``ray start`` a head
and a worker node): the head has the custom resource ``trainer_node``, the other node ``rollout_node``;
the config asks for them per role, so Ray must place both trainer ranks on the head and the rollouter
on the other node. The factories record where each actor was built. Prints one JSON line. Usage:
python -m tests.pipeline.multinode_run MODEL_DIR TMP_DIR (the test runs it in its own process: it
starts and stops its own cluster)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import ray


def _record(out_dir: str, role: str) -> None:
    node = ray.get_runtime_context().get_node_id()
    with open(Path(out_dir) / f"{role}-{os.getpid()}", "w") as f:
        f.write(node)


def placed_trainer(cfg: Any, out_dir: str, ranks: Any = None) -> Any:
    from rl_engine.pipeline.components import real_trainer

    _record(out_dir, "trainer")
    return real_trainer(cfg, ranks=ranks)


def placed_worker(cfg: Any, out_dir: str, index: int = 0) -> Any:
    from rl_engine.pipeline.components import real_worker

    _record(out_dir, "rollout")
    return real_worker(cfg, index=index)


def main(model_dir: str, tmp: str) -> None:
    from harness.ray_cluster import LocalRayCluster
    from rl_engine.jobspec import Placement
    from rl_engine.pipeline import run_experiment
    from rl_engine.pipeline.components import Components, Factory
    from tests.pipeline.conftest import RecordingSink
    from tests.pipeline.test_trainer_group_pipeline import group_cfg

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    marks = Path(tmp) / "placed"
    marks.mkdir(parents=True, exist_ok=True)
    # each node: one CPU, enough for its role (two trainer ranks of 0.5 CPU; one rollouter of 0.5)
    cluster = LocalRayCluster(Path(tmp) / "ray")
    with cluster.started(head_cpus=1, head_resources={"trainer_node": 2}, workers=[(1, {"rollout_node": 1})]):
        head, worker = cluster.nodes
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            cfg = group_cfg(
                Path(model_dir),
                "trainer.world_size=2",
                "trainer.total_steps=2",
                'resources.trainer_node_resources={"trainer_node": 1}',
                'resources.rollout_node_resources={"rollout_node": 1}',
            )
            components = Components(
                worker=Factory("tests.pipeline.multinode_run:placed_worker", {"out_dir": str(marks)}),
                trainer=Factory("tests.pipeline.multinode_run:placed_trainer", {"out_dir": str(marks)}),
            )
            placement = Placement(checkpoint_dir=str(Path(tmp) / "ckpt"))
            summary = run_experiment(cfg, RecordingSink(), placement=placement, components=components)
        finally:
            ray.shutdown()
        nodes = {p.name: p.read_text() for p in marks.iterdir()}
        report = {
            "steps_done": summary.steps_done,
            "head": head.node_id,
            "worker": worker.node_id,
            "trainer_nodes": [v for k, v in sorted(nodes.items()) if k.startswith("trainer")],
            "rollout_nodes": [v for k, v in sorted(nodes.items()) if k.startswith("rollout")],
        }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
