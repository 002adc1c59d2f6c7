"""Bundle views, device choice, the failure locator and the index page."""

from __future__ import annotations

from pathlib import Path

import nbformat
import numpy as np
import pytest

from workbench.errors import InputError
from workbench.report import bundles, outcome, provenance
from workbench.report.index import render_index

REFS = Path(__file__).resolve().parents[2] / "refs"


def test_bundle_views():
    refs = bundles.load(REFS, ["tiny", "int4_tiny"])
    v = bundles.validate("tiny", refs["tiny"])
    assert v["golden_reproduced"] and v["max_margin_diff"] < 1e-4
    rows, first = bundles.golden_side_by_side(refs["tiny"], refs["int4_tiny"])
    same = [r["same"] for r in rows]
    assert first == (same.index(False) if False in same else None)
    fams = {r["family"]: r for r in bundles.tensor_rows("int4_tiny", refs["int4_tiny"])}
    assert (
        fams["routed experts"]["dtypes"] == "float16 int32" and fams["attention (MLA)"]["dtypes"] == "float32"
    )
    assert bundles.tensor_group("layers.1.ffn.gate_bias") == "router"
    assert bundles.tensor_group("layers.0.attn.kv_norm") == "norms"
    with pytest.raises(InputError, match="not found"):
        bundles.load(REFS, ["nope"])


def test_load_model_specs():
    name, cfg, w, prompt = bundles.load_model(
        {"preset": "tiny", "overrides": {"moe_intermediate_size": 128}, "seed": 2, "name": "wide"}, REFS
    )
    assert (
        name == "wide"
        and cfg.moe_intermediate_size == 128
        and w["layers.1.ffn.experts.0.w1"].shape == (128, 128)
    )
    assert prompt.dtype == np.int64
    assert bundles.load_model({"bundle": "tiny"}, REFS)[0] == "tiny"
    with pytest.raises(InputError):
        bundles.load_model({"bundle": "tiny", "preset": "tiny"}, REFS)


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(provenance, "gpus", lambda: [])
    assert provenance.resolve_device("auto") == "cpu" and provenance.resolve_device("cpu") == "cpu"
    with pytest.raises(InputError, match="no CUDA GPU"):
        provenance.resolve_device("gpu")
    with pytest.raises(InputError, match="auto"):
        provenance.resolve_device("tpu")
    monkeypatch.setattr(provenance, "gpus", lambda: [{"name": "H200", "driver": "1", "memory": "1"}])
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    assert provenance.resolve_device("auto") == "gpu"
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert provenance.resolve_device("auto") == "cpu"


def test_running_cell_is_the_last_started(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("x"),
        nbformat.v4.new_code_cell("a = 1"),
        nbformat.v4.new_code_cell("# Parameters\na = 2"),
        nbformat.v4.new_code_cell("\nslow()\nmore()"),
        nbformat.v4.new_code_cell("never()"),
    ]
    nb.cells[2].metadata["tags"] = ["injected-parameters"]
    for c in nb.cells[:4]:
        c.metadata["papermill"] = {"start_time": "2026-01-01T00:00:00"}
    nb.cells[4].metadata["papermill"] = {"start_time": None}
    nbformat.write(nb, tmp_path / "n.ipynb")
    assert outcome.running_cell(tmp_path / "n.ipynb") == (2, "slow()")
    assert outcome.running_cell(tmp_path / "missing.ipynb") is None
    (tmp_path / "bad.ipynb").write_text("{")
    assert outcome.describe({"status": "dead_kernel"}, tmp_path / "bad.ipynb", 1, 2).endswith(
        "during an unknown cell (killed, aborted or crashed)"
    )


def test_index_escapes_and_lists_pending():
    run = {
        "name": "a<b",
        "status": "error",
        "reason": "x <script>",
        "duration_s": 1.25,
        "parameters": {"k": 1},
        "ipynb": "a.ipynb",
        "html": "a.html",
        "log": "logs/a.log",
    }
    page = render_index(
        {
            "profile": "smoke",
            "kernel": "python3",
            "cell_timeout_s": 1,
            "wall_timeout_s": 2,
            "provenance": {"git": {"sha": "abc", "dirty": True}, "versions": {"numpy": "2"}},
            "notebooks": [run],
            "pending": ["later"],
        }
    )
    assert "x &lt;script&gt;" in page and "<script>" not in page and 'data-status="pending"' in page
    assert "1 of 2 notebooks" not in page and "0 of 2 notebooks ok, 1 failed, 1 not run yet" in page
    assert "abc (uncommitted changes)" in page


def _git_repo(path: Path) -> Path:
    import subprocess
    path.mkdir(parents=True, exist_ok=True)
    for cmd in (["init", "-q"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", *cmd], cwd=path, check=True)
    (path / ".gitignore").write_text("out/*.ipynb\nlocal/\n")
    (path / "code.py").write_text("x = 1\n")
    (path / "out").mkdir()
    (path / "out" / "a.html").write_text("old")
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-qm", "c"], cwd=path, check=True)
    return path


def test_git_state_leaves_out_the_report_folder_and_falls_back_to_the_env(tmp_path, monkeypatch):
    repo = _git_repo(tmp_path / "repo")
    (repo / "out" / "a.html").write_text("re-rendered")
    assert provenance.git_state(repo, repo / "out")["dirty"] is False      # the report's own output
    assert provenance.git_state(repo)["dirty"] is True
    (repo / "code.py").write_text("x = 2\n")
    assert provenance.git_state(repo, repo / "out")["dirty"] is True       # code is not
    plain = tmp_path / "copy"                                              # a tree sent without .git
    plain.mkdir()
    monkeypatch.setenv(provenance.COMMIT_ENV, "0123456789abcdef")
    assert provenance.git_state(plain) == {"sha": "0123456789abcdef", "dirty": None}
    monkeypatch.delenv(provenance.COMMIT_ENV)
    assert provenance.git_state(plain)["sha"] is None


def test_run_line_names_the_runs_gpu_driver_and_commit(monkeypatch):
    import json
    run = {"git": {"sha": "feedface" * 5, "dirty": False},
           "gpus": [{"name": "NVIDIA H200", "driver": "570.86.15", "memory": "143771 MiB"}]}
    monkeypatch.setenv(provenance.RUN_ENV, json.dumps(run))
    line = provenance.run_line("full", "cpu")
    assert "GPU **NVIDIA H200 (driver 570.86.15)" in line and "git `feedfacefeed`" in line
    assert "uncommitted" not in line
    run["git"]["dirty"], run["gpus"] = True, []
    monkeypatch.setenv(provenance.RUN_ENV, json.dumps(run))
    line = provenance.run_line("full", "cpu")
    assert "GPU **none" in line and "(uncommitted changes)" in line


def test_the_index_links_no_file_a_clone_lacks(tmp_path):
    from workbench.report.runner import NotebookRun, _unlink_ignored
    repo = _git_repo(tmp_path / "repo")

    def run() -> NotebookRun:
        return NotebookRun("a", "ok", "", 1.0, {}, ipynb="a.ipynb", html="a.html", log="logs/a.log")

    committed = run()
    _unlink_ignored(committed, repo / "out", repo.resolve())
    assert (committed.ipynb, committed.html, committed.log) == (None, "a.html", "logs/a.log")
    local = run()                                                         # a git-ignored folder: all kept
    (repo / "local").mkdir()
    _unlink_ignored(local, repo / "local", repo.resolve())
    assert (local.ipynb, local.html) == ("a.ipynb", "a.html")
    page = render_index({"profile": "smoke", "kernel": "python3", "cell_timeout_s": 1, "wall_timeout_s": 2,
                         "provenance": {}, "notebooks": [vars(committed)], "pending": []})
    assert 'href="a.html"' in page and ".ipynb" not in page


def test_quant_text_reads_as_words():
    meta = {"quant": {"group_size": 32, "n_quantized": 84, "policy": "mlp"}}
    assert bundles.quant_text(meta) == "INT4 policy mlp, group size 32, 84 matrices"
    assert bundles.quant_text({}) == "not quantized"


def test_ignored_files_without_git_come_from_the_gitignore(tmp_path):
    """A tree sent without .git (the GPU machine): the root's .gitignore still decides."""
    (tmp_path / ".gitignore").write_text("# comment\nout/*.ipynb\n/local/\n__pycache__/\n")
    paths = [tmp_path / p for p in ("out/a.ipynb", "out/a.html", "local/x.html", "pkg/__pycache__/m.pyc")]
    assert provenance.ignored(tmp_path, paths) == {paths[0], paths[2], paths[3]}
