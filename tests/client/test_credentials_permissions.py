"""The permission rules of the CLI's credentials (``rlp_client.config``): the file is written 0600 in a
folder of mode 0700; an existing config folder of the user's that others may write to is changed to 0700
(a shared one, such as a sticky /tmp-like folder, is reported and left alone); a credentials file that
others may read or write is reported. Each rule is checked for every mode against the mode's ``ls -l``
spelling (``stat.filemode``), not against the masks the code uses."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from rlp_client import Client
from rlp_client.config import (
    credentials_file_notice,
    load_credentials,
    save_credentials,
    secure_config_dir,
)

pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
ALL_MODES = range(0o1000)


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "rlp"
    monkeypatch.setenv("RLP_CONFIG_DIR", str(path))
    for name in ("RLP_URL", "RLP_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return path


def _others_may_write(mode: int) -> bool:
    spelled = stat.filemode(stat.S_IFDIR | mode)  # e.g. "drwxrwxr-x": group at 4..6, others at 7..9
    return spelled[5] == "w" or spelled[8] == "w"


def test_the_file_is_0600_in_a_0700_folder_whatever_the_umask(folder):
    old = os.umask(0)
    try:
        path = save_credentials("http://platform.invalid/", "rlp_secret")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": "http://platform.invalid", "token": "rlp_secret"}
    assert [p.name for p in folder.iterdir()] == ["credentials.json"]  # no temporary file left


def test_a_folder_of_the_users_is_tightened_exactly_when_others_may_write_to_it(folder):
    folder.mkdir()
    for mode in ALL_MODES:
        folder.chmod(mode)
        notice = secure_config_dir()
        after = stat.S_IMODE(folder.stat().st_mode)
        if _others_may_write(mode):
            assert after == 0o700, oct(mode)
            assert notice == f"{folder} was writable by others (mode {mode:04o}): changed to 0700"
        else:
            assert (after, notice) == (mode, None), oct(mode)
    folder.chmod(0o700)


def test_saving_into_an_open_folder_tightens_it(folder):
    folder.mkdir()
    folder.chmod(0o777)
    save_credentials("http://platform.invalid", "rlp_secret")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_shared_sticky_folder_is_reported_and_never_changed(folder):
    folder.mkdir()
    folder.chmod(0o1777)  # like /tmp: everyone's
    notice = secure_config_dir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777
    assert notice is not None and "is a shared folder" in notice and "RLP_CONFIG_DIR" in notice
    folder.chmod(0o700)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown needs root")
def test_another_users_open_folder_is_reported_and_never_changed(folder):
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    folder.chmod(0o777)
    notice = secure_config_dir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 and "is a shared folder" in (notice or "")


def test_a_credentials_file_is_reported_exactly_when_others_have_any_access(folder):
    path = save_credentials("http://platform.invalid", "rlp_secret")
    for mode in ALL_MODES:
        path.chmod(mode)
        notice = credentials_file_notice()
        open_to_others = stat.filemode(stat.S_IFREG | mode)[4:] != "------"
        assert (notice is not None) == open_to_others, oct(mode)
        if notice:
            assert notice.startswith(f"{path} is readable or writable by others (mode {mode:04o})")
            assert "\n" not in notice
    path.chmod(0o600)


def test_loading_reports_both_and_the_library_warns(folder):
    path = save_credentials("http://platform.invalid", "rlp_secret")
    assert load_credentials().notices == ()
    path.chmod(0o640)
    folder.chmod(0o757)
    creds = load_credentials()
    assert (creds.url, creds.token) == ("http://platform.invalid", "rlp_secret")
    assert [n.split(" ", 1)[1] for n in creds.notices] == [
        "was writable by others (mode 0757): changed to 0700",
        "is readable or writable by others (mode 0640): run `chmod 600 "
        f"{path}`, and revoke its token if someone may have read it",
    ]
    path.chmod(0o644)
    with pytest.warns(UserWarning, match="readable or writable by others"):
        Client.from_env().close()
