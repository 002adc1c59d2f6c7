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


def clear() -> Any:
    """A context in which stdout can be written on a terminal without breaking the bars on stderr."""
    if not on_console():
        import contextlib
        return contextlib.nullcontext()
    from tqdm import tqdm
    return tqdm.external_write_mode(file=sys.stdout)


def status(text: str) -> None:
    """One line on stderr saying what a long step is doing (on a terminal only)."""
    if on_console():
        print(text, file=sys.stderr, flush=True)


class Steps:
    """The callback ``steps(done, total, what)`` a library loop reports to (its ``progress`` argument):
    one bar named ``name: what`` on a terminal, nothing elsewhere; ``close()`` when the command is done."""

    def __init__(self, name: str, unit: str = "step") -> None:
        self.name, self.unit, self._bar = name, unit, None

    def __call__(self, done: int, total: int, what: str = "") -> None:
        if not on_console():
            return
        if self._bar is None or self._bar.total != total or done < self._bar.n:    # a new loop: a new bar
            self.close()
            self._bar = bar(total, self.name, self.unit)
        self._bar.set_description_str(f"{self.name}: {what}" if what else self.name, refresh=False)
        self._bar.update(max(0, done - self._bar.n))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
