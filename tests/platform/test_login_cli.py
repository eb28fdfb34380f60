"""``rlp login`` against a live server, run as a user runs it (a subprocess with this checkout's client):
the username and password (prompted at a terminal, the password without echo; else two lines of stdin)
get a new token through ``POST /api/tokens/login``, and only the URL and that token are stored (0600);
a token can still be given (``--token-stdin``, ``RLP_TOKEN``; ``--token`` works but warns); a refusal is
one line, exit 3, nothing stored; the commands warn about a credentials file others may read and tighten
a config folder others may write to."""

from __future__ import annotations

import json
import os
import select
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accounts.models import ApiToken
from accounts.services import token_create
from tests.conftest import REPO_ROOT
from tests.factories import UserFactory
from tests.platform.test_throttles import rates  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "pw for tests, with spaces "  # kept whole: only the line end is taken off


@pytest.fixture
def site(live_server, tmp_path):
    user = UserFactory(username="alice")
    user.set_password(PASSWORD)
    user.save()
    return {"url": live_server.url, "user": user, "config": tmp_path / "cfg"}


def cli_env(site, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLP_")}
    return env | {"RLP_CONFIG_DIR": str(site["config"]), "PYTHONPATH": str(REPO_ROOT / "client"), **extra}


def rlp(site, *args: str, stdin: str = "", **env: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "rlp_client", *args], env=cli_env(site, **env), input=stdin,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def stored(site) -> dict[str, str]:
    path = site["config"] / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(site["config"].stat().st_mode) == 0o700
    return json.loads(path.read_text())


def one_line(stderr: str, prefix: str = "error: ") -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), stderr
    return lines[0]


def test_username_and_password_on_stdin_store_a_new_token_never_the_password(site):
    code, out, err = rlp(site, "login", site["url"], stdin=f"alice\n{PASSWORD}\n")
    assert code == 0 and err == "", err
    token = ApiToken.objects.get(user=site["user"])
    assert token.name == f"rlp login on {socket.gethostname()}"[:100]
    creds = stored(site)
    assert creds["url"] == site["url"] and set(creds) == {"url", "token"}
    assert PASSWORD.strip() not in (site["config"] / "credentials.json").read_text()
    assert out.strip() == (f"logged in to {site['url']} as alice (a new token {token.name!r} stored in "
                           f"{site['config'] / 'credentials.json'})")  # fmt: skip
    code, out, err = rlp(site, "run", "list", "--json")  # the stored login works, no environment
    assert (code, json.loads(out), err) == (0, [], "")

    code, out, err = rlp(site, "login", site["url"], "--username", "alice", "--token-name", "ci", "--json",
                         stdin=f"{PASSWORD}\n")  # fmt: skip
    assert code == 0, err
    answer = json.loads(out)
    assert ApiToken.objects.get(pk=answer["token_id"]).name == "ci"
    assert answer["username"] == "alice" and stored(site)["token"] != creds["token"]


def test_a_wrong_password_is_one_line_exit_3_and_nothing_is_stored(site):
    code, out, err = rlp(site, "login", site["url"], stdin="alice\nwrong\n")
    assert code == 3 and one_line(err) == "error: credentials refused: Wrong username or password."
    assert out == ""
    code, _, err = rlp(site, "login", site["url"], stdin=f"nobody\n{PASSWORD}\n")
    assert code == 3 and one_line(err) == "error: credentials refused: Wrong username or password."
    code, _, err = rlp(site, "login", site["url"], stdin="alice\n")  # no password line
    assert code == 2 and "password: empty" in one_line(err)
    assert not site["config"].exists() and not ApiToken.objects.exists()


def test_beyond_the_login_rate_the_cli_says_so_in_one_line(site, rates):  # noqa: F811
    rates(login="2/minute", login_address="100/minute")
    for _ in range(2):
        assert rlp(site, "login", site["url"], stdin="alice\nwrong\n")[0] == 3
    code, _, err = rlp(site, "login", site["url"], stdin=f"alice\n{PASSWORD}\n")
    assert code == 4 and "throttled" in one_line(err) and "HTTP 429" in err
    assert not site["config"].exists()


def test_a_token_from_stdin_or_the_environment_and_the_deprecated_flag_which_warns(site):
    secret = token_create(user=site["user"], name="given").secret
    code, out, err = rlp(site, "login", site["url"], "--token-stdin", stdin=f"{secret}\n")
    assert code == 0 and err == "" and stored(site)["token"] == secret
    assert "the token from stdin" in out
    (site["config"] / "credentials.json").unlink()
    code, out, err = rlp(site, "login", site["url"], RLP_TOKEN=secret)
    assert code == 0 and err == "" and stored(site)["token"] == secret
    code, out, err = rlp(
        site, "login", site["url"], "--username", "alice", stdin=f"{PASSWORD}\n", RLP_TOKEN=secret
    )
    assert code == 0 and "a new token" in out and stored(site)["token"] != secret  # --username: the password
    secret = stored(site)["token"]
    code, out, err = rlp(site, "login", site["url"], "--token", secret)
    assert code == 0 and stored(site)["token"] == secret
    assert "--token-stdin" in one_line(err, prefix="warning: --token ")

    code, out, err = rlp(site, "login", site["url"], "--token-stdin", stdin="rlp_wrong\n")
    assert code == 3 and "credentials refused" in one_line(err)
    assert stored(site)["token"] == secret  # the refused token replaced nothing
    assert ApiToken.objects.count() == 2  # given tokens are checked, made: only the password login's
    code, out, err = rlp(site, "run", "list", RLP_URL=site["url"], RLP_TOKEN="rlp_unknown")
    assert code == 3 and "credentials refused" in one_line(err)  # the environment wins over the file


def test_a_credentials_file_others_can_read_warns_and_an_open_folder_is_tightened(site):
    secret = token_create(user=site["user"], name="given").secret
    assert rlp(site, "login", site["url"], "--token-stdin", stdin=secret)[0] == 0
    path = site["config"] / "credentials.json"
    path.chmod(0o644)
    code, out, err = rlp(site, "run", "list", "--json")
    assert code == 0 and json.loads(out) == []
    assert one_line(err, "warning: ") == (f"warning: {path} is readable or writable by others (mode 0644): "
                                          f"run `chmod 600 {path}`, and revoke its token if someone may have "
                                          "read it")  # fmt: skip
    path.chmod(0o600)
    site["config"].chmod(0o777)
    code, out, err = rlp(site, "run", "list", "--json")
    assert code == 0 and json.loads(out) == []
    assert (
        one_line(err, "warning: ")
        == f"warning: {site['config']} was writable by others (mode 0777): changed to 0700"
    )
    assert stat.S_IMODE(site["config"].stat().st_mode) == 0o700
    assert rlp(site, "run", "list", "--json")[2] == ""  # said once: nothing left to say


def _read_until(fd: int, marker: bytes, seen: bytearray, deadline: float) -> None:
    while marker not in seen:
        assert time.monotonic() < deadline, f"no {marker!r} on the terminal: {bytes(seen)!r}"
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                chunk = b""
            assert chunk, f"the terminal closed before {marker!r}: {bytes(seen)!r}"
            seen += chunk


def test_at_a_terminal_it_prompts_and_the_password_is_not_echoed(site):
    """A pseudo-terminal as stdin and stderr (the prompts' stream); stdout stays the command's output."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rlp_client", "login", site["url"]], env=cli_env(site),
                            stdin=slave, stdout=subprocess.PIPE, stderr=slave, start_new_session=True)  # fmt: skip
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + 60
    try:
        _read_until(master, b"Username: ", seen, deadline)
        os.write(master, b"alice\n")
        _read_until(master, b"Password: ", seen, deadline)
        os.write(master, PASSWORD.encode() + b"\n")
        out, _ = proc.communicate(timeout=60)
        while select.select([master], [], [], 0.2)[0]:  # what is left on the terminal
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert proc.returncode == 0, (out, bytes(seen))
    assert b"alice" in seen  # the username is echoed as typed
    assert PASSWORD.strip().encode() not in seen + out  # the password is not
    assert out.decode().startswith(f"logged in to {site['url']} as alice")
    assert stored(site)["token"] and Path(site["config"] / "credentials.json").exists()
