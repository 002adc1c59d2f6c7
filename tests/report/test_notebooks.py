"""Every notebook in the smoke profile, through the same runner `make report` uses; assertions are
on the files the notebooks write (CSV, PNG, manifest) and on what a headless browser loads.

One test function, so that pytest-xdist runs the smoke report once, not once per worker; the
checks are collected and all failures reported together.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import nbformat
import pytest

from tests.report.browser import open_page
from tests.report.depth_fixture import write_depth_set
from tests.report.test_headline import check_depth_pages
from workbench.commands import report
from workbench.report.profiles import NOTEBOOKS

BENCH_FIXTURE = Path(__file__).parent / "fixtures" / "bench"


PROGRESS_TEXT = re.compile(r"\d+%\||it/s\]|s/it\]")   # what a tqdm bar prints


def clean_report(out: Path, name: str) -> list[tuple[bool, str]]:
    """No stderr stream output and no progress-bar text in the executed notebook or its HTML."""
    nb = nbformat.read(out / f"{name}.ipynb", as_version=4)
    outs = [o for c in nb.cells for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outs)
    return [
        (not [o for o in outs if o.get("name") == "stderr"], f"{name}: no stderr output in the ipynb"),
        (not PROGRESS_TEXT.search(text), f"{name}: no progress bar in the ipynb"),
        (not PROGRESS_TEXT.search((out / f"{name}.html").read_text()), f"{name}: no progress bar in HTML"),
    ]


def rows(out: Path, name: str) -> list[dict[str, str]]:
    with open(out / "data" / f"{name}.csv", newline="") as f:
        return list(csv.DictReader(f))


def check_01(out: Path) -> list[tuple[bool, str]]:
    v = rows(out, "01_validation")
    side = rows(out, "01_side_by_side_tiny")
    return [
        ([r["bundle"] for r in v] == ["tiny", "int4_tiny"], "01: validated bundles"),
        (all(r["golden_reproduced"] == "True" for r in v), "01: goldens reproduced"),
        (all(r["reproduced"] == "True" for r in rows(out, "01_rebuild")), "01: rebuild reproduces"),
        (len(side) == 32 and {"fp32_token", "int4_token", "same"} <= set(side[0]), "01: side by side"),
        ((out / "figures" / "01_margins.png").stat().st_size > 1000, "01: margins figure"),
    ]


def check_02(out: Path) -> list[tuple[bool, str]]:
    g = rows(out, "02_greedy_exact")
    hist = {(r["drafter"], r["budget"]) for r in rows(out, "02_accept_hist")}
    return [
        (len(g) == 2 * (1 + 2 * 2), "02: 2 bundles x (AR + 2 drafters x 2 budgets) runs"),
        (all(r["equals_golden"] == "True" for r in g), "02: every run equals the golden"),
        ({r["backend"] for r in g} == {"reference"}, "02: smoke runs the reference only"),
        (hist == {(d, b) for d in ("dflash", "oracle") for b in ("1", "4")}, "02: histogram cases"),
        ((out / "figures" / "02_tree.png").is_file(), "02: tree drawing"),
    ]


def check_03(out: Path) -> list[tuple[bool, str]]:
    s = rows(out, "03_teacher_forced_summary")
    pairs = {(r["model"], r["group_size"]) for r in s}
    want = {
        ("tiny", "32"),
        ("tiny", "64"),
        ("tiny_moe128", "32"),
        ("tiny_moe128", "64"),
        ("tiny_moe128", "128"),
    }
    return [
        (pairs == want, f"03: (model, G) pairs {sorted(pairs)}"),
        (all(float(r["fp32_reproduces_forced"]) == 1.0 for r in s), "03: FP32 teacher forcing self-check"),
        (
            all(float(r["mean_kl_nats"]) > 0 and 0 <= float(r["top1_agreement"]) <= 1 for r in s),
            "03: KL, top-1",
        ),
        ([r["group_size"] for r in rows(out, "03_group_sizes")] == ["32", "64", "128"], "03: group sizes"),
        (len(rows(out, "03_hidden_state_error")) == 5 * 4, "03: 5 pairs x 4 layers of hidden-state error"),
        ((out / "data" / "03_matrix_errors.csv").is_file(), "03: per-matrix CSV"),
    ]


def check_04(out: Path) -> list[tuple[bool, str]]:
    model = rows(out, "04_bandwidth_model")
    return [
        (len(model) == 2 * 7 and all(float(r["ideal_speedup"]) > 3 for r in model), "04: bandwidth model"),
        (len(rows(out, "04_kernels")) == 8, "04: the bench fixture CSV read back"),
        ((out / "figures" / "04_kernels.png").is_file(), "04: measured figure"),
    ]


def check_05(out: Path) -> list[tuple[bool, str]]:
    acc = rows(out, "05_acceptance")
    full = [r for r in acc if r["oracle_p"] == "1.0" and r["budget"] == "16"]
    cov = rows(out, "05_expert_coverage")
    spec, verify = rows(out, "05_engine_spec"), rows(out, "05_engine_verify_tiny2")
    return [
        (len(full) == 1 and float(full[0]["tau"]) == 8.0, "05: oracle p=1 accepts whole blocks (8)"),
        (cov[0]["rows"] == "1" and float(cov[0]["measured_unique_experts"]) == 8.0, "05: one row, 8 experts"),
        (all(float(r["measured_unique_experts"]) <= min(384, 8 * int(r["rows"])) for r in cov), "05: bounds"),
        (len(rows(out, "05_speedup_model")) == len(acc), "05: speedup rows"),
        (all(r["same_tau"] == "True" for r in spec if r["same_tau"]) and any(r["same_tau"] for r in spec),
         "05: the engine's measured tau equals the reference's wherever both exist"),
        (verify[0]["budget"] == "0" and verify[-1]["budget"] == "256", "05: verify budgets 0..256"),
    ]


@pytest.mark.slow
def test_smoke_profile_of_every_notebook(tmp_path):
    out, depth = tmp_path / "reports", tmp_path / "depth"
    write_depth_set(depth)                       # 05 and 06 show the fixture's K2-depth set
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    rc = report.run(
        p.parse_args(
            [
                "--profile",
                "smoke",
                "--out",
                str(out),
                "--quiet",
                "--param",
                f"bench_dir={json.dumps(str(BENCH_FIXTURE))}",
                "--param",
                f"depth_bench_dir={json.dumps(str(depth))}",
            ]
        )
    )
    runs = {r["name"]: r for r in json.loads((out / "manifest.json").read_text())["notebooks"]}
    assert sorted(runs) == sorted(NOTEBOOKS)
    assert {n: r["status"] for n, r in runs.items()} == {n: "ok" for n in NOTEBOOKS}, {
        n: r["reason"] for n, r in runs.items()
    }
    assert rc == 0
    checks = [
        (
            r["parameters"]["profile"] == "smoke" and r["parameters"]["out_dir"] == str(out.resolve()),
            f"{n}: standard parameters",
        )
        for n, r in runs.items()
    ]
    for fn in (check_01, check_02, check_03, check_04, check_05, check_depth_pages):
        checks += fn(out)
    for name in NOTEBOOKS:
        checks += clean_report(out, name)
    for name in [*NOTEBOOKS, "index"]:
        page = open_page(out / (f"{name}.html" if name == "index" else runs[name]["html"]), tmp_path)
        checks.append(
            (
                page["loaded"] == 1 and page["broken"] == 0 and page["errors"] == 0 and page["banner"] == 0,
                f"browser: {name} loaded, no broken images, no error cells, no failure banner",
            )
        )
        if name == "index":
            checks.append(
                (page["dom"].count('data-status="ok"') == len(NOTEBOOKS), "browser: index statuses")
            )
        else:
            checks.append((page["images"] >= 1, f"browser: {name} has images"))
    failed = [what for ok, what in checks if not ok]
    assert not failed, "\n".join(failed)


def test_a_notebook_run_from_another_folder_finds_the_repository(tmp_path):
    """`jupytext --to ipynb` then `jupyter nbconvert --execute` from a folder outside the repository, as
    a user might: the notebook still reads the repository's committed results (here 04's benchmarks)."""
    import os
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "WORKBENCH_PROGRESS"}
    env.update(PYTHONPATH=str(root), MPLBACKEND="Agg")
    nb = tmp_path / "04.ipynb"
    subprocess.run([sys.executable, "-m", "jupytext", "--to", "ipynb", "-q", "-o", str(nb),
                    str(root / "notebooks" / "04_kernel_throughput.py")], cwd=tmp_path, env=env, check=True)
    book = nbformat.read(nb, as_version=4)
    params = next(c for c in book.cells if "parameters" in c.metadata.get("tags", []))
    out = repr(str(tmp_path / "out"))
    params.source = re.sub(r"^out_dir = .*$", f"out_dir = {out}", params.source, flags=re.M)
    nbformat.write(book, nb)
    r = subprocess.run([sys.executable, "-m", "nbconvert", "--execute", "--to", "notebook", "--output", "run",
                        "--ExecutePreprocessor.kernel_name=python3", str(nb)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    run = nbformat.read(tmp_path / "run.ipynb", as_version=4)
    outs = [o for c in run.cells for o in c.get("outputs", [])]
    text = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/markdown", "")) for o in outs)
    assert "No benchmark results" not in text and "measured on" in text
    assert (tmp_path / "out" / "data" / "04_kernels.csv").is_file()


def test_every_notebook_enters_the_repository_first():
    """Relative paths in a notebook mean the repository's files only after enter_repo() (first code cell)."""
    from workbench.report.params import read_notebook
    root = Path(__file__).resolve().parents[2]
    for name in NOTEBOOKS:
        nb = read_notebook(root / "notebooks" / f"{name}.py")
        first = next(c for c in nb.cells if c.cell_type == "code")
        assert "enter_repo()" in first.source and "parameters" not in first.metadata.get("tags", []), name
