"""Atomic writes under faults: a full disk, a signal mid-write, a destination that is not a file."""

import errno
import os

import pytest

from workbench import fileio
from workbench.fileio import atomic_path, check_destination, write_bytes_atomic


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_full_disk_keeps_the_old_file_names_the_path_and_leaves_no_temp(tmp_path, monkeypatch):
    dest = tmp_path / "result.json"
    dest.write_text("old")
    monkeypatch.setattr(fileio.os, "fsync", _enospc)          # the write reaches the disk at fsync
    with pytest.raises(OSError) as e:
        write_bytes_atomic(dest, b"new")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(dest)
    assert dest.read_text() == "old" and _leftovers(tmp_path) == []


def test_atomic_path_removes_its_temp_on_any_exception(tmp_path):
    dest = tmp_path / "ckpt.pt"
    dest.write_bytes(b"old")
    for exc in (OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()):
        with pytest.raises(type(exc)), atomic_path(dest) as tmp:
            tmp.write_bytes(b"half")
            raise exc
        assert dest.read_bytes() == b"old" and _leftovers(tmp_path) == []


def test_temp_names_are_unique_per_call(tmp_path):
    names = {fileio.temp_name(tmp_path / "x.pt") for _ in range(50)}
    assert len(names) == 50 and all(n.parent == tmp_path and n.name.startswith(".x.pt.") for n in names)


def test_a_fifo_destination_is_refused_not_replaced(tmp_path):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    for write in (lambda: write_bytes_atomic(fifo, b"x"), lambda: atomic_path(fifo).__enter__(),
                  lambda: check_destination(fifo)):
        with pytest.raises(OSError, match="not a regular file") as e:
            write()
        assert e.value.filename == str(fifo)
    assert fifo.is_fifo() and _leftovers(tmp_path) == []
