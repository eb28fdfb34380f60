"""``rlp`` (also ``python -m rlp_client``): the platform from a shell, a script or CI.

Exit codes (every command):
  0  done (``run wait``/``run follow``/``run launch --follow``: the run succeeded)
  1  the run failed (wait/follow), or an unexpected error
  2  bad input: a usage error, a field the API refused (the line names it), an unreadable file;
     and for wait/follow: the run was cancelled
  3  credentials refused (unknown, revoked or expired token; a wrong username or password at login;
     not logged in)
  4  refused by the platform: not found, not allowed, conflicts with the run's state
  5  the platform is unreachable or failed (5xx)
Errors are one line on stderr, ``error: <field.path>: <message>``; ``--json`` prints machine-readable
output on stdout.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

from rlp_client import cli_run, cli_sweep
from rlp_client.cli_common import (
    EXIT_BAD_INPUT,
    CliError,
    Output,
    client_from_config,
    parse_id,
    run_cli,
    set_path,
    warn,
)
from rlp_client.client import Client, create_token
from rlp_client.config import save_credentials, secure_config_dir


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the argument, exit code 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{self.prog.split(' ', 1)[-1]}: {message}", EXIT_BAD_INPUT)


def _read_config(path: str) -> tuple[str, dict[str, Any] | None]:
    """The file's text, and its mapping when it parses (the server reports what does not)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"-f: cannot read {path}: {exc.strerror or exc}", EXIT_BAD_INPUT) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return text, None
    return text, data if isinstance(data, dict) else None


# --- commands ----------------------------------------------------------------------------------------


def _stdin_line(prompt: str | None = None) -> str | None:
    """One line of stdin without its line end; None at its end. ``prompt`` goes to stderr (stdout is the
    command's output) when stdin is a terminal."""
    if prompt and sys.stdin.isatty():
        print(prompt, end="", file=sys.stderr, flush=True)
    line = sys.stdin.readline()
    return line.rstrip("\r\n") if line else None


def _given_token(args: argparse.Namespace) -> tuple[str, str] | None:
    """(token, where it came from) when the user gives a token rather than a username and password."""
    if args.token is not None:
        warn("--token shows the token to every process list and shell history: use --token-stdin or "
             "RLP_TOKEN (--token will be removed)")  # fmt: skip
        return args.token.strip(), "--token"
    if args.token_stdin:
        token = getpass.getpass("API token: ") if sys.stdin.isatty() else _stdin_line()
        return (token or "").strip(), "stdin"
    if os.environ.get("RLP_TOKEN") and args.username is None:  # --username: log in with the password
        return os.environ["RLP_TOKEN"].strip(), "RLP_TOKEN"
    return None


def _username_password(args: argparse.Namespace) -> tuple[str, str]:
    """Prompted at a terminal (the password without echo); otherwise lines of stdin: the username (unless
    --username), then the password."""
    username = args.username if args.username is not None else _stdin_line("Username: ")
    if not (username or "").strip():
        raise CliError("username: empty (a token instead: --token-stdin)", EXIT_BAD_INPUT)
    password = getpass.getpass("Password: ") if sys.stdin.isatty() else _stdin_line()
    if not password:
        where = "" if sys.stdin.isatty() else " (stdin: the username's line, then the password's)"
        raise CliError(f"password: empty{where}", EXIT_BAD_INPUT)
    return username.strip(), password


def cmd_login(args: argparse.Namespace, out: Output) -> int:
    url = args.url.rstrip("/")
    folder = secure_config_dir()
    if folder:
        warn(folder)
    given = _given_token(args)
    if given is not None:
        token, source = given
        if not token:
            raise CliError(
                f"token: empty ({source}; create one under /tokens/ on the platform)", EXIT_BAD_INPUT
            )
        with Client(url, token) as client:
            username = client.me()["username"]  # AuthenticationFailed: exit 3, nothing stored
        token_id, what = None, f"the token from {source}"
    else:
        name = args.token_name or f"rlp login on {socket.gethostname()}"[:100]
        new = create_token(url, *_username_password(args), name=name)  # a refusal: exit 3, nothing stored
        token, username, token_id, what = new.secret, new.username or "", new.id, f"a new token {new.name!r}"
    path = save_credentials(url, token)
    out.result({"url": url, "username": username, "stored": str(path), "token_id": token_id},
               f"logged in to {url} as {username} ({what} stored in {path})")  # fmt: skip
    return 0


def cmd_presets(args: argparse.Namespace, out: Output) -> int:
    with client_from_config() as client:
        presets = client.presets()
    if args.name:
        if args.name not in presets:
            raise CliError(
                f"name: no preset {args.name!r} (known: {', '.join(sorted(presets))})", EXIT_BAD_INPUT
            )
        out.result(presets[args.name], yaml.safe_dump(presets[args.name], sort_keys=False).rstrip())
        return 0
    rows = [[name, str((cfg.get("trainer") or {}).get("total_steps", "")), (cfg.get("model") or {}).get("path", "")]
            for name, cfg in sorted(presets.items())]  # fmt: skip
    out.table(presets, ["preset", "steps", "model"], rows)
    return 0


def _millions(count: Any) -> str:
    return f"{count / 1e6:.1f}M" if isinstance(count, int) else "?"


def cmd_models(args: argparse.Namespace, out: Output) -> int:
    with client_from_config() as client:
        catalogue = client.models()
    rows = [[m["name"], _millions(m.get("parameters")), str(m.get("vocab_size") or "?"), str(m.get("head_dim") or "?"),
             "yes" if m.get("chat_template") else "no", ",".join(m.get("backends") or []), m["path"]]
            for m in catalogue["models"]]  # fmt: skip
    out.table(catalogue, ["model", "params", "vocab", "head_dim", "chat", "backends", "model.path"], rows)
    for missing in catalogue["not_fetched"]:
        out.say(f"not fetched: {missing['name']} (an operator runs: {missing['command']})")
    return 0


def _parameters(params: list[dict[str, Any]]) -> str:
    return ", ".join(p["name"] + (f"={p['default']!r}" if "default" in p else "") for p in params) or "-"


def cmd_rewards(args: argparse.Namespace, out: Output) -> int:
    with client_from_config() as client:
        catalogue = client.rewards()
    rows = [[r["name"], "built-in" if r.get("origin") == "builtin" else f"{r.get('package')} {r.get('version')}",
             _parameters(r.get("parameters") or []), r.get("error") or r.get("description") or ""]
            for r in catalogue["rewards"]]  # fmt: skip
    out.table(catalogue, ["reward", "from", "kwargs (default)", "description"], rows)
    for refused in catalogue.get("refused") or []:
        out.say(f"refused: {refused['name']} of {refused['package']} ({refused['reason']})")
    return 0


def cmd_tasks(args: argparse.Namespace, out: Output) -> int:
    with client_from_config() as client:
        catalogue = client.tasks()
    rows = [[t["name"], _parameters(t.get("parameters") or []), t.get("description") or ""]
            for t in catalogue["tasks"]]  # fmt: skip
    out.table(catalogue, ["task", "task_kwargs (default)", "description"], rows)
    return 0


def cmd_experiment_create(args: argparse.Namespace, out: Output) -> int:
    text, data = _read_config(args.file)
    if args.set:
        if data is None:
            raise CliError(f"-f: {args.file} is not a YAML mapping, cannot apply --set", EXIT_BAD_INPUT)
        for assignment in args.set:
            set_path(data, assignment)
        text = yaml.safe_dump(data, sort_keys=False)
    name = args.name or (Path(args.file).stem if args.file != "-" else "experiment")
    with client_from_config() as client:
        project = client.project(args.project)
        exp = client.import_experiment(project.id, name, text, description=args.description or "",
                                       tags=args.tag or [])  # fmt: skip
    out.result(exp.raw, f"experiment {exp.id} {exp.name!r} created in project {project.name!r}")
    return 0


def cmd_experiment_export(args: argparse.Namespace, out: Output) -> int:
    experiment_id = parse_id(args.experiment, "experiment")
    with client_from_config() as client:
        exp = client.experiment(experiment_id)
        text = client.experiment_yaml(exp.id)
    if args.output:
        Path(args.output).write_text(text)
    if out.json_mode:
        out.result({"id": exp.id, "name": exp.name, "project": exp.project, "config": exp.config,
                    "output": args.output})  # fmt: skip
    elif args.output:
        out.say(f"experiment {exp.id} written to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_experiment_list(args: argparse.Namespace, out: Output) -> int:
    with client_from_config() as client:
        project = client.project(args.project).id if args.project else None
        exps = list(client.experiments(project=project))
    rows = [[str(e.id), str(e.project), e.name, ",".join(e.tags)] for e in exps]
    out.table([e.raw for e in exps], ["id", "project", "name", "tags"], rows)
    return 0


def build_parser() -> Parser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    parser = Parser(prog="rlp", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                    parents=[common])  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser(
        "login",
        parents=[common],
        help="log in with your username and password (or a token): the URL and a new token are stored",
        description="Asks for your username and password (at a terminal; else reads them from two lines "
        "of stdin), and stores the platform's URL and a new API token for you in credentials.json "
        "(mode 0600), never the password. With a token instead (--token-stdin, or RLP_TOKEN set and no "
        "--username): the token is checked and stored.",
    )
    p.add_argument("url")
    p.add_argument("--username", help="default: prompted, or the first line of stdin")
    p.add_argument("--token-name", help="the new token's name (default: rlp login on <this host>)")
    given = p.add_mutually_exclusive_group()
    given.add_argument(
        "--token-stdin", action="store_true", help="store this token (prompted, or one line of stdin)"
    )
    given.add_argument("--token", help="deprecated (the token shows in process lists): --token-stdin")
    p.set_defaults(func=cmd_login)

    p = sub.add_parser("presets", parents=[common], help="the engine's presets (or one, as YAML)")
    p.add_argument("name", nargs="?")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("models", parents=[common], help="the models a config may name (model.path) here")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser(
        "rewards", parents=[common], help="the rewards a config may name (reward.name): built-ins and plugins"
    )
    p.set_defaults(func=cmd_rewards)

    p = sub.add_parser("tasks", parents=[common], help="the built-in tasks a config may name (data.task)")
    p.set_defaults(func=cmd_tasks)

    exp = sub.add_parser("experiment", help="create, export, list experiments").add_subparsers(
        dest="action", required=True, parser_class=Parser
    )
    p = exp.add_parser("create", parents=[common], help="from a YAML config file")
    p.add_argument("-f", "--file", required=True, help="the config as YAML (- for stdin)")
    p.add_argument("--project", required=True, help="project id or name")
    p.add_argument("--name", help="default: the file's name without extension")
    p.add_argument("--description")
    p.add_argument("--tag", action="append", help="repeatable")
    p.add_argument(
        "--set", action="append", metavar="KEY.PATH=VALUE", help="override a config value; repeatable"
    )
    p.set_defaults(func=cmd_experiment_create)
    p = exp.add_parser("export", parents=[common], help="the experiment's config as YAML")
    p.add_argument("experiment", help="experiment id")
    p.add_argument("-o", "--output", help="write to this file (default: stdout)")
    p.set_defaults(func=cmd_experiment_export)
    p = exp.add_parser("list", parents=[common])
    p.add_argument("--project", help="project id or name")
    p.set_defaults(func=cmd_experiment_list)

    cli_run.add_commands(
        sub.add_parser("run", help="launch, follow, wait for, cancel, resume runs"), common, Parser
    )
    cli_sweep.add_commands(  # sweeps
        sub.add_parser("sweep", help="create, show (ranked), cancel sweeps"), common, Parser
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script. Returns the exit code (``sys.exit(main())``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_cli(build_parser, argv)
