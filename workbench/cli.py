"""``python -m workbench``: one argparse front end; each subcommand lives in workbench/commands/.

Exit codes: 0 success, 2 bad input or arguments (one line on stderr, no traceback), 1 internal error,
128 + N when signal N ends the run (130 SIGINT, 143 SIGTERM, 129 SIGHUP; one line).
Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``; it raises
``UserError`` (or a library error listed in ``_user_errors``) for bad input; an OSError naming a
path (missing folder, permission, a full disk) is also reported as one line. Every int / float
option is checked at parse time by ``numeric`` (finite, within OPTION_BOUNDS or 32-bit ints),
installed on every subcommand's options by ``bound_numeric_options``.
SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` (a KeyboardInterrupt), so every atomic
writer's cleanup and every command's ``finally`` runs before the process exits. The catalogue of
bad input and what each gets is docs/bad-input.md.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import math
import os
import signal
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import UserError

# subcommand -> (module under workbench.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build-refs": ("build_refs", "regenerate the golden bundles in refs/"),
    "inspect": ("inspect", "validate a bundle and print its config, tensors, prompt and goldens"),
    "generate": ("generate", "greedy (or sampled) decoding of a bundle"),
    "import-hf": ("import_hf", "convert a HF DeepseekV3 / Kimi-K2 checkpoint directory to a bundle"),
    "export-hf": ("export_hf", "write a bundle as a HF checkpoint directory transformers loads"),
    "quantize": ("quantize", "quantize a bundle's MLP or routed-expert weights to INT4 W4A16 (--policy)"),
    "bench": ("bench", "GPU benchmarks: kernels, engine, k2, ep, pair, depth (bench NAME --help)"),
    "report": ("report", "run the notebooks with papermill into HTML reports"),
    "train": ("train", "train the small code model and its DFlash drafter, export their bundles"),
    "measure": ("measure", "acceptance (tau vs budget, DFlash chain, expert union) and INT4 drift of a pair"),
}


class Interrupted(KeyboardInterrupt):
    """Raised by the SIGTERM / SIGHUP handler: unwinds like Ctrl-C, so cleanups run; exit 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def check_out_file(path: str | os.PathLike) -> None:
    """Raise UserError unless ``path`` can be written as a file: a regular file or nothing yet, in an
    existing folder. A FIFO, device node or socket is refused (replacing /dev/null with a file would
    break the system).

    Commands call it before their work, so a mistyped output path fails at once with one line.
    """
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{path} is a directory; give a file path")
    if p.exists() and not stat.S_ISREG(p.stat().st_mode):
        raise UserError(f"{path} exists and is not a regular file (a FIFO or device?); give a file path")
    if not p.absolute().parent.is_dir():
        raise UserError(f"{path}: folder {p.absolute().parent} does not exist")


def check_out_dir(path: str | os.PathLike) -> None:
    """Raise UserError when ``path`` exists and is not a directory (commands that write a folder)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"{path} exists and is not a folder")


# ---- numeric options -------------------------------------------------------------------------
MAX_BUDGET = 1024          # DDTree nodes per round (also bounded by the model's context at run time)
MAX_TOKENS = 1 << 20       # new tokens per prompt (also bounded by the model's context at run time)
INT32 = 2**31 - 1
# option -> (lowest, highest, lowest excluded); every other int option is a 32-bit int, every float finite
OPTION_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "--budget": (1, MAX_BUDGET, False),
    "--tokens": (1, MAX_TOKENS, False),
    "--drift-tokens": (1, MAX_TOKENS, False),
    "--prompts": (1, 1_000_000, False),
    "--drift-prompts": (1, 1_000_000, False),
    "--seed": (0, 2**63 - 1, False),
    "--workers": (1, 1024, False),
    "--threads": (1, 1024, False),
    "--oracle-p": (0.0, 1.0, False),
    "--temperature": (0.0, 1e6, False),
    "--max-shard-mb": (0.0, 2.0**20, True),
    "--target-minutes": (0.0, 1e5, False),
    "--drafter-minutes": (0.0, 1e5, False),
    "--target-steps": (1, 10**9, False),
    "--drafter-steps": (1, 10**9, False),
}


def parse_number(text: str, kind: type, lo: float | None = None, hi: float | None = None,
                 open_lo: bool = False) -> Any:
    """``kind(text)`` (int or float) checked finite and within [lo, hi] (lo excluded when open_lo).

    ValueError with a one-line reason otherwise (argparse turns it into "invalid ... value").
    """
    text = str(text).strip()
    if kind is int:
        if len(text.lstrip("+-")) > 20 or not text.lstrip("+-").isdigit():  # no 5000-digit ints
            raise ValueError(f"not an integer: {text[:40]!r}")
        v: Any = int(text, 10)
        lo = -INT32 if lo is None else lo
        hi = INT32 if hi is None else hi
    else:
        if len(text) > 64:
            raise ValueError(f"not a number: {text[:40]!r}...")
        v = float(text)
        if not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {text!r}")
    if lo is not None and (v <= lo if open_lo else v < lo):
        raise ValueError(f"must be {'>' if open_lo else '>='} {_show(lo)}, got {text}")
    if hi is not None and v > hi:
        raise ValueError(f"must be <= {_show(hi)}, got {text}")
    return v


def _show(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 2**63 else f"{bound:g}"


def numeric(kind: type, lo: float | None = None, hi: float | None = None,
            open_lo: bool = False) -> Callable[[str], Any]:
    """The argparse ``type`` of a bounded int or finite float option (see parse_number)."""
    def parse(text: str) -> Any:
        try:
            return parse_number(text, kind, lo, hi, open_lo)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    parse.__name__ = kind.__name__
    return parse


def existing_file(path: str) -> str:
    """argparse ``type`` of an input file: "no such file: PATH" (exit 2) before any work starts."""
    if not os.path.lexists(path):
        raise UserError(f"no such file: {path}")
    return path


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the help already names one (options whose
    default is None say in words what happens without them; on/off flags need none)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or not action.option_strings or action.nargs == 0
                or action.default in (None, argparse.SUPPRESS)):
            return text
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw) -> None:
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kw)

    def error(self, message: str) -> None:  # argparse's default prints usage; keep it one line
        raise UserError(f"{self.prog}: {message}")


def bound_numeric_options(parser: argparse.ArgumentParser) -> None:
    """Give every ``type=int`` / ``type=float`` option of ``parser`` (argument groups and nested
    subcommands such as ``bench NAME`` included) the ``numeric`` check: finite, bounds from OPTION_BOUNDS
    (else a 32-bit int / any finite float)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                bound_numeric_options(sub)
        elif action.type in (int, float):
            lo, hi, open_lo = next((OPTION_BOUNDS[n] for n in action.option_strings if n in OPTION_BOUNDS),
                                   (None, None, False))
            action.type = numeric(action.type, lo, hi, open_lo)


def version_text() -> str:
    """'kdtree-workbench 0.1.0 (git abc1234)': the package version and, in a git checkout, its commit."""
    import subprocess

    from . import __version__
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"kdtree-workbench {__version__}" + (f" (git {sha})" if sha else "")


class _Version(argparse.Action):
    """--version: computed when asked (it runs git), not each time the parser is built."""

    def __init__(self, option_strings, dest, **kw) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit()


def _user_errors() -> tuple[type[BaseException], ...]:
    from .bundle import BundleFormatError
    from .config import ConfigError
    from .errors import InputError
    return UserError, ConfigError, BundleFormatError, InputError


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported (commands pull in heavy libraries)."""
    parser = _Parser(prog="python -m workbench", description="kdtree-workbench command line")
    parser.add_argument("--version", action=_Version, help="print the package version and git commit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(f"workbench.commands.{module}").add_arguments(p)
            bound_numeric_options(p)
    return parser


# write errors that are the machine's state, not a bug: one line even when no path is attached
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EFBIG, errno.EIO}
_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


def _raise_interrupted(signum: int, frame: Any) -> None:
    for s in _SIGNALS:                       # a second signal must not cut the cleanup short
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signum)


def _install_signal_handlers() -> dict[int, Any]:
    """SIGINT / SIGTERM / SIGHUP -> Interrupted (a KeyboardInterrupt); returns the old handlers."""
    old: dict[int, Any] = {}
    try:
        for s in _SIGNALS:
            old[s] = signal.signal(s, _raise_interrupted)
    except ValueError:                       # not the main thread (main() called from a worker)
        pass
    return old


def _error(text: str) -> None:
    print("error: " + " ".join(str(text).split()), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    user_errors = _user_errors()
    old = _install_signal_handlers()
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        command = next((a for a in argv if not a.startswith("-")), None)
        args = build_parser(command).parse_args(argv)
        return int(importlib.import_module(f"workbench.commands.{args._module}").run(args) or 0)
    except user_errors as e:
        _error(str(e))
        return 2
    except KeyboardInterrupt as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        _error(f"interrupted by {signal.Signals(signum).name}")
        return 128 + signum
    except BrokenPipeError:
        return 0
    except OSError as e:  # an unwritable or unreadable path the user gave, a full disk: one line
        if e.filename is None and e.errno not in _WRITE_ERRNOS:
            raise
        where = f"{e.filename}: " if e.filename is not None else ""
        _error(f"{where}{e.strerror or e}")
        return 2
    except MemoryError:  # a last resort: inputs are size-checked before large allocations
        _error("out of memory (the input asks for more than this machine has)")
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
