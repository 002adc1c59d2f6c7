"""JupyterLab on the notebooks: the jupytext pairing of notebooks/, the contents manager that starts
kernels at the repository root, and `make lab` itself (a real server, queried over its REST API)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from jupyter_client.kernelspec import KernelSpecManager
from jupytext.config import find_jupytext_configuration_file, load_jupytext_configuration_file

from workbench.lab import REPO, RepoContentsManager
from workbench.report.profiles import NOTEBOOKS

ROOT = Path(__file__).resolve().parents[1]
NB = "notebooks/01_golden_bundles.py"


def test_project_kernel_is_installed_for_this_python():
    spec = KernelSpecManager().get_kernel_spec("kdtree-workbench")
    assert spec.language == "python" and os.path.samefile(spec.argv[0], sys.executable)


def test_notebooks_pair_as_py_percent():
    path = find_jupytext_configuration_file(ROOT / "notebooks")
    assert path == str(ROOT / "notebooks" / "jupytext.toml")
    assert load_jupytext_configuration_file(path).default_formats(str(ROOT / NB)) == "ipynb,py:percent"
    assert find_jupytext_configuration_file(ROOT / "reports") != path      # reports/*.ipynb stay unpaired


def test_contents_manager_round_trip_keeps_the_py_file(tmp_path):
    """Open and save every notebook as JupyterLab would: the .py stays byte for byte, an .ipynb joins it."""
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "jupytext.toml", tmp_path / "notebooks")
    for name in NOTEBOOKS:
        shutil.copy(ROOT / "notebooks" / f"{name}.py", tmp_path / "notebooks")
    cm = RepoContentsManager(root_dir=str(tmp_path))

    async def round_trip(name: str) -> dict:
        model = await cm.get(f"notebooks/{name}.py")
        await cm.save(model, f"notebooks/{name}.py")
        return model

    for name in NOTEBOOKS:
        model = asyncio.run(round_trip(name))
        assert model["type"] == "notebook" and kernel_of(model) == "kdtree-workbench"
        tags = [c["metadata"].get("tags", []) for c in model["content"]["cells"]]
        assert ["parameters"] in tags, name
        saved = (tmp_path / "notebooks" / f"{name}.py").read_bytes()
        assert saved == (ROOT / "notebooks" / f"{name}.py").read_bytes(), name
        assert (tmp_path / "notebooks" / f"{name}.ipynb").is_file()
    assert asyncio.run(cm.get_kernel_path(NB)) == "notebooks"      # tmp_path does not hold the repo
    assert asyncio.run(RepoContentsManager(root_dir=str(REPO)).get_kernel_path(NB)) == ""
    assert asyncio.run(RepoContentsManager(root_dir=str(REPO.parent)).get_kernel_path(NB)) == REPO.name


def log_text(tmp_path: Path) -> str:
    return (tmp_path / "lab.log").read_text()


def kernel_of(model: dict) -> str:
    return model["content"]["metadata"]["kernelspec"]["name"]


def _get(url: str, token: str, data: dict | None = None) -> dict:
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


def _cmdline(p) -> list[str]:
    """A child's command line, or none for one that exited meanwhile (a short-lived helper of the server,
    gone or a zombie by the time it is read)."""
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def test_make_lab_serves_notebooks_with_the_project_kernel_at_the_repo_root(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "workbench-test"
    args = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={token}"
    make = subprocess.run(["make", "-n", "-s", "lab", f"PY={sys.executable}", f"LAB_ARGS={args}"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    cmd = make.stdout.strip().splitlines()[-1]                   # the lab recipe, as `make lab` runs it
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    kernels: list[psutil.Process] = []
    try:
        for _ in range(120):
            try:
                _get(f"{base}/api/status", token)
                break
            except OSError:
                assert server.poll() is None, log_text(tmp_path)
                time.sleep(0.5)
        model = _get(f"{base}/api/contents/{NB}?type=notebook", token)
        assert model["type"] == "notebook" and kernel_of(model) == "kdtree-workbench"
        assert _get(f"{base}/api/kernelspecs", token)["default"] == "kdtree-workbench"
        viewers = _get(f"{base}/lab/api/settings/@jupyterlab/docmanager-extension:plugin", token)
        assert viewers["schema"]["properties"]["defaultViewers"]["default"]["python"] == "Jupytext Notebook"
        session = _get(f"{base}/api/sessions", token,
                       {"path": NB, "type": "notebook", "name": "01", "kernel": {"name": "kdtree-workbench"}})
        kid = session["kernel"]["id"]
        kernels += [p for p in psutil.Process(server.pid).children(recursive=True)
                    if any(kid in a for a in _cmdline(p))]
        assert len(kernels) == 1 and Path(kernels[0].cwd()) == ROOT
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        for k in psutil.wait_procs(kernels, timeout=10)[1]:   # the server shuts its kernels down; else
            k.kill()
        log.close()
    assert "Loaded Jupytext configuration file at notebooks/jupytext.toml" in log_text(tmp_path)
