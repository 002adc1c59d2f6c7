"""Where `report` writes: by default a git-ignored folder, so a run leaves the tracked tree clean;
into a folder of committed files (the showcase) only when asked, and then it says so."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

from workbench.commands import report
from workbench.report.params import default_parameters, read_notebook
from workbench.report.profiles import NOTEBOOKS

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "report" / "fixtures"


def ignored(path: Path) -> bool:
    rel = path.resolve().relative_to(ROOT)
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", str(rel)], cwd=ROOT).returncode == 0


def test_default_outputs_are_git_ignored():
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    out = p.parse_args([]).out
    assert out == report.DEFAULT_OUT
    for f in ("index.html", "manifest.json", "01_golden_bundles.html", "01_golden_bundles.ipynb",
              "data/01_validation.csv", "figures/01_margins.png", "logs/01_golden_bundles.log",
              "bench/kernels.csv"):
        assert ignored(out / f), f
    for name in NOTEBOOKS:   # an interactive run (JupyterLab) writes to the parameters cell's out_dir
        params = default_parameters(read_notebook(ROOT / "notebooks" / f"{name}.py"), name)
        assert ignored(ROOT / params["out_dir"] / "data" / "x.csv"), (name, params["out_dir"])


def test_the_report_lock_is_git_ignored_in_every_output_folder():
    for out in (report.DEFAULT_OUT, report.SHOWCASE):
        assert ignored(out / ".report.lock")


def test_showcase_folder_is_tracked_and_named():
    from workbench.report.provenance import tracked_files

    assert "reports/index.html" in tracked_files(ROOT, report.SHOWCASE)
    assert tracked_files(ROOT, report.DEFAULT_OUT) == [] and tracked_files(ROOT, Path("/")) == []


def test_writing_into_committed_files_says_so(tmp_path, monkeypatch, capsys):
    repo = tmp_path / "repo"
    (repo / "showcase").mkdir(parents=True)
    (repo / "showcase" / "index.html").write_text("committed\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "showcase/index.html"], cwd=repo, check=True)
    monkeypatch.setattr(report, "ROOT", repo)
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    for out, warned in ((repo / "showcase", True), (tmp_path / "elsewhere", False)):
        args = p.parse_args(["--notebooks", str(FIXTURES), "--only", "ok", "--out", str(out)])
        assert report.run(args) == 0
        err = capsys.readouterr().err
        assert ("holds 1 committed files (the showcase)" in err) == warned, err
