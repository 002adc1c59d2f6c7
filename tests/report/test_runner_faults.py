"""The runner under faults: a signal to the report process, a full disk, two runs into one folder, an
empty --only; and the atomic notebook writer papermill really uses. Previous results stay intact."""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from workbench.cli import main
from workbench.commands import report
from workbench.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"


def run_cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    return report.run(p.parse_args(["--notebooks", str(FIXTURES), "--quiet", *argv]))


def _old_results(out: Path, name: str) -> dict[str, bytes]:
    """Stand-ins for a previous run's files (what must survive an interrupted or failed re-run)."""
    files = {f"{name}.html": b"<p>old html</p>", f"{name}.ipynb": b'{"old": true}',
             f"logs/{name}.log": b"old log\n", "index.html": b"<p>old index: ok</p>"}
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    return files


def _intact(out: Path, files: dict[str, bytes]) -> bool:
    hidden = [p.name for p in out.rglob(".*") if p.name != ".report.lock"]
    return all((out / rel).read_bytes() == data for rel, data in files.items()) and not hidden


def test_papermill_saves_through_the_atomic_writer(tmp_path, monkeypatch):
    """papermill picks the last 'local' handler: ours must replace the stock one, and a save cut short
    (a kill between write and rename) must leave the previous notebook whole."""
    from papermill.iorw import papermill_io

    from workbench.report.execute import _atomic_local_writes
    _atomic_local_writes()
    nb = tmp_path / "out.ipynb"
    nb.write_text('{"cells": ["old"]}')

    def killed(fd):
        raise KeyboardInterrupt                       # a kill after the bytes are written, before the rename
    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        papermill_io.write('{"cells": ["new, cut short"]}', str(nb))
    assert nb.read_text() == '{"cells": ["old"]}' and [p.name for p in tmp_path.iterdir()] == ["out.ipynb"]
    monkeypatch.undo()
    papermill_io.write('{"cells": ["new"]}', str(nb))
    assert nb.read_text() == '{"cells": ["new"]}'


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_report_ends_its_child_and_kernel_and_keeps_the_old_results(tmp_path, sig):
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    old = _old_results(out, "hangs")
    pid_file = tmp_path / "kernel.pid"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "report", "--notebooks", str(FIXTURES), "--out", str(out),
         "--quiet", "--only", "hangs", "--cell-timeout", "300", "--wall-timeout", "300",
         "--param", f"pid_file={json.dumps(str(pid_file))}"],
        cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() - t0 < 120:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        kernel = int(pid_file.read_text())
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(sig)                          # the report's pid only, not its group
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert rc == 128 + sig and err.count("\n") == 1 and signal.Signals(sig).name in err, err
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive and kernel in {p.pid for p in children}
    time.sleep(2)                                      # nothing left to rewrite the notebook or the log later
    assert _intact(out, old) and list(tmp.iterdir()) == []


def test_a_full_disk_keeps_the_previous_report(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    old = _old_results(out, "ok")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("workbench.report.runner.render_html", full)
    argv = ["report", "--notebooks", str(FIXTURES), "--out", str(out), "--quiet", "--only", "ok"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err, err
    assert _intact(out, old)


def test_a_second_report_into_the_same_folder_is_refused(tmp_path):
    tmp_path.joinpath(".report.lock").touch()
    fd = os.open(tmp_path / ".report.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # what a running report holds
        with pytest.raises(InputError, match="another report is running into"):
            run_cli("--out", str(tmp_path), "--only", "ok")
    finally:
        os.close(fd)
    assert not (tmp_path / "index.html").exists()


@pytest.mark.parametrize("only", ["", ",", " , "])
def test_an_empty_only_is_refused(tmp_path, only):
    with pytest.raises(InputError, match="--only names no notebook"):
        run_cli("--out", str(tmp_path), "--only", only)
    assert not (tmp_path / "index.html").exists()


def test_a_killed_report_takes_its_child_and_kernel_along(tmp_path):
    """SIGKILL runs no cleanup in the runner; the orphaned child ends itself and the kernel."""
    pid_file, tmp = tmp_path / "kernel.pid", tmp_path / "tmp"
    tmp.mkdir()
    children: list[psutil.Process] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "report", "--notebooks", str(FIXTURES), "--out",
         str(tmp_path / "o"), "--quiet", "--only", "hangs", "--cell-timeout", "300", "--wall-timeout", "300",
         "--param", f"pid_file={json.dumps(str(pid_file))}"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}, stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() - t0 < 120:
            assert proc.poll() is None
            time.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert int(pid_file.read_text()) in {p.pid for p in children}
        proc.kill()
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(children, timeout=20)
    finally:
        proc.kill()
        for p in children:                             # never leave a kernel behind, even when failing
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    assert not alive
    time.sleep(1)
    assert list(tmp.iterdir()) == []                   # spec folder and kernel connection file
    assert [p.name for p in (tmp_path / "o").iterdir() if p.name.endswith(".run")] == []
