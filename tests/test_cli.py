"""The CLI front end: output-path checks and one-line errors for paths the OS refuses."""

import pytest

from workbench.cli import UserError, check_out_file, main


def test_check_out_file(tmp_path):
    check_out_file(tmp_path / "new.kdtr")                       # fresh file in an existing folder
    (tmp_path / "old.kdtr").write_bytes(b"x")
    check_out_file(tmp_path / "old.kdtr")                       # replacing a file is allowed
    with pytest.raises(UserError, match="is a directory"):
        check_out_file(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        check_out_file(tmp_path / "missing" / "x.kdtr")


def test_os_error_on_a_user_path_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    assert main(["build-refs", "--out", str(blocker), "--only", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(blocker) in err, err
    assert blocker.read_bytes() == b"x"
