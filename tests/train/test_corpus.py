"""The corpus manifest: reproduced by the selection rule, read from installed packages or wheels, and
any changed file is refused with one line naming it."""

import json
import zipfile

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
    assert split_of("networkx/algorithms/cycles.py") == split_of("networkx/algorithms/cycles.py")
    splits = [split_of(f"pkg/m{i}.py") for i in range(3200)]
    assert 50 < splits.count("heldout") < 150
