"""``-f FILE`` of ``rlp run fork`` and ``rlp sweep create``: a file that cannot be read, is not YAML or is
not a mapping is a one-line error with exit code 2, before any request (no server is running here)."""

from __future__ import annotations

import pytest

from rlp_client.cli import main


@pytest.mark.parametrize("command", [["run", "fork", "7"], ["sweep", "create", "3"]])
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("trainer: [1\n", "is not valid YAML"),
        ("- 1\n- 2\n", "is not a YAML mapping of"),
    ],
)
def test_a_bad_file_is_one_line_exit_2(command, content, message, tmp_path, capsys):
    path = tmp_path / "f.yaml"
    if content is not None:
        path.write_text(content)
    code = main([*command, "-f", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: -f: ") and message in err and err.count("\n") == 1, err
    assert "Traceback" not in err
