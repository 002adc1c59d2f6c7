"""The corpus manifest: reproduced by the selection rule, read from installed packages or wheels, and
any changed file is refused with one line naming it."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from workbench.errors import InputError
from workbench.train import corpus
from workbench.train.corpus import (
    HELDOUT_EVERY,
    Source,
    load_manifest,
    read_corpus,
    select_files,
    sha256,
    split_of,
)

ROOT = Path(__file__).resolve().parents[2]


def _wheel(folder, name="kdtoy", version="1.0", files=None):
    files = files or {"kdtoy/a.py": "def a():\n    return 1\n" * 20, "kdtoy/b.py": "x = 2\n" * 60,
                      "kdtoy/tiny.py": "y = 1\n", "kdtoy/data.txt": "not python\n" * 50}
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return path


def test_committed_manifest_is_what_the_rule_selects():
    committed, sha = load_manifest()
    assert select_files() == committed
    assert len(sha) == 64 and len(committed["files"]) > 1000
    assert set(committed["packages"]) == set(corpus.PACKAGES)
    held = [f for f in committed["files"] if f["split"] == "heldout"]
    assert 0.5 / HELDOUT_EVERY < len(held) / len(committed["files"]) < 2.0 / HELDOUT_EVERY


def test_wheel_source_selection_and_a_changed_file_is_refused(tmp_path):
    _wheel(tmp_path)
    m = select_files(tmp_path, packages={"kdtoy": "1.0"})
    assert [f["path"] for f in m["files"]] == ["kdtoy/a.py", "kdtoy/b.py"]     # tiny.py < 256 B, .txt
    assert m["files"][0]["sha256"] == sha256(("def a():\n    return 1\n" * 20).encode())
    assert [f.path for f, _ in read_corpus(m, tmp_path)] == ["kdtoy/a.py", "kdtoy/b.py"]
    (tmp_path / "kdtoy-1.0-py3-none-any.whl").unlink()
    _wheel(tmp_path, files={"kdtoy/a.py": "def a():\n    return 2\n" * 20, "kdtoy/b.py": "x = 2\n" * 60})
    with pytest.raises(InputError, match=r"^corpus file kdtoy/a\.py: sha256 .* differs") as e:
        list(read_corpus(m, tmp_path))
    assert "\n" not in str(e.value)


def test_missing_package_or_file_is_a_one_line_error(tmp_path):
    with pytest.raises(InputError, match="kdtoy==1.0 is not installed"):
        Source("kdtoy", "1.0", tmp_path)
    _wheel(tmp_path)
    gone = {"dist": "kdtoy", "path": "kdtoy/gone.py", "sha256": "0" * 64, "bytes": 1, "split": "train"}
    m = {"packages": {"kdtoy": "1.0"}, "files": [gone]}
    with pytest.raises(InputError, match="kdtoy/gone.py is missing"):
        list(read_corpus(m, tmp_path))


def test_manifest_file_errors(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_manifest(bad)
    bad.write_text(json.dumps({"format": 99, "files": []}))
    with pytest.raises(InputError, match="not a format-1 manifest"):
        load_manifest(bad)
    with pytest.raises(InputError, match="No such file"):
        load_manifest(tmp_path / "absent.json")


def test_split_is_a_function_of_the_path():
    """Fixed expectations (sha256 of the path), so a split that came from Python's per-process string hash
    or any other state would fail here, and the same answer in a process with another hash seed."""
    assert split_of("networkx/algorithms/cycles.py") == "train"
    assert split_of("mpmath/functions/theta.py") == split_of("mpmath/libmp/__init__.py") == "heldout"
    held = [i for i in range(400) if split_of(f"pkg/m{i}.py") == "heldout"]
    assert held == [32, 40, 49, 67, 185, 189, 241, 246, 279, 313, 317, 320, 357, 360, 388]
    splits = [split_of(f"pkg/m{i}.py") for i in range(3200)]
    assert 50 < splits.count("heldout") < 150
    code = ("from workbench.train.corpus import split_of; "
            "print(''.join(split_of(f'pkg/m{i}.py')[0] for i in range(400)))")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "".join(s[0] for s in splits[:400])
