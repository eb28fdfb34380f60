"""Where the CLI keeps the platform's address and the user's token.

``RLP_URL`` and ``RLP_TOKEN`` win over the file; the file is ``credentials.json`` in the user's config
directory (``$XDG_CONFIG_HOME/rlp``, else ``~/.config/rlp``; ``%APPDATA%\\rlp`` on Windows,
``~/Library/Application Support/rlp`` on macOS; ``RLP_CONFIG_DIR`` overrides), written with mode 0600 in
a directory of mode 0700.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rlp_client.errors import ClientError


class NotLoggedIn(ClientError):
    """Neither RLP_URL/RLP_TOKEN nor a stored login."""


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    source: str  # "environment" or the file's path


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


def save_credentials(url: str, token: str) -> Path:
    """Write the file atomically with mode 0600 (never readable by others, not even for a moment)."""
    folder = config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
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
    return Credentials(url=url.rstrip("/"), token=token, source=source)
