"""The runner on fixture notebooks: a passing one, and one per failure kind (raise, timeout, death)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from tests.report.browser import open_page
from workbench.cli import main
from workbench.commands import report
from workbench.errors import InputError
from workbench.report.runner import pick_kernel

FIXTURES = Path(__file__).parent / "fixtures"


def run_cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    report.add_arguments(p)
    return report.run(p.parse_args(["--notebooks", str(FIXTURES), "--quiet", *argv]))


EXPECTED = {  # fixture -> (status, words its reason must contain)
    "fails": ("error", ["code cell 3", "ValueError: deliberate failure"]),
    "hangs": ("timeout", ["code cell 4 (`time.sleep(seconds)", "per-cell limit of 10 s"]),
    "crashes": ("dead_kernel", ["kernel died", "code cell 4 (`os.kill"]),
}


def test_fixtures_each_reported_with_a_reason(tmp_path):
    """One runner call over the four fixtures (one xdist unit); every check is collected."""
    out = tmp_path / "out"
    rc = run_cli(
        "--out",
        str(out),
        "--profile",
        "smoke",
        "--cell-timeout",
        "10",
        "--wall-timeout",
        "90",
        "--only",
        "ok,fails,hangs,crashes",
    )
    manifest = json.loads((out / "manifest.json").read_text())
    runs = {r["name"]: r for r in manifest["notebooks"]}
    assert rc == 1 and list(runs) == ["ok", "fails", "hangs", "crashes"] and manifest["pending"] == []
    checks = []
    ok = runs["ok"]
    checks += [
        (ok["status"] == "ok" and ok["reason"] == "", "ok: status"),
        (ok["parameters"] == {"n": 5, "out_dir": str(out.resolve()), "profile": "smoke"}, "ok: parameters"),
        (
            json.loads((out / "data" / "ok_fixture.json").read_text()) == {"n": 5, "profile": "smoke"},
            "ok: the notebook's own output file",
        ),
    ]
    nb = nbformat.read(out / "ok.ipynb", as_version=4)
    checks.append(
        (
            any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])),
            "ok: inline PNG in the executed notebook",
        )
    )
    index = (out / "index.html").read_text()
    for name, (status, words) in EXPECTED.items():
        r = runs[name]
        checks.append((r["status"] == status, f"{name}: status {r['status']} != {status}"))
        checks += [(w in r["reason"], f"{name}: {w!r} not in reason {r['reason']!r}") for w in words]
        checks.append(
            ((out / r["ipynb"]).is_file() and (out / r["html"]).is_file(), f"{name}: partial files")
        )
        part = nbformat.read(out / r["ipynb"], as_version=4)  # partial: the cells before the failure did run
        texts = [o.get("text", "") for c in part.cells for o in c.get("outputs", [])]
        checks.append(
            (any(t.startswith(("before", "about")) for t in texts), f"{name}: partial outputs kept")
        )
        checks.append(('id="workbench-failure"' in (out / r["html"]).read_text(), f"{name}: banner in HTML"))
        checks.append((f'data-status="{status}"' in index, f"{name}: status in index.html"))
    page = open_page(out / "ok.html", tmp_path)
    checks.append(
        (
            page["loaded"] == 1
            and page["images"] >= 1
            and page["broken"] == 0
            and page["errors"] == 0
            and page["banner"] == 0,
            "browser: ok.html",
        )
    )
    page = open_page(out / "fails.html", tmp_path)
    checks.append(
        (page["loaded"] == 1 and page["banner"] == 1 and page["errors"] == 1, "browser: fails.html")
    )
    for name in ("hangs", "crashes"):
        checks.append(
            (open_page(out / f"{name}.html", tmp_path)["banner"] == 1, f"browser: {name}.html banner")
        )
    page = open_page(out / "index.html", tmp_path)
    checks.append(
        (
            page["loaded"] == 1
            and page["dom"].count('data-status="ok"') == 1
            and all(f'data-status="{s}"' in page["dom"] for s, _ in EXPECTED.values()),
            "browser: index",
        )
    )
    failed = [what for good, what in checks if not good]
    assert not failed, "\n".join(failed)


def test_wall_limit_kills_notebook_and_kernel(tmp_path):
    pid_file = tmp_path / "kernel.pid"
    t0 = time.monotonic()
    rc = run_cli(
        "--out",
        str(tmp_path),
        "--only",
        "hangs",
        "--cell-timeout",
        "100",
        "--wall-timeout",
        "15",  # room for a kernel start on a busy 2-core machine: the kill must land in cell 4
        "--param",
        f"pid_file={json.dumps(str(pid_file))}",
        "--param",
        'mode="gil"',  # only the runner's kill can end a kernel stuck in C code holding the GIL
    )
    assert rc == 1 and time.monotonic() - t0 < 45
    r = json.loads((tmp_path / "manifest.json").read_text())["notebooks"][0]
    assert r["status"] == "wall_timeout" and "wall limit of 15 s" in r["reason"]
    assert "code cell 4 (`time.sleep" in r["reason"]
    kernel_pid = int(pid_file.read_text())
    assert kernel_pid != os.getpid()
    assert not psutil.pid_exists(kernel_pid) or psutil.Process(kernel_pid).status() == psutil.STATUS_ZOMBIE
    assert (tmp_path / "hangs.html").is_file() and not list(tmp_path.glob(".hangs.ipynb.*.tmp"))


def test_param_override_and_only_prefix(tmp_path):
    assert run_cli("--out", str(tmp_path), "--only", "o", "--param", "n=3") == 0
    assert json.loads((tmp_path / "data" / "ok_fixture.json").read_text())["n"] == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--profile", "huge"], "unknown profile"),
        (["--only", "nope"], "matches 0 notebooks"),
        (["--only", "ok", "--param", "zzz=1"], "no selected notebook declares"),
        (["--only", "ok", "--param", "n=three"], "not JSON"),
        (["--only", "ok", "--param", "n"], "NAME=JSON"),
        (["--only", "ok", "--kernel", "no-such-kernel"], "unknown Jupyter kernel"),
    ],
)
def test_bad_arguments_raise_one_line_errors(tmp_path, argv, message):
    with pytest.raises(InputError, match=message):
        run_cli("--out", str(tmp_path), *argv)
    assert not (tmp_path / "index.html").exists()


@pytest.mark.parametrize("option, value", [("--cell-timeout", "-1"), ("--wall-timeout", "nan"),
                                           ("--cell-timeout", "0"), ("--wall-timeout", "soon")])
def test_bad_timeouts_exit_2_before_running(tmp_path, capsys, option, value):
    argv = ["report", "--notebooks", str(FIXTURES), "--out", str(tmp_path), "--only", "ok", option, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and option in err, err
    assert not (tmp_path / "index.html").exists()


def test_project_kernel_is_preferred_when_installed(tmp_path, monkeypatch):
    spec = tmp_path / "jupyter" / "kernels" / "kdtree-workbench"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kdtree-workbench", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    assert pick_kernel() == "kdtree-workbench" and pick_kernel("python3") == "python3"
    assert run_cli("--out", str(tmp_path / "out"), "--only", "ok") == 0
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["kernel"] == "kdtree-workbench"
    nb = nbformat.read(tmp_path / "out" / "ok.ipynb", as_version=4)
    assert nb.metadata.kernelspec.name == "kdtree-workbench"


def test_progress_and_stderr_stay_out_of_the_report(tmp_path):
    """Progress bars go to the runner's log, stderr outputs leave the executed notebook for the log."""
    assert run_cli("--out", str(tmp_path), "--only", "noisy") == 0
    nb = nbformat.read(tmp_path / "noisy.ipynb", as_version=4)
    outs = [o for c in nb.cells for o in c.get("outputs", [])]
    texts = "".join(o.get("text", "") for o in outs)
    assert not [o for o in outs if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert "total 10" in texts and "end" in texts
    html = (tmp_path / "noisy.html").read_text()
    for noise in ("noisy loop", "it/s", "%|", "a line on stderr", "C-level write", "should not show"):
        assert noise not in texts and noise not in html, noise
    log = (tmp_path / "logs" / "noisy.log").read_text()
    assert "progress: noisy loop: 100%|" in log and "a line on stderr" in log and "should not show" in log
    assert "kept out of the report" in log
