"""What environment the engine's processes get: an allow-list, never the platform's own settings.

A job (and any model code a project with ``trust_remote_code`` runs in it) must not see the platform's
secrets (``DATABASE_URL``, ``DJANGO_SECRET_KEY``, ``REDIS_URL``, ...). Two places decide it:

- the local Ray head (``launcher.ray_local``) is started with :func:`head_env`, so the job drivers and
  actors it spawns inherit only what a Python process, the accelerators, the model hubs and the
  engine's sinks need (not the Celery worker's whole environment);
- every Ray job (both providers, runs and exports) gets :func:`job_env` as its ``runtime_env``: the
  engine's own settings (``RL_ENGINE_*``: ingest URL, token file, spool) and the few process knobs.

An operator adds names with ``ENGINE_ENV_PASSTHROUGH`` (comma-separated). A cluster of the ``address``
provider keeps its own nodes' environment: the platform sends it nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from django.conf import settings

# Exact names a process needs to run (paths, locale, certificates, proxies, thread counts).
ALLOWED_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
        "VIRTUAL_ENV", "LD_LIBRARY_PATH", "LD_PRELOAD", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
        "TOKENIZERS_PARALLELISM", "XDG_CACHE_HOME",
        "RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE", "RAY_DEDUP_LOGS",
    }
)  # fmt: skip
# Prefixes of what the engine itself reads: its sink settings, accelerators and collectives, the model
# hubs and caches, the GPU inference engines, and the experiment trackers it reports to.
ALLOWED_PREFIXES = (
    "RL_ENGINE_", "LC_", "OMP_", "MKL_", "KMP_", "CUDA_", "NVIDIA_", "NCCL_", "ROCR_", "HIP_", "HF_", "HUGGINGFACE_",
    "TRANSFORMERS_", "TORCH_", "TORCHINDUCTOR_", "TRITON_", "VLLM_", "SGLANG_", "MLFLOW_", "WANDB_",
)  # fmt: skip


def passthrough() -> frozenset[str]:
    """Extra names the operator lets through (``ENGINE_ENV_PASSTHROUGH``)."""
    return frozenset(getattr(settings, "ENGINE_ENV_PASSTHROUGH", ()) or ())


def allowed(name: str, extra: Iterable[str] = ()) -> bool:
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES) or name in set(extra)


def filtered(environ: Mapping[str, str]) -> dict[str, str]:
    """The allowed part of ``environ``."""
    extra = passthrough()
    return {k: v for k, v in environ.items() if allowed(k, extra)}


def head_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a local Ray head (and so of every job driver and actor it starts)."""
    env = filtered(os.environ if environ is None else environ)
    env.update(
        {
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
            # Ray's hard stop: a cancelled engine is killed this long after SIGTERM. The platform waits what
            # the engine says it needs (launcher.supervisor.cancel_grace_s), never longer than this.
            "RAY_JOB_STOP_WAIT_TIME_S": str(
                max(
                    getattr(settings, "RUN_CANCEL_GRACE_MAX_S", 300),
                    getattr(settings, "RUN_CANCEL_GRACE_S", 5),
                )
            ),
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "3",
        }
    )
    return env


def job_env(engine: Mapping[str, str] | None = None) -> dict[str, str]:
    """A Ray job's ``runtime_env`` variables: where the engine is imported from, the engine's own
    settings (``engine``, e.g. ``JobSpec.env()``), and unbuffered output. Refuses any other name."""
    workdir = str(getattr(settings, "ENGINE_WORKDIR", "") or settings.BASE_DIR)
    engine = dict(engine or {})
    stray = sorted(k for k in engine if not k.startswith("RL_ENGINE_"))
    if stray:
        raise ValueError(f"not the engine's settings (RL_ENGINE_*): {', '.join(stray)}")
    return {
        "PYTHONPATH": workdir,  # the engine's Ray actors import rl_engine from the working dir too
        **engine,
        "PYTHONUNBUFFERED": "1",  # log lines reach the run's events as they are printed
        "RAY_USAGE_STATS_ENABLED": "0",
    }
