"""``rlp sweep ...``: create a grid or random search over config fields, show it ranked, cancel it."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from rlp_client.cli_common import (
    EXIT_BAD_INPUT,
    CliError,
    Output,
    client_from_config,
    parse_id,
    read_yaml_mapping,
)
from rlp_client.models import Sweep


def _value(raw: str) -> Any:
    """JSON first (``1e-6`` is a number there, a string to YAML 1.1), else YAML, else the text."""
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _space(args: argparse.Namespace) -> dict[str, Any]:
    """The search space: the file's mapping (-f), then each ``--param PATH=SPEC`` (SPEC parsed as JSON
    or YAML: ``[1e-6, 3e-6]`` a list, ``uniform(0.2, 0.3)`` a string, ``{int: [1, 4]}`` a mapping)."""
    space: dict[str, Any] = {}
    if args.file:
        space.update(read_yaml_mapping(args.file, "config paths to specs"))
    for item in args.param or []:
        path, sep, raw = item.partition("=")
        if not sep or not path.strip():
            raise CliError(f"--param: expected PATH=SPEC, got {item!r}", EXIT_BAD_INPUT)
        space[path.strip()] = _value(raw)
    if not space:
        raise CliError(
            "--param: give the search space (--param PATH=SPEC, repeatable, or -f FILE)", EXIT_BAD_INPUT
        )
    return space


def _summary_line(sweep: Sweep) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep.run_states.items()))
    return (f"sweep {sweep.id} {sweep.name!r} ({sweep.method}, {sweep.max_runs} runs, at most "
            f"{sweep.max_concurrent} at once, seed {sweep.seed}): {sweep.state} - {counts}")  # fmt: skip


def cmd_create(args: argparse.Namespace, out: Output) -> int:
    experiment = parse_id(args.experiment, "experiment")
    space = _space(args)
    early = {"min_steps": args.early_stop} if args.early_stop is not None else None
    with client_from_config() as client:
        sweep = client.create_sweep(
            experiment, method=args.method, search_space=space, metric=args.metric, name=args.name,
            max_runs=args.max_runs, max_concurrent=args.max_concurrent, goal=args.goal, summary=args.summary,
            early_stopping=early, seed=args.seed, priority=args.priority,
        )  # fmt: skip
    out.result(sweep.raw, _summary_line(sweep))
    return 0


def cmd_show(args: argparse.Namespace, out: Output) -> int:
    sweep_id = parse_id(args.sweep, "sweep")
    with client_from_config() as client:
        sweep = client.sweep(sweep_id, summary=args.summary)
    if out.json_mode:
        out.result(sweep.raw)
        return 0
    out.say(_summary_line(sweep))
    out.say(f"ranked by the {sweep.ranked_by} value of {sweep.metric} (goal {sweep.goal})")
    rows = [
        [str(r.rank or "-"), str(r.id), str(r.number), r.state + (" (early-stopped)" if r.early_stopped else ""),
         *(str(r.params.get(p)) for p in sweep.params), str(r.seed), "-" if r.value is None else f"{r.value:.6g}"]
        for r in sweep.runs
    ]  # fmt: skip
    out.table(sweep.raw, ["rank", "run", "#", "state", *sweep.params, "seed", sweep.metric], rows)
    return 0


def cmd_cancel(args: argparse.Namespace, out: Output) -> int:
    sweep_id = parse_id(args.sweep, "sweep")
    with client_from_config() as client:
        sweep = client.cancel_sweep(sweep_id)
    out.result(sweep.raw, _summary_line(sweep))
    return 0


def add_commands(
    sweep_parser: argparse.ArgumentParser, common: argparse.ArgumentParser, parser_class: type
) -> None:
    sub = sweep_parser.add_subparsers(dest="action", required=True, parser_class=parser_class)
    p = sub.add_parser("create", parents=[common], help="a grid or random search over config fields")
    p.add_argument("experiment", help="the base experiment's id")
    p.add_argument("--method", choices=["grid", "random"], default="grid")
    p.add_argument("--param", action="append", metavar="PATH=SPEC",
                   help="e.g. trainer.lr='[1e-6, 3e-6]' or 'algorithm.clip_eps_high=uniform(0.2, 0.3)'; repeatable")  # fmt: skip
    p.add_argument("-f", "--file", help="the search space as a YAML mapping (- for stdin)")
    p.add_argument("--metric", default="reward/mean")
    p.add_argument("--goal", choices=["max", "min"])
    p.add_argument("--summary", choices=["last", "best"], help="how runs rank by default")
    p.add_argument("--max-runs", type=int, help="random: the number of runs; grid: default its size")
    p.add_argument("--max-concurrent", type=int, help="at most this many of its runs at once (default 1)")
    p.add_argument("--early-stop", type=int, metavar="MIN_STEPS", help="the median rule, from this step on")
    p.add_argument("--seed", type=int)
    p.add_argument("--priority", type=int)
    p.add_argument("--name")
    p.set_defaults(func=cmd_create)
    p = sub.add_parser("show", parents=[common], help="the sweep's runs ranked by its metric")
    p.add_argument("sweep")
    p.add_argument("--summary", choices=["last", "best"], help="rank by this (default: the sweep's)")
    p.set_defaults(func=cmd_show)
    p = sub.add_parser("cancel", parents=[common], help="cancel every unfinished run of the sweep")
    p.add_argument("sweep")
    p.set_defaults(func=cmd_cancel)
