"""The launcher's ``address`` provider submits a run to a multi-node Ray cluster: two worker nodes join the
stack's Ray head (``ray start --address``, harness.ray_cluster), one with the custom resource
``trainer_node``, one with ``rollout_node``; a run of a two-rank trainer group asks for them per role
(docs/deploy.md, "Multi-node clusters"), goes through the real stack (Celery worker, Jobs API, the
engine's HTTP sink) to success, and Ray placed both trainer ranks on the trainer node and the rollouter
on the rollout node."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.ray_cluster import LocalRayCluster
from tests.launcher.engine_runs import db_points, jsonl_points, tiny_config
from tests.launcher.test_run_lifecycle import wait_state

# extended: 2-4 min (a real multi-node cluster); the address provider runs in CI through
# test_run_lifecycle's existing-cluster test, the trainer group across ranks through tests/pipeline.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.extended]


def _actor_nodes(run, class_name: str) -> list[str]:
    """The node of every actor of ``class_name`` the run's Ray job created (alive or not)."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    ray_job_id = JobSubmissionClient(run.cluster_address).get_job_info(run.ray_job_id).job_id
    filters = [("job_id", "=", ray_job_id), ("class_name", "=", class_name)]
    return [a.node_id for a in list_actors(address=run.cluster_address, filters=filters, detail=True)]


def test_provider_address_runs_a_trainer_group_across_the_nodes_of_a_multi_node_cluster(
    launcher_stack, tmp_path, settings
):
    from experiments.services import experiment_create, run_create
    from launcher import job_env, ray_local
    from rl_engine.config import parse_config
    from tests.factories import ProjectFactory

    head = ray_local.read_state()
    assert head is not None and head.dashboard_url == launcher_stack.env["RAY_ADDRESS"]
    nodes = LocalRayCluster(tmp_path / "nodes", env=job_env.head_env())  # the head's own environment
    workers = [(1, {"trainer_node": 2}), (1, {"rollout_node": 1})]
    with nodes.started(workers=workers, join=(head.gcs_address, Path(head.temp_dir))):
        trainer_node, rollout_node = (n.node_id for n in nodes.nodes)
        settings.ALLOWED_NODE_RESOURCES = ["trainer_node", "rollout_node"]  # the deployment's labels
        cfg = tiny_config(steps=2, world_size=2)
        cfg["resources"] = {
            "cpus_per_actor": 0.5,
            "trainer_node_resources": {"trainer_node": 1},
            "rollout_node_resources": {"rollout_node": 1},
        }
        exp = experiment_create(
            project=ProjectFactory(), user=None, name="multi-node", config=parse_config(cfg)
        )
        run = wait_state(
            run_create(experiment=exp, user=None, provider="address").pk, "succeeded", timeout_s=900
        )
        assert run.provider == "address" and run.cluster_address == launcher_stack.env["RAY_ADDRESS"]
        assert sorted(db_points(run)) == sorted(jsonl_points(run))  # it trained and reported every point
        assert _actor_nodes(run, "TrainerActor") == [trainer_node] * 2
        assert _actor_nodes(run, "Rollouter") == [rollout_node]
