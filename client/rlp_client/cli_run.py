"""``rlp run ...``: launch, follow (a live progress bar), wait, cancel, resume, fork, metrics, list, show."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from typing import Any

from rlp_client.cli_common import (
    EXIT_BAD_INPUT,
    STATE_EXIT,
    CliError,
    Output,
    client_from_config,
    parse_id,
    read_yaml_mapping,
    set_path,
)
from rlp_client.models import ACTIVE_STATES, FINAL_STATES, Event, MetricPoint, RunInfo
from rlp_client.runs import Run

REWARD_KEYS = ("reward/mean", "reward", "critic/score/mean")  # the first one a run logs is shown
STATES = sorted(ACTIVE_STATES | FINAL_STATES)


def _run_row(info: RunInfo) -> list[str]:
    return [str(info.id), str(info.project), f"{info.experiment_name} #{info.number}", info.state,
            str(info.priority), info.created_at or ""]  # fmt: skip


def _show(run: Run, out: Output, verb: str) -> None:
    out.result(
        run.info.raw, f"run {run.id} ({run.info.experiment_name} #{run.info.number}) {verb}: {run.state}"
    )


def follow(run: Run, out: Output, last_seq: int = 0) -> int:
    """Follow ``run`` to its end: JSON lines with ``--json``, else a rich progress bar (steps, latest
    reward, state) with log lines printed above it. Returns the exit code of the final state."""
    stream = run.follow(last_seq=last_seq)
    if out.json_mode:
        for item in stream:
            if isinstance(item, MetricPoint):
                out.json_line({"type": "metric", "key": item.key, "step": item.step, "value": item.value,
                               "wall_time": item.wall_time})  # fmt: skip
            else:
                out.json_line({"type": "event", "seq": item.seq, "kind": item.kind, "message": item.message,
                               "data": item.data, "created": item.created})  # fmt: skip
        out.json_line({"type": "end", "run": run.id, "state": stream.state.state,
                       "reconnects": stream.state.reconnects})  # fmt: skip
        return STATE_EXIT.get(stream.state.state, 1)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    progress = Progress(
        TextColumn("run {task.fields[run]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[reward]}"),
        TextColumn("[bold]{task.fields[state]}"),
        TimeElapsedColumn(),
        console=console,
    )
    reward_key: str | None = None
    with progress:
        task = progress.add_task("", total=None, run=run.id, reward="", state=run.state)
        for item in stream:
            fields: dict[str, Any] = {"state": stream.state.state}
            if stream.state.total_steps:
                fields["total"] = stream.state.total_steps
            if isinstance(item, MetricPoint):
                # Training steps are numbered from 1 (step 0: before training): step n is n steps done.
                fields["completed"] = stream.state.latest_step or 0
                if reward_key is None and item.key in REWARD_KEYS:
                    reward_key = item.key
                if item.key == reward_key:
                    fields["reward"] = f"{reward_key} {item.value:.4g}"
            elif isinstance(item, Event):
                progress.console.print(_event_line(item), markup=False, highlight=False, soft_wrap=True)
            progress.update(task, **fields)
        progress.update(task, state=stream.state.state)  # the bar's last frame shows the final state
    state = stream.state.state
    print(f"run {run.id} {state}", flush=True)
    return STATE_EXIT.get(state, 1)


def _event_line(event: Event) -> str:
    if event.kind == "log":
        return event.message
    return f"[{event.kind}] {event.message}"


# --- commands ----------------------------------------------------------------------------------------


def cmd_launch(args: argparse.Namespace, out: Output) -> int:
    experiment = parse_id(args.experiment, "experiment")
    with client_from_config() as client:
        run = client.launch(experiment, priority=args.priority)
        if not args.follow:
            _show(run, out, "launched")
            return 0
        if not out.json_mode:
            out.say(f"run {run.id} launched")
        return follow(run, out)


def cmd_follow(args: argparse.Namespace, out: Output) -> int:
    run_id = parse_id(args.run, "run")
    with client_from_config() as client:
        return follow(client.run(run_id), out, last_seq=args.after)


def cmd_wait(args: argparse.Namespace, out: Output) -> int:
    run_id = parse_id(args.run, "run")
    with client_from_config() as client:
        run = client.run(run_id)
        try:
            state = run.wait(timeout_s=args.timeout, poll_s=args.poll)
        except TimeoutError as exc:
            raise CliError(str(exc), 1) from None
    _show(run, out, "finished")
    return STATE_EXIT.get(state, 1)


def cmd_cancel(args: argparse.Namespace, out: Output) -> int:
    run_id = parse_id(args.run, "run")
    with client_from_config() as client:
        run = client.run(run_id).cancel()
    _show(run, out, "cancel requested")
    return 0


def cmd_resume(args: argparse.Namespace, out: Output) -> int:
    run_id = parse_id(args.run, "run")
    with client_from_config() as client:
        new = client.run(run_id).resume(priority=args.priority)
        if args.follow:
            if not out.json_mode:
                out.say(f"run {new.id} launched (resumes run {args.run})")
            return follow(new, out)
    _show(new, out, f"launched (resumes run {args.run})")
    return 0


def cmd_fork(args: argparse.Namespace, out: Output) -> int:
    run_id = parse_id(args.run, "run")
    checkpoint = parse_id(args.checkpoint, "--checkpoint") if args.checkpoint is not None else None
    overrides: dict[str, Any] = {}
    if args.file:
        overrides = read_yaml_mapping(args.file, "config overrides")
    for assignment in args.set or []:
        set_path(overrides, assignment)
    with client_from_config() as client:
        new = client.run(run_id).fork(
            checkpoint=checkpoint, config_overrides=overrides, priority=args.priority
        )
        if args.follow:
            if not out.json_mode:
                out.say(f"run {new.id} launched (forks run {args.run})")
            return follow(new, out)
    _show(new, out, f"launched (forks run {args.run})")
    return 0


def cmd_metrics(args: argparse.Namespace, out: Output) -> int:
    keys = [k for k in (args.keys or "").split(",") if k] or None
    run_id = parse_id(args.run, "run")
    with client_from_config() as client:
        run = client.run(run_id)
        if args.format == "csv" and not out.json_mode:
            sys.stdout.write(run.metrics_csv(keys))
            return 0
        points = run.metric_points(keys)
    if args.format == "csv":  # --json with csv: the CSV as a JSON string
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["key", "step", "value", "wall_time"])
        writer.writerows([p.key, p.step, repr(p.value), repr(p.wall_time)] for p in points)
        print(json.dumps({"run": run.id, "csv": buf.getvalue()}))
        return 0
    print(json.dumps({"run": run.id, "points": [
        {"key": p.key, "step": p.step, "value": p.value, "wall_time": p.wall_time} for p in points]}))  # fmt: skip
    return 0


def cmd_list(args: argparse.Namespace, out: Output) -> int:
    states = [s for s in (args.state or "").split(",") if s] or None
    for s in states or ():
        if s not in STATES:
            raise CliError(f"--state: unknown state {s!r} (one of {', '.join(STATES)})", EXIT_BAD_INPUT)
    experiment = parse_id(args.experiment, "experiment") if args.experiment else None
    with client_from_config() as client:
        project = client.project(args.project).id if args.project else None
        runs = list(client.runs(states=states, project=project, experiment=experiment))
    out.table([r.info.raw for r in runs], ["id", "project", "experiment", "state", "priority", "created"],
              [_run_row(r.info) for r in runs])  # fmt: skip
    return 0


def cmd_show(args: argparse.Namespace, out: Output) -> int:
    run_id = parse_id(args.run, "run")
    with client_from_config() as client:
        run = client.run(run_id)
    if out.json_mode:
        out.result(run.info.raw)
        return 0
    info = run.info
    out.say(f"run {info.id}: {info.experiment_name} #{info.number} (experiment {info.experiment}, project "
            f"{info.project})\nstate: {info.state}{' - ' + info.error if info.error else ''}\npriority: "
            f"{info.priority}\ncreated: {info.created_at}\nstarted: {info.started_at}\nfinished: {info.finished_at}")  # fmt: skip
    return 0


def add_commands(
    run_parser: argparse.ArgumentParser, common: argparse.ArgumentParser, parser_class: type
) -> None:
    sub = run_parser.add_subparsers(dest="action", required=True, parser_class=parser_class)

    p = sub.add_parser("launch", parents=[common], help="launch a run of an experiment")
    p.add_argument("experiment", help="experiment id")
    p.add_argument("--priority", type=int, help="higher starts first (-1000..1000)")
    p.add_argument(
        "--follow", action="store_true", help="then follow it to its end (exit code as `run wait`)"
    )
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("follow", parents=[common], help="live progress, log lines, to the end")
    p.add_argument("run")
    p.add_argument("--after", type=int, default=0, metavar="SEQ", help="skip the events up to this seq")
    p.set_defaults(func=cmd_follow)

    p = sub.add_parser("wait", parents=[common], help="until final; exit 0 succeeded, 1 failed, 2 cancelled")
    p.add_argument("run")
    p.add_argument("--timeout", type=float, help="seconds (then exit 1)")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between two checks")
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser("cancel", parents=[common])
    p.add_argument("run")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("resume", parents=[common], help="a new run from this run's latest checkpoint")
    p.add_argument("run")
    p.add_argument("--priority", type=int)
    p.add_argument("--follow", action="store_true")
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser(
        "fork", parents=[common], help="a new run from one of this run's checkpoints with a changed config"
    )
    p.add_argument("run")
    p.add_argument("--checkpoint", metavar="ID", help="a checkpoint id of the run (default: its latest)")
    p.add_argument(
        "-f", "--file", help="a YAML file of config overrides, nested like the config ('-': stdin)"
    )
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="one override (repeatable)")
    p.add_argument("--priority", type=int)
    p.add_argument("--follow", action="store_true")
    p.set_defaults(func=cmd_fork)

    p = sub.add_parser("metrics", parents=[common], help="every stored point, as CSV or JSON")
    p.add_argument("run")
    p.add_argument("--keys", help="comma-separated (default: every key)")
    p.add_argument("--format", choices=["csv", "json"], default="csv")
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("list", parents=[common])
    p.add_argument("--state", help=f"comma-separated, among {', '.join(STATES)}")
    p.add_argument("--project", help="project id or name")
    p.add_argument("--experiment", help="experiment id")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("show", parents=[common])
    p.add_argument("run")
    p.set_defaults(func=cmd_show)
