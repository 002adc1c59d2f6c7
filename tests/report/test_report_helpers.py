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
