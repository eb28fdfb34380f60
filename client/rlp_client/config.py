"""Where the CLI keeps the platform's address and the user's token.

``RLP_URL`` and ``RLP_TOKEN`` win over the file; the file is ``credentials.json`` in the user's config
directory (``$XDG_CONFIG_HOME/rlp``, else ``~/.config/rlp``; ``%APPDATA%\\rlp`` on Windows,
``~/Library/Application Support/rlp`` on macOS; ``RLP_CONFIG_DIR`` overrides), written with mode 0600 in
a directory of mode 0700. It holds the URL and a token, never a password.

Permissions (POSIX): a config directory of the user's that others may write to is changed to 0700 when
the file is read or written (another user could otherwise replace the file, e.g. with their own
platform's URL, which would then receive ``RLP_TOKEN``; a shared folder such as /tmp is reported, never
changed), and a credentials file that others may read is reported; each as one line for the user to
see (``Credentials.notices``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlp_client.errors import ClientError

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH
OTHERS_ANY = stat.S_IRWXG | stat.S_IRWXO


class NotLoggedIn(ClientError):
    """Neither RLP_URL/RLP_TOKEN nor a stored login."""


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    source: str  # "environment" or the file's path
    notices: tuple[str, ...] = ()  # what the permission checks found or changed, one line each


def config_dir() -> Path:
    if os.environ.get("RLP_CONFIG_DIR"):
        return Path(os.environ["RLP_CONFIG_DIR"])
    if sys.platform == "win32" and os.environ.get("APPDATA"):
        return Path(os.environ["APPDATA"]) / "rlp"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "rlp"
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "rlp"


def credentials_path() -> Path:
    return config_dir() / "credentials.json"


def _stat(path: Path) -> os.stat_result | None:
    """``path``'s status; None where it does not exist or modes mean nothing (Windows)."""
    if os.name == "nt":
        return None
    try:
        return path.stat()
    except OSError:
        return None


def secure_config_dir() -> str | None:
    """Change the config directory into mode 0700 when others may write to it and it is the user's own
    (not a shared folder: one with the sticky bit, like /tmp, or another user's, is never changed; it is
    reported). The line that says what was done or found; None when there was nothing to say."""
    folder = config_dir()
    st = _stat(folder)
    if st is None or not st.st_mode & OTHERS_WRITE:
        return None
    mode = stat.S_IMODE(st.st_mode)
    shared = st.st_mode & stat.S_ISVTX or st.st_uid != os.geteuid()
    problem = "is a shared folder" if shared else ""
    if not shared:
        try:
            os.chmod(folder, 0o700)
        except OSError as exc:
            problem = f"cannot be changed ({exc.strerror})"
    if problem:
        return (f"{folder} is writable by others (mode {mode:04o}) and {problem}: another user could "
                "replace your credentials; set RLP_CONFIG_DIR to a folder of your own")  # fmt: skip
    return f"{folder} was writable by others (mode {mode:04o}): changed to 0700"


def credentials_file_notice() -> str | None:
    """A line when the credentials file is open to others (group or world bits set); None otherwise."""
    path = credentials_path()
    st = _stat(path)
    if st is None or not st.st_mode & OTHERS_ANY:
        return None
    mode = stat.S_IMODE(st.st_mode)
    return (f"{path} is readable or writable by others (mode {mode:04o}): run `chmod 600 {path}`, and "
            "revoke its token if someone may have read it")  # fmt: skip


def save_credentials(url: str, token: str) -> Path:
    """Write the file atomically with mode 0600 (never readable by others, not even for a moment), in a
    directory of mode 0700 (an existing one that others may write to is changed: see the module)."""
    folder = config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    secure_config_dir()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".credentials-")  # created 0600
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"url": url.rstrip("/"), "token": token}, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, credentials_path())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return credentials_path()


def load_credentials() -> Credentials:
    env_url, env_token = os.environ.get("RLP_URL"), os.environ.get("RLP_TOKEN")
    notices = tuple(line for line in (secure_config_dir(), credentials_file_notice()) if line)
    stored: dict[str, str] = {}
    path = credentials_path()
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
        except ValueError:
            raise NotLoggedIn(f"{path} is not valid JSON: run `rlp login URL` again") from None
    url = env_url or stored.get("url")
    token = env_token or stored.get("token")
    if not url or not token:
        raise NotLoggedIn("not logged in: run `rlp login URL`, or set RLP_URL and RLP_TOKEN")
    source = "environment" if env_url and env_token else str(path)
    return Credentials(url=url.rstrip("/"), token=token, source=source, notices=notices)
