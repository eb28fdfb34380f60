"""Part (c) of async_speedup.py: the pipeline's weight sync (object store, and a gloo broadcast) vs a bare
object-store transfer."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from rl_engine.config import apply_overrides, parse_config
from rl_engine.pipeline.components import Components
from rl_engine.pipeline.knobs import knobs_from_config
from rl_engine.pipeline.queue import MessageQueue
from rl_engine.pipeline.rollouter import Rollouter
from rl_engine.pipeline.trainer_actor import TrainerActor
from rl_engine.presets import get_preset
from rl_engine.weights.sync import BroadcastSync, ObjectStoreSync


@ray.remote
class _BareSender:
    def __init__(self, cfg: Any) -> None:
        from rl_engine.models import load_model

        model = load_model(cfg.model)
        self.sd = {k: np.ascontiguousarray(v.detach().numpy()).copy() for k, v in model.state_dict().items()}

    def put(self) -> list[Any]:
        return [ray.put(self.sd)]

    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.sd.values())


@ray.remote
class _BareReceiver:
    def __init__(self, cfg: Any) -> None:
        from rl_engine.models import load_model

        self.model = load_model(cfg.model)

    def load(self, box: list[Any]) -> None:
        import torch

        sd = ray.get(box[0])
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)


def measure_sync(repeats: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bench_sync_"))
    data = get_preset("demo-cpu")
    data["model"] = {
        "path": str(tmp / "model"),
        "tiny": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "intermediate_size": 1024},
    }
    cfg = parse_config(apply_overrides(data, ["logging.sinks=[]"]))
    from rl_engine.models import ensure_model

    ensure_model(cfg.model)
    knobs = knobs_from_config(cfg)
    comps = Components()
    queue = ray.remote(MessageQueue).options(num_cpus=0).remote(knobs, 0)
    trainer = ray.remote(TrainerActor).options(num_cpus=1, max_concurrency=2).remote(cfg, knobs, queue, comps)
    rollouter = (
        ray.remote(Rollouter).options(num_cpus=1, max_concurrency=4).remote(cfg, knobs, 0, 1, queue, comps)
    )
    sender, receiver = (
        _BareSender.options(num_cpus=1).remote(cfg),
        _BareReceiver.options(num_cpus=1).remote(cfg),
    )
    mb = ray.get(sender.nbytes.remote()) / 2**20
    store = ObjectStoreSync(trainer, [rollouter])
    gloo = BroadcastSync(trainer, [rollouter], "gloo", 60.0)
    gloo.setup(lambda refs, _stage: ray.get(refs))  # trainer rank 0, the rollouter rank 1
    pipe, bcast, bare = [], [], []
    for v in range(1, repeats + 1):  # interleaved: object store, gloo, bare
        for syncer, runs in ((store, pipe), (gloo, bcast)):
            pending = syncer.start(v)
            results = ray.get(pending.loads + pending.trainer_refs)
            runs.append(syncer.finish(pending, results[: len(pending.loads)]).total_s)
        t0 = time.monotonic()
        ray.get(receiver.load.remote(ray.get(sender.put.remote())))
        bare.append(time.monotonic() - t0)
    for a in (queue, trainer, rollouter, sender, receiver):
        ray.kill(a)
    return {
        "mb": mb,
        "pipeline_s": statistics.median(pipe),
        "gloo_s": statistics.median(bcast),
        "bare_s": statistics.median(bare),
        "pipeline_runs": pipe,
        "gloo_runs": bcast,
        "bare_runs": bare,
    }
