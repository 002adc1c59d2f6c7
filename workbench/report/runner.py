"""Run notebooks headless, one child process each, with per-cell and whole-notebook limits.

Layout under ``out``: ``<name>.ipynb`` (executed, partial on failure), ``<name>.html`` (code
hidden, failure banner on top), ``logs/<name>.log`` (papermill's cell log), ``data/`` (what the
notebooks write), ``manifest.json`` and ``index.html``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil

from ..errors import InputError
from ..fileio import write_json_atomic
from . import headline as answer
from . import outcome
from . import progress as bars
from .clean import strip_stderr
from .execute import kill_processes
from .index import write_index
from .params import check_overrides, default_parameters, read_notebook
from .provenance import RUN_ENV
from .provenance import ignored as provenance_ignored
from .render import render_html

FALLBACK_KERNEL = "python3"
PROJECT_KERNEL = "kdtree-workbench"


@dataclass
class NotebookRun:
    name: str
    status: str                      # "ok" or one of outcome.FAILED
    reason: str                      # one line, "" when ok
    duration_s: float
    parameters: dict[str, Any]
    ipynb: str | None                # paths relative to the output folder
    html: str | None
    log: str
    started: str = ""


def pick_kernel(requested: str | None = None) -> str:
    """``requested`` if given, else the project kernel when installed, else ``python3``."""
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    if requested:
        if requested not in specs and requested != FALLBACK_KERNEL:
            raise InputError(f"unknown Jupyter kernel {requested!r} (installed: {', '.join(sorted(specs))})")
        return requested
    return PROJECT_KERNEL if PROJECT_KERNEL in specs else FALLBACK_KERNEL


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child and everything below it (the kernel runs in its own session), and remove the
    kernels' connection files."""
    try:
        procs = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    proc.kill()
    proc.wait()
    kill_processes(procs)


def _cells_started(ipynb: Path) -> str:
    try:
        cells = json.loads(ipynb.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError):
        return ""
    done = sum(1 for c in cells if c.get("metadata", {}).get("papermill", {}).get("start_time"))
    return f"cell {done}/{len(cells)}"


def run_notebook(path: Path, out: Path, parameters: dict[str, Any], *, kernel: str,
                 cell_timeout: float, wall_timeout: float, cwd: Path,
                 progress: TextIO | None = None, label: str = "",
                 run_info: dict[str, Any] | None = None) -> NotebookRun:
    """Execute ``path`` into ``out/<stem>.ipynb`` and ``.html``; never raises for notebook failures.

    The run writes into a hidden ``.<stem>.<hex>.run/`` folder; only a finished run (ok or failed)
    replaces the previous notebook, HTML and log. A signal, a full disk or any other exception kills
    the child and its kernel, removes the run's files (and the /tmp spec folder) and leaves the
    previous results as they were.
    """
    name = path.stem
    ipynb, html, log = out / f"{name}.ipynb", out / f"{name}.html", out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    run_dir = out / f".{name}.{secrets.token_hex(6)}.run"       # same file names, so the HTML title is
    run_dir.mkdir()                                               # the notebook's own
    running, run_html, run_log = run_dir / ipynb.name, run_dir / html.name, run_dir / log.name
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    proc = None
    try:
        with tempfile.TemporaryDirectory(prefix="wb-report-") as tmp:
            spec = {"notebook": str(path), "output": str(running), "parameters": parameters, "kernel": kernel,
                    "cell_timeout": cell_timeout, "cwd": str(cwd), "result": str(Path(tmp, "result.json"))}
            Path(tmp, "spec.json").write_text(json.dumps(spec), encoding="utf-8")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND   # the kernel's progress lines join it
            with os.fdopen(os.open(run_log, flags, 0o644), "a", encoding="utf-8") as logf:
                cmd = [sys.executable, "-m", "workbench.report.execute", str(Path(tmp, "spec.json"))]
                proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=cwd,
                                        env=_child_env(cwd, run_log, run_info))
                def tick() -> None:
                    if progress is not None and progress.isatty():
                        _status(progress, f"{label} {name}: {_cells_started(running)}  "
                                          f"{time.monotonic() - t0:5.0f} s  {bars.last_line(run_log)}")
                try:
                    result = _wait(proc, Path(spec["result"]), t0, wall_timeout, tick)
                finally:                   # a signal or an error: the child and kernel end before /tmp does
                    if proc.poll() is None:
                        _kill_tree(proc)
        duration = time.monotonic() - t0
        status, reason = result["status"], outcome.describe(result, running, cell_timeout, wall_timeout)
        has_nb = running.is_file()
        if has_nb:
            try:
                strip_stderr(running, run_log)
            except OSError:
                raise
            except Exception:  # a notebook cut off mid-write: rendering below says why there is no HTML
                pass
            try:
                render_html(running, run_html, status=status, reason=reason)
            except OSError:
                raise
            except Exception as e:  # a notebook cut off mid-write by a kill: keep the status, say why no HTML
                status = status if status != "ok" else "runner_error"
                reason = f"{reason}; no HTML: {type(e).__name__}: {e}".lstrip("; ")
        # everything is written: the new files replace the previous run's (renames need no space)
        for new, old in ((run_html, html), (running, ipynb), (run_log, log)):
            if new.is_file():
                os.replace(new, old)
            else:
                old.unlink(missing_ok=True)
    except BaseException:
        if proc is not None and proc.poll() is None:
            _kill_tree(proc)
        raise
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)              # partial saves of a killed run included
    return NotebookRun(name=name, status=status, reason=reason, duration_s=round(duration, 2),
                       parameters=parameters, ipynb=ipynb.name if has_nb else None,
                       html=html.name if html.is_file() else None, log=f"logs/{log.name}", started=started)


def _wait(proc: subprocess.Popen, result_path: Path, t0: float, wall_timeout: float,
          tick: Any) -> dict[str, Any]:
    """The child's result, or {"status": "wall_timeout"} after killing it past the wall limit."""
    while True:
        try:
            proc.wait(timeout=1.0)
            return _read_result(result_path, proc.returncode)
        except subprocess.TimeoutExpired:
            if time.monotonic() - t0 > wall_timeout:
                _kill_tree(proc)
                return {"status": "wall_timeout"}
            tick()


def _status(console: TextIO, text: str, end: str = "") -> None:
    """Rewrite the console's last line with ``text`` padded to the terminal's width (cut unless ``end``)."""
    width = max(20, shutil.get_terminal_size().columns - 1)
    console.write("\r" + (text if end else text[:width]).ljust(width) + end)
    console.flush()


def _child_env(cwd: Path, log: Path, run_info: dict[str, Any] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if run_info is not None:                                            # the header line of every page
        env[RUN_ENV] = json.dumps(run_info)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(cwd), env.get("PYTHONPATH", "")) if p)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"  # inline PNGs, even if Agg is set
    env[bars.ENV] = str(log.resolve())                                 # progress bars into the log
    return env


def _read_result(path: Path, returncode: int) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"status": "runner_error", "evalue": f"the runner's child process exited with code "
                                                    f"{returncode} without a result (see the log)"}


def resolve_parameters(path: Path, overrides: dict[str, Any], standard: dict[str, Any]) -> dict[str, Any]:
    """Defaults of the parameters cell, then ``overrides`` (checked), then ``standard`` keys it declares."""
    defaults = default_parameters(read_notebook(path), path.stem)
    check_overrides(defaults, overrides, path.stem)
    params = {**defaults, **overrides}
    params.update({k: v for k, v in standard.items() if k in defaults})
    return params


def _unlink_ignored(run: NotebookRun, out: Path, root: Path) -> None:
    """In a committed folder (the showcase), drop the links to files git ignores: no clone has them."""
    if not out.resolve().is_relative_to(root) or provenance_ignored(root, [out.resolve()]):
        return
    for field in ("ipynb", "html", "log"):
        rel = getattr(run, field)
        if rel and provenance_ignored(root, [out.resolve() / rel]):
            setattr(run, field, None)


def run_report(paths: list[Path], out: Path, *, profile: str, overrides: dict[str, dict[str, Any]],
               kernel: str, cell_timeout: float, wall_timeout: float, cwd: Path,
               provenance: dict[str, Any], progress: TextIO | None = None) -> list[NotebookRun]:
    """Run every notebook in order, then write ``manifest.json`` and ``index.html`` under ``out``.

    One run at a time per folder: a second ``report`` into the same ``out`` is refused (InputError)
    while the first holds ``out/.report.lock``.
    """
    out.mkdir(parents=True, exist_ok=True)
    with _folder_lock(out):
        return _run_all(paths, out, profile=profile, overrides=overrides, kernel=kernel,
                        cell_timeout=cell_timeout, wall_timeout=wall_timeout, cwd=cwd,
                        provenance=provenance, progress=progress)


LOCK = ".report.lock"


@contextlib.contextmanager
def _folder_lock(out: Path):
    """An exclusive flock on ``out/.report.lock`` for the run (released by the kernel if we die)."""
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another report is running into {out} (it holds {out / LOCK}); "
                             "wait for it or pick another --out") from None
        yield
    finally:
        os.close(fd)


def _run_all(paths: list[Path], out: Path, *, profile: str, overrides: dict[str, dict[str, Any]],
             kernel: str, cell_timeout: float, wall_timeout: float, cwd: Path,
             provenance: dict[str, Any], progress: TextIO | None = None) -> list[NotebookRun]:
    out_abs, root = out.resolve(), cwd.resolve()
    # relative to the kernel's working directory when inside it, so committed reports name no machine path
    out_param = str(out_abs.relative_to(root)) if out_abs.is_relative_to(root) else str(out_abs)
    standard = {"profile": profile, "out_dir": out_param}
    plans = [(p, resolve_parameters(p, overrides.get(p.stem, {}), standard)) for p in paths]
    bench = next((params[k] for k in ("depth_bench_dir", "bench_dir") for _, params in plans if k in params),
                 "reports/bench")                       # the sets the notebooks read, for the answer on top
    head = answer.write(out, root / bench, shown=bench)
    runs: list[NotebookRun] = []
    for i, (path, params) in enumerate(plans, 1):
        label = f"[{i}/{len(plans)}]"
        run = run_notebook(path, out, params, kernel=kernel, cell_timeout=cell_timeout,
                           wall_timeout=wall_timeout, cwd=cwd, progress=progress, label=label,
                           run_info={k: provenance.get(k) for k in ("git", "gpus")})
        _unlink_ignored(run, out, root)
        runs.append(run)
        if progress is not None:
            mark = "ok" if run.status == "ok" else f"FAILED ({run.status}: {run.reason})"
            line = f"{label} {run.name}: {mark}  {run.duration_s:.1f} s"
            if progress.isatty():
                _status(progress, line, end="\n")
            else:
                progress.write(line + "\n")
                progress.flush()
        manifest = {"profile": profile, "kernel": kernel, "cell_timeout_s": cell_timeout,
                    "wall_timeout_s": wall_timeout, "provenance": provenance, "headline": head,
                    "notebooks": [asdict(r) for r in runs],
                    "pending": [p.stem for p, _ in plans[i:]]}
        write_json_atomic(out / "manifest.json", manifest)
        write_index(out / "index.html", manifest)
    return runs
