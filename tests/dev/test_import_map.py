"""dev/import_map.py: the import graph it reads from the source finds cycles and upward arrows, and the
repository has no module cycle (but the known one) and no kernels_numba module importing workbench;
outside kernels_numba/ (and its own tests) kernels are reached through kernels_numba.ops only."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def im():
    spec = importlib.util.spec_from_file_location("import_map", ROOT / "dev" / "import_map.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def test_graph_resolves_relative_deferred_and_from_imports(im, tmp_path):
    _tree(tmp_path, {
        "numformats/__init__.py": "", "kernels_numba/__init__.py": "",
        "kernels_numba/k.py": "def f():\n    from workbench.config import X\n",
        "workbench/__init__.py": "", "workbench/config.py": "X = 1\n",
        "workbench/bench/__init__.py": "",
        "workbench/bench/a.py": "from . import b\nfrom ..report import t\n",
        "workbench/bench/b.py": "from .a import f\n",
        "workbench/report/__init__.py": "", "workbench/report/t.py": "import workbench.config\n",
    })
    graph = im.imports(im.modules(tmp_path))
    assert graph["kernels_numba.k"] == {"workbench.config"}                  # inside a function
    assert graph["workbench.bench.a"] == {"workbench.bench.b", "workbench.report.t"}
    assert graph["workbench.report.t"] == {"workbench.config"}
    assert im.cycles(graph) == [["workbench.bench.a", "workbench.bench.b"]]
    assert ("workbench.bench.a", "workbench.report.t") in im.upward(graph)  # report sits above bench
    bad = im.problems(graph)
    assert "cycle: workbench.bench.a <-> workbench.bench.b" in bad
    assert "kernels_numba imports workbench: kernels_numba.k -> workbench.config" in bad


def test_repository_has_no_new_cycle_and_kernels_import_nothing_from_workbench(im):
    graph = im.imports(im.modules())
    assert {"workbench.results", "kernels_numba.ops", "numformats.int4"} <= set(graph)
    for m in graph:
        im.layer(im.part(m))                                   # every part sits in a layer
    bad = [p for p in im.problems(graph) if not p.startswith("upward")]
    assert not bad, "\n".join(bad)


def test_imports_past_ops_are_reported(im, tmp_path, capsys):
    _tree(tmp_path, {
        "kernels_numba/__init__.py": "", "kernels_numba/ops.py": "", "kernels_numba/moe.py": "",
        "kernels_numba/device.py": "", "kernels_numba/sim/__init__.py": "",
        "workbench/__init__.py": "",
        "workbench/config.py": """\
            import kernels_numba
            import kernels_numba.ops
            from kernels_numba import KernelInputError, device, ops
            from kernels_numba.device import zeros
            from kernels_numba.sim import sim_speed
            """,
        "dev/kernels/ladder.py": "def f():\n    from kernels_numba.moe import fused_moe\n",
        "dev/names.py": "from kernels_numba import moe, ops, repack_int4\nimport kernels_numba.moe as m\n",
        "notebooks/n.py": "from kernels_numba.moe_gemm import make_moe_gemm_kernel\n",
        "tests/kernels/test_moe.py": "from kernels_numba.moe import fused_moe\n",    # the kernels' own tests
        "tests/engine/test_x.py": "from kernels_numba.intrinsics import ld_once_v4\n",
    })
    assert im.past_ops(tmp_path) == [
        "dev/kernels/ladder.py:2: kernels_numba.moe",                          # inside a function
        "dev/names.py:1: kernels_numba.moe", "dev/names.py:1: kernels_numba.repack_int4",
        "dev/names.py:2: kernels_numba.moe",
        "notebooks/n.py:1: kernels_numba.moe_gemm",
        "tests/engine/test_x.py:1: kernels_numba.intrinsics",
    ]
    assert im.main(["--check", "--root", str(tmp_path)]) == 1
    assert "past kernels_numba.ops: dev/kernels/ladder.py:2: kernels_numba.moe" in capsys.readouterr().err


def test_repository_reaches_kernels_through_ops_only(im):
    assert (ROOT / "dev" / "kernels" / "moe.py").exists()                  # the scan reads the ladders
    bad = im.past_ops()
    assert not bad, "\n".join(bad)
