"""Console progress for the commands: tqdm on stderr while stderr is a terminal, silent otherwise
(pipes, CI logs, notebooks, papermill), so no bar ends up in a report or a captured output."""

from __future__ import annotations

import sys
from typing import Any


def on_console() -> bool:
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def bar(total: int, desc: str, unit: str = "it") -> Any:
    """A tqdm bar of ``total`` steps on stderr (disabled off a terminal); ``.update(n)``, ``.close()``."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, ascii=True, ncols=100, mininterval=0.5,
                leave=False, disable=not on_console())


def status(text: str) -> None:
    """One line on stderr saying what a long step is doing (on a terminal only)."""
    if on_console():
        print(text, file=sys.stderr, flush=True)
