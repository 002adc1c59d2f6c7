"""The atomic writer: failures at any point leave the old file byte-identical and no temp file;
permissions carry over; re-saving onto a file that a live Bundle has memory-mapped is safe."""

import errno
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.bundle import BundleFormatError, read_bundle, write_bundle
from workbench.bundle import writer as writer_mod
from workbench.config import preset

from .kdtr_corpus import small_inputs


@pytest.fixture
def old(tmp_path):
    p = tmp_path / "b.kdtr"
    write_bundle(p, **small_inputs())
    os.chmod(p, 0o640)
    return p, p.read_bytes()


def _new_inputs():
    inp = small_inputs()
    inp["tensors"] = dict(inp["tensors"], big=np.ones((64, 64), np.float32))
    return inp


def _assert_untouched(p, before):
    assert p.read_bytes() == before
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640
    assert sorted(os.listdir(p.parent)) == [p.name], os.listdir(p.parent)


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt(),
                                 RuntimeError("boom")])
def test_failure_mid_write_keeps_old_file(old, monkeypatch, exc):
    p, before = old

    def half_then_fail(f, chunks):
        for i, chunk in enumerate(chunks):
            f.write(chunk)
            if i == 5:
                f.flush()
                raise exc
    monkeypatch.setattr(writer_mod, "_write_chunks", half_then_fail)
    with pytest.raises(type(exc)):
        write_bundle(p, **_new_inputs())
    _assert_untouched(p, before)


@pytest.mark.parametrize("target", ["fsync", "replace"])
def test_failure_at_fsync_or_rename_keeps_old_file(old, monkeypatch, target):
    p, before = old

    def fail(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, target, fail)
    with pytest.raises(KeyboardInterrupt):
        write_bundle(p, **_new_inputs())
    monkeypatch.undo()
    _assert_untouched(p, before)


def test_bad_input_keeps_old_file(old):
    p, before = old
    with pytest.raises(BundleFormatError):
        write_bundle(p, **dict(_new_inputs(), golden=[9999, 1, 2, 3]))
    _assert_untouched(p, before)


def test_permissions_preserved_and_new_file_follows_umask(old, tmp_path):
    p, _ = old
    write_bundle(p, **_new_inputs())
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o640 and "big" in read_bundle(p).tensors
    umask = os.umask(0o027)
    try:
        write_bundle(tmp_path / "fresh.kdtr", **small_inputs())
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "fresh.kdtr").st_mode) == 0o640


def test_resave_onto_a_mapped_file(old):
    p, before = old
    b = read_bundle(p)
    a_before = np.array(b.tensors["a"])
    # save(load(p), p): the source arrays are memory-mapped from the destination itself
    write_bundle(p, config=b.config, tensors=b.tensors, prompt=b.prompt, golden=b.golden,
                 margins=b.margins, meta=b.meta)
    assert p.read_bytes() == before
    write_bundle(p, **dict(_new_inputs(), tensors={"a": np.zeros((3, 5), np.float32)}))
    np.testing.assert_array_equal(b.tensors["a"], a_before)        # the old mapping still reads old data
    b.verify()
    assert not read_bundle(p).tensors["a"].any()
    assert sorted(os.listdir(p.parent)) == [p.name]


_KILLED_WRITER = r"""
import sys
import numpy as np
from workbench.bundle import write_bundle
from workbench.config import preset
path, i = sys.argv[1], 0
print("ready", flush=True)
while True:                       # rewrite the same path until killed
    i += 1
    write_bundle(path, config=preset("tiny"), tensors={"w": np.full((1024, 1024), i, np.float32)},
                 meta={"i": i})
"""


def test_kill_9_mid_write_never_damages_the_destination(tmp_path):
    p = tmp_path / "k.kdtr"
    write_bundle(p, config=preset("tiny"), tensors={"w": np.zeros((1024, 1024), np.float32)}, meta={"i": 0})
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), OPENBLAS_NUM_THREADS="1")
    rng = np.random.default_rng(3)
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(p)], stdout=subprocess.PIPE,
                                 env=env)
        child.stdout.readline()
        time.sleep(float(rng.uniform(0.05, 0.3)))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        b = read_bundle(p)                                   # old or new, never damaged
        assert (b.tensors["w"] == b.meta["i"]).all()
    strays = [n for n in os.listdir(tmp_path) if n != p.name]
    assert all(n.startswith(".k.kdtr.") and n.endswith(".tmp") for n in strays), strays
