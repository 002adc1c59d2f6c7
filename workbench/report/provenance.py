"""Where and with what a report ran: git SHA, package versions, CPU/GPU, time; and device choice."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import InputError

COMMIT_ENV = "WORKBENCH_COMMIT"   # the commit of a tree sent without its .git (dev/showcase/render_gpu.sh)
RUN_ENV = "WORKBENCH_RUN"         # the runner's provenance, so every page names the index's commit and GPU
PACKAGES = ("numpy", "torch", "numba", "numba-cuda", "transformers", "safetensors", "matplotlib",
            "papermill", "jupytext", "nbconvert", "ipykernel")


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_state(root: Path, exclude: Path | None = None) -> dict[str, Any]:
    """{"sha", "dirty"}: HEAD and whether the tree differs from it, leaving out ``exclude`` (the report's
    own output folder, which a run rewrites). Without git (a copy of the tree sent to another machine)
    the sha is $WORKBENCH_COMMIT, if set, and dirty is None: not known."""
    sha = _run(["git", "rev-parse", "HEAD"], root)
    if sha is None:
        return {"sha": os.environ.get(COMMIT_ENV) or None, "dirty": None}
    spec = ["--", "."]
    if exclude is not None and Path(exclude).resolve().is_relative_to(Path(root).resolve()):
        spec.append(f":(exclude){Path(exclude).resolve().relative_to(Path(root).resolve())}")
    dirty = _run(["git", "status", "--porcelain", *spec], root)
    return {"sha": sha, "dirty": None if dirty is None else bool(dirty)}


def ignored(root: Path, paths: list[Path]) -> set[Path]:
    """Those of ``paths`` (absolute) git ignores, so no clone has them. Without git (a copy of the tree
    sent without .git) the root's .gitignore is read directly (its plain patterns: no negation)."""
    if not paths:
        return set()
    try:
        r = subprocess.run(["git", "check-ignore", "--", *map(str, paths)], cwd=root, capture_output=True,
                           text=True, timeout=20)
        if r.returncode in (0, 1):                    # 1: none ignored; anything else: no repository here
            return {Path(line) for line in r.stdout.splitlines() if line}
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {p for p in paths if _gitignore_matches(root, p)}


def _gitignore_matches(root: Path, path: Path) -> bool:
    import fnmatch
    try:
        rel = Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
        patterns = (Path(root) / ".gitignore").read_text().splitlines()
    except (ValueError, OSError):
        return False
    parts = rel.split("/")
    for pat in (p.strip() for p in patterns):
        if not pat or pat.startswith(("#", "!")):
            continue
        body = pat.strip("/")
        if "/" in pat.rstrip("/"):                   # anchored at the root: the path or a folder above it
            hit = any(fnmatch.fnmatchcase("/".join(parts[:i]), body) for i in range(1, len(parts) + 1))
        else:                                        # any path component
            hit = any(fnmatch.fnmatchcase(part, body) for part in parts)
        if hit:
            return True
    return False


def tracked_files(root: Path, folder: Path) -> list[str]:
    """Files git tracks under ``folder`` (paths relative to ``root``); [] outside the repo or without git."""
    try:
        rel = folder.resolve().relative_to(root.resolve())
    except ValueError:
        return []
    out = _run(["git", "ls-files", "--", str(rel) or "."], root)
    return out.splitlines() if out else []


def gpus() -> list[dict[str, str]]:
    """Real CUDA GPUs from nvidia-smi (name, driver, memory); [] when there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    rows = [ln.split(", ") for ln in (out or "").splitlines() if ln.strip()]
    return [{"name": r[0], "driver": r[1], "memory": r[2]} for r in rows if len(r) == 3]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_line() -> str:
    """This machine's CPU for captions of what ran on it (the numpy reference): 'CPU <model> x<cores>'."""
    return f"CPU {cpu_name()} x{os.cpu_count()}"


def hardware_line() -> str:
    """Short hardware description: the GPU if one is used, else the CPU."""
    g = gpus()
    if g and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        return f"{g[0]['name']} (driver {g[0]['driver']})"
    return cpu_line()


def resolve_device(device: str) -> str:
    """'auto' -> 'gpu' with a real GPU and the simulator off, else 'cpu'; 'gpu' without one -> InputError."""
    if device not in ("auto", "cpu", "gpu"):
        raise InputError(f"device must be 'auto', 'cpu' or 'gpu', got {device!r}")
    real = bool(gpus()) and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1"
    if device == "gpu" and not real:
        raise InputError("device='gpu' but no CUDA GPU is usable (none found, or NUMBA_ENABLE_CUDASIM=1)")
    return device if device != "auto" else ("gpu" if real else "cpu")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def gpu_text(gpu_rows: list[dict[str, str]], simulated: bool) -> str:
    """'NVIDIA H200 (driver 570.86.15)' for the report headers; says so when there is none or it is unused."""
    if not gpu_rows:
        return "none (the numba engine runs in numba's CUDA simulator)"
    g = gpu_rows[0]
    text = f"{g['name']} (driver {g['driver']})" + (f" x{len(gpu_rows)}" if len(gpu_rows) > 1 else "")
    return text + (", not used: NUMBA_ENABLE_CUDASIM=1" if simulated else "")


def git_text(git: dict[str, Any]) -> str:
    """'abc123def456', with '(uncommitted changes)' when the tree differed from it."""
    sha = (git.get("sha") or "unknown")[:12]
    return sha + (" (uncommitted changes)" if git.get("dirty") else "")


def collect(root: Path, out: Path | None = None) -> dict[str, Any]:
    """Everything the index page shows about the run (``out``: the report's folder, left out of dirty)."""
    return {
        "time_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "git": git_state(root, out),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        "gpus": gpus(),
        "cuda_simulator": os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
        "versions": versions(),
        "python_executable": sys.executable,
    }


def run_line(profile: str, device: str, root: str | Path = ".") -> str:
    """One line for the top of a report: profile, resolved device, GPU and driver, CPU, commit, date.

    Under the report runner GPU and commit are the run's (WORKBENCH_RUN), the same as on its index."""
    run = json.loads(os.environ.get(RUN_ENV) or "null")
    git = run["git"] if run else git_state(Path(root))
    simulated = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    gpu = gpu_text(run["gpus"] if run else gpus(), simulated)
    day = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return (f"Profile **{profile}**, device **{resolve_device(device)}**, GPU **{gpu}**, {cpu_line()}, "
            f"git `{git_text(git)}`, run {day}.")


def use_device(device: str) -> str:
    """Resolve ``device`` and, for 'cpu', switch numba to its CUDA simulator (before numba is imported).

    InputError if numba was already imported with the other setting (its config is read at import).
    """
    d = resolve_device(device)
    want = d == "cpu"
    numba = sys.modules.get("numba")
    if numba is not None and bool(numba.config.ENABLE_CUDASIM) != want:
        raise InputError(f"numba was imported before use_device({device!r}); call use_device first")
    if want:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return d
