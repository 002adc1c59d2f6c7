"""Progress bars for long notebook loops, kept out of the reports.

Interactively (JupyterLab, a console) the bar is tqdm on stdout, in the cell. Under the report
runner, which names its log file in WORKBENCH_PROGRESS, the bar goes to that log instead, one
line per update prefixed ``progress:``, and the runner shows the latest one on the console: the
executed notebook and its HTML never hold progress text.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

ENV = "WORKBENCH_PROGRESS"
PREFIX = "progress: "


class LogLines:
    """A file for tqdm that appends each update to ``path`` as its own prefixed line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, text: str) -> int:
        lines = [ln.strip() for ln in text.replace("\r", "\n").split("\n") if ln.strip()]
        if lines:
            with open(self.path, "a", encoding="utf-8") as f:   # O_APPEND: safe beside papermill's own log
                f.write("".join(f"{PREFIX}{ln}\n" for ln in lines))
        return len(text)

    def flush(self) -> None:
        pass


def progress(iterable: Iterable[Any], desc: str, total: int | None = None) -> Any:
    """tqdm over ``iterable`` with an ASCII bar and a fixed width: into the runner's log when the
    runner set WORKBENCH_PROGRESS (an update every 10 s at most), else on stdout (every 2 s)."""
    log = os.environ.get(ENV)
    if log:
        return tqdm(iterable, desc=desc, total=total, file=LogLines(log), ascii=True, ncols=100,
                    mininterval=10.0)
    return tqdm(iterable, desc=desc, total=total, file=sys.stdout, ascii=True, ncols=100, mininterval=2.0)


def last_line(log: str | os.PathLike, tail_bytes: int = 8192) -> str:
    """The latest progress line in ``log`` without its prefix ('' if none), from the file's tail."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    found = [ln[len(PREFIX):] for ln in tail.splitlines() if ln.startswith(PREFIX)]
    return found[-1].strip() if found else ""
