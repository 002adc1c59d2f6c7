"""Progress bars for long notebook loops: plain-text tqdm on stdout, so the executed notebook and
its HTML keep one final line per loop as an ordinary output (stderr would render as an error box)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


def progress(iterable: Iterable[Any], desc: str, total: int | None = None) -> Any:
    """tqdm over ``iterable`` with an ASCII bar and a fixed width. Interactively it updates every 2 s;
    under the report runner (WORKBENCH_REPORT=1), whose HTML keeps every update as a line, every 60 s."""
    every = 60.0 if os.environ.get("WORKBENCH_REPORT") == "1" else 2.0
    return tqdm(iterable, desc=desc, total=total, file=sys.stdout, ascii=True, ncols=100, mininterval=every)
