"""Child process of the runner: execute one notebook with papermill, record how it ended.

``python -m workbench.report.execute SPEC.json`` reads {notebook, output, parameters, kernel,
cell_timeout, cwd, result}, runs papermill and writes the result JSON
{status, ename, evalue, cell_index}. Status is ``ok``, ``error`` (a cell raised), ``timeout`` (a
cell ran past cell_timeout), ``dead_kernel`` or ``runner_error``. The runner enforces the
whole-notebook wall limit from outside by killing this process and its kernel.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from ..fileio import write_json_atomic, write_text_atomic


def _atomic_local_writes() -> None:
    """papermill rewrites the output notebook at every cell start; a kill during a plain write
    (open with O_TRUNC, then write) leaves it empty or cut, so each save goes to a temporary file
    renamed over the old one. papermill resolves the *last* registered "local" handler, so the stock
    one is replaced rather than shadowed; RuntimeError if papermill would still pick another."""
    from papermill.iorw import LocalHandler, papermill_io
    from papermill.utils import chdir

    class AtomicLocalHandler(LocalHandler):
        def write(self, buf, path):
            with chdir(self._cwd):
                write_text_atomic(path, buf)

    handler = AtomicLocalHandler()
    papermill_io._handlers = [(s, h) for s, h in papermill_io._handlers if s != "local"]
    papermill_io.register("local", handler)
    if papermill_io.get_handler("x.ipynb") is not handler:
        raise RuntimeError("papermill does not use the atomic notebook writer")


def execute(spec: dict[str, Any]) -> dict[str, Any]:
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from papermill.exceptions import PapermillExecutionError

    from .params import read_notebook

    _atomic_local_writes()
    nb = read_notebook(spec["notebook"])
    nb.metadata["kernelspec"] = {"name": spec["kernel"], "display_name": spec["kernel"], "language": "python"}
    try:
        papermill.execute_notebook(
            nb, spec["output"], parameters=spec["parameters"], kernel_name=spec["kernel"],
            language="python", cwd=spec["cwd"], execution_timeout=spec["cell_timeout"],
            log_output=True, progress_bar=False, request_save_on_cell_execute=True)
    except PapermillExecutionError as e:
        return {"status": "error", "ename": e.ename, "evalue": str(e.evalue),
                "cell_index": e.cell_index}
    except CellTimeoutError as e:
        return {"status": "timeout", "ename": "CellTimeoutError", "evalue": str(e).strip()}
    except DeadKernelError as e:
        return {"status": "dead_kernel", "ename": "DeadKernelError", "evalue": str(e).strip()}
    except Exception as e:  # anything else papermill or the kernel manager raises
        return {"status": "runner_error", "ename": type(e).__name__, "evalue": str(e).strip()}
    return {"status": "ok"}


def kill_processes(procs: list[Any]) -> None:
    """SIGKILL ``procs`` (psutil.Process; a kernel among them) and remove the kernels' connection files
    (``-f FILE.json`` on their command lines), which a killed client never gets to delete."""
    import contextlib
    import os

    import psutil

    files = []
    for p in procs:
        try:
            args = p.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        files += [b for a, b in zip(args, args[1:], strict=False) if a == "-f" and b.endswith(".json")]
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    for f in files:
        with contextlib.suppress(OSError):
            os.unlink(f)


def _orphan_watchdog(spec_path: str, spec: dict[str, Any], poll_s: float = 1.0) -> None:
    """End this process and its kernel when the runner dies without killing us (SIGKILL): a kernel
    left alone would keep rewriting the notebook and the log. The runner's temp folders (the spec's,
    the run's ``.<name>.<hex>.run``) go too, since the runner cannot remove them any more."""
    import os
    import shutil
    import threading
    import time
    from pathlib import Path

    import psutil

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        kill_processes(psutil.Process().children(recursive=True))
        run_dir = Path(spec["output"]).parent
        for folder in (Path(spec_path).parent, run_dir if run_dir.name.endswith(".run") else None):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="orphan-watchdog").start()


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # papermill's per-cell log
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    _orphan_watchdog(argv[0], spec)
    write_json_atomic(spec["result"], execute(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
