"""Checkpoint export end to end on the real stack: a run trains and checkpoints on the Ray head, an export is
asked for through the REST API, the Celery worker runs ``python -m rl_engine export`` as a Ray Job, and
the result is a model directory ``from_pretrained`` loads (in the folder the platform chose); a failing
export records the engine's error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launcher.exports import exports_for_run
from tests.conftest import wait_for
from tests.launcher.test_run_lifecycle import api, no_job_outlives_its_test, tiny_config, wait_state  # noqa: F401
from tracking.models import Checkpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _wait_export(run_id: int, step: int, timeout_s: float = 180) -> dict:
    wait_for(lambda: exports_for_run(run_id).get(step, {}).get("state") in ("succeeded", "failed"),
             timeout_s=timeout_s, interval_s=0.5, message=f"the export of run {run_id} step {step} to end")  # fmt: skip
    return exports_for_run(run_id)[step]


def test_export_of_a_run_checkpoint_through_the_api_gives_a_loadable_model(api):  # noqa: F811
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = wait_state(api.launch(tiny_config(steps=3)), "succeeded")
    ckpt = Checkpoint.objects.get(run=run, step=3)
    queued = api.post(f"/api/runs/{run.pk}/checkpoints/3/export", {})
    assert queued["state"] == "queued"
    record = _wait_export(run.pk, 3)
    assert record["state"] == "succeeded", record
    out = Path(record["out"])
    assert out == Path(ckpt.path).parent / "hf" / "step_00000003" and record["size_bytes"] > 0
    assert json.loads((out / "rl_engine_export.json").read_text())["step"] == 3
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert sum(p.numel() for p in model.parameters()) > 0
    assert AutoTokenizer.from_pretrained(str(out)).chat_template
    states = [e.data["state"] for e in run.events.filter(data__source="export").order_by("seq")]
    assert states == ["queued", "running", "succeeded"]  # the notices the run page follows

    # the checkpoint is gone from the cluster's disk: the export fails with the engine's one-line error
    shutil.rmtree(ckpt.path)
    api.post(f"/api/runs/{run.pk}/checkpoints/3/export", {})
    failed = _wait_export(run.pk, 3)
    assert failed["state"] == "failed" and failed["id"] > queued["id"]
    assert "error: " in failed["error"] and "no such directory" in failed["error"]
