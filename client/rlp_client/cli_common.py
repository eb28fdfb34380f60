"""What every ``rlp`` command shares: output (human or ``--json``), exit codes, one-line errors."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from rlp_client.client import Client
from rlp_client.config import NotLoggedIn, load_credentials
from rlp_client.errors import (
    ApiError,
    AuthenticationFailed,
    BadRequest,
    ClientError,
    ConnectionFailed,
    PayloadTooLarge,
    ServerError,
    StreamRefused,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_AUTH = 3
EXIT_REFUSED = 4
EXIT_UNREACHABLE = 5
STATE_EXIT = {"succeeded": EXIT_OK, "failed": EXIT_FAILED, "cancelled": 2}


class CliError(Exception):
    """A one-line message and the exit code it ends the command with."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Output:
    """Human output (rich tables, lines) or ``--json`` (one JSON document, or JSON lines for streams)."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode

    def say(self, line: str) -> None:
        if not self.json_mode:
            print(line, flush=True)

    def result(self, data: Any, human: str | None = None) -> None:
        if self.json_mode:
            print(json.dumps(data, default=str), flush=True)
        elif human is not None:
            print(human, flush=True)

    def json_line(self, data: Any) -> None:
        print(json.dumps(data, default=str), flush=True)

    def table(self, data: Any, columns: list[str], rows: list[list[str]]) -> None:
        if self.json_mode:
            self.result(data)
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(box=None, pad_edge=False)
        for column in columns:  # a narrow terminal folds a long name or path rather than cutting it
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*row)
        # piped (not a terminal): no width to fit, so that names and paths come out whole for grep
        Console(width=None if sys.stdout.isatty() else 100_000).print(table)


def client_from_config() -> Client:
    """A client for ``RLP_URL``/``RLP_TOKEN`` or the stored login (what the permission checks of the
    config folder and the credentials file found: one warning line each on stderr)."""
    creds = load_credentials()
    for notice in creds.notices:
        warn(notice)
    return Client(creds.url, creds.token)


def warn(line: str) -> None:
    """One ``warning: ...`` line on stderr (the command goes on)."""
    print(f"warning: {' '.join(line.split())}", file=sys.stderr, flush=True)


def parse_id(raw: str, field: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise CliError(f"{field}: expected an id (a positive integer), got {raw!r}", EXIT_BAD_INPUT) from None
    if value < 1:
        raise CliError(f"{field}: expected an id (a positive integer), got {raw!r}", EXIT_BAD_INPUT)
    return value


def error_exit(exc: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an exception a command raised."""
    if isinstance(exc, CliError):
        return str(exc), exc.code
    if isinstance(exc, (BadRequest, PayloadTooLarge)):
        return exc.one_line(), EXIT_BAD_INPUT
    if isinstance(exc, AuthenticationFailed):
        return f"credentials refused: {exc.detail or 'invalid token'}", EXIT_AUTH
    if isinstance(exc, StreamRefused):
        return str(exc), EXIT_AUTH if exc.code == 4401 else EXIT_REFUSED
    if isinstance(exc, NotLoggedIn):
        return str(exc), EXIT_AUTH
    if isinstance(exc, ServerError):
        return f"the platform failed: HTTP {exc.status} {exc.detail}".rstrip(), EXIT_UNREACHABLE
    if isinstance(exc, ApiError):
        return f"{exc.one_line()} (HTTP {exc.status})", EXIT_REFUSED
    if isinstance(exc, ConnectionFailed):
        return f"cannot reach the platform: {exc}", EXIT_UNREACHABLE
    if isinstance(exc, ClientError):
        return str(exc), EXIT_FAILED
    return f"unexpected error: {type(exc).__name__}: {exc}", EXIT_FAILED


def run_cli(build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str]) -> int:
    """Parse, run the command, and turn any error into one line on stderr and its exit code."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args, Output(getattr(args, "json", False))))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as exc:
        line, code = error_exit(exc)
        print(f"error: {' '.join(line.split())}", file=sys.stderr, flush=True)
        return code


def read_yaml_mapping(path: str, what: str) -> dict[str, Any]:
    """The YAML mapping in file ``path`` (``-``: stdin) for ``-f``; ``what`` names what it maps, for the
    one-line error when it cannot be read, is not YAML or is not a mapping. An empty file is ``{}``."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise CliError(f"-f: cannot read {path}: {exc.strerror or exc}", EXIT_BAD_INPUT) from None
    try:
        loaded = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        raise CliError(f"-f: {path} is not valid YAML", EXIT_BAD_INPUT) from None
    if not isinstance(loaded, dict):
        raise CliError(f"-f: {path} is not a YAML mapping of {what}", EXIT_BAD_INPUT)
    return loaded


def set_path(config: dict[str, Any], assignment: str) -> None:
    """``a.b.c=value``: the value parsed as YAML (``3`` an int, ``true`` a bool, ``x`` a string)."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path or any(not part for part in path.split(".")):
        raise CliError(f"--set: expected KEY.PATH=VALUE, got {assignment!r}", EXIT_BAD_INPUT)
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    node = config
    parts = path.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise CliError(f"--set {path}: {'.'.join(parts[: i + 1])} is not a mapping", EXIT_BAD_INPUT)
        node = child
    node[parts[-1]] = value
