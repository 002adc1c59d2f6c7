"""Resource bounds: hostile files load in a subprocess under RLIMIT_AS (1 GiB) and a wall-clock limit,
and fail with the typed error, never MemoryError or a hang."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .kdtr_corpus import RawBundle

resource = pytest.importorskip("resource")

_CHILD = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from workbench.bundle import BundleFormatError, read_bundle, read_bundle_bytes
out = {}
for path in sys.argv[1:]:
    for how in ("file", "bytes"):
        try:
            read_bundle(path) if how == "file" else read_bundle_bytes(open(path, "rb").read())
            out[path + how] = "loaded"
        except BundleFormatError as e:
            out[path + how] = e.reason
        except BaseException as e:
            out[path + how] = "CRASH " + type(e).__name__
print(json.dumps(out))
"""


def _hostile(raw: RawBundle) -> dict[str, bytes]:
    huge_tensor = raw.copy()
    e = huge_tensor.entry("a")
    e.dims, e.nbytes = [2**31 - 1, 2**30], (2**31 - 1) * 2**32          # 2^63 - 2^32 bytes declared
    huge_data = raw.copy()
    huge_data.data_nbytes = 2**62
    return {
        "count": RawBundle([], b"", count=2**63).encode(),
        "config": RawBundle([], b"", config_nbytes=2**63 - 64).encode(),
        "data": huge_data.encode(),
        "header": RawBundle([], b"", header_bytes=2**64 - 64).encode(),
        "tensor": huge_tensor.encode(),
        "deep": RawBundle([], b"[" * 500000 + b"]" * 500000).encode(),
    }


def test_hostile_sizes_under_rlimit_as(tmp_path, raw):
    paths = []
    for name, data in _hostile(raw).items():
        paths.append(tmp_path / f"{name}.kdtr")
        paths[-1].write_bytes(data)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-c", _CHILD, *map(str, paths)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    want = {"count": "too_many_tensors", "config": "config_too_large", "data": "truncated",
            "header": "header_too_large", "tensor": "out_of_bounds", "deep": "json_too_deep"}
    for name, reason in want.items():
        for how in ("file", "bytes"):
            assert got[str(tmp_path / f"{name}.kdtr") + how] == reason, (name, how, got)
