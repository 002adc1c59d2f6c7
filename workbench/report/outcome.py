"""Turn how a notebook run ended into a status and a one-line reason, from its partial notebook.

papermill marks only a raising cell; after a cell timeout, a dead kernel or a wall-clock kill the
saved notebook still says "completed" everywhere. The cell that was running is the last one with
a recorded ``metadata.papermill.start_time`` (papermill saves the notebook at every cell start).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat

FAILED = ("error", "timeout", "dead_kernel", "wall_timeout", "runner_error", "not_run")


def running_cell(ipynb: Path) -> tuple[int, str] | None:
    """(1-based code-cell number in the source notebook, first source line) of the last started cell."""
    if not ipynb.is_file():
        return None
    try:
        nb = nbformat.read(ipynb, as_version=4)
    except Exception:  # a half-written or corrupt partial notebook: no location, still a failure
        return None
    found, number = None, 0
    for cell in nb.cells:
        if cell.cell_type != "code" or "injected-parameters" in cell.metadata.get("tags", []):
            continue
        number += 1
        if cell.metadata.get("papermill", {}).get("start_time"):
            first = next((ln.strip() for ln in cell.source.splitlines() if ln.strip()), "")
            found = (number, first[:60])
    return found


def describe(result: dict[str, Any], ipynb: Path, cell_timeout: float, wall_timeout: float) -> str:
    """One-line reason for a failed status ('' for ok)."""
    status = result["status"]
    if status == "ok":
        return ""
    where = running_cell(ipynb)
    at = f"code cell {where[0]} (`{where[1]}`)" if where else "an unknown cell"
    if status == "error":
        return f"{at} raised {result.get('ename', '?')}: {result.get('evalue', '')}".strip()
    if status == "timeout":
        return f"{at} ran past the per-cell limit of {cell_timeout:g} s"
    if status == "dead_kernel":
        return f"the kernel died during {at} (killed, aborted or crashed)"
    if status == "wall_timeout":
        return f"the notebook ran past its wall limit of {wall_timeout:g} s; killed during {at}"
    return result.get("evalue") or status
