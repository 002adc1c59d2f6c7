"""``python -m workbench``: one argparse front end; each subcommand lives in workbench/commands/.

Exit codes: 0 success, 2 bad input or arguments (one line on stderr, no traceback), 1 internal error.
Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``; it raises
``UserError`` (or a library error listed in ``_user_errors``) for bad input; an OSError naming a
path (missing folder, permission) is also reported as one line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

# subcommand -> (module under workbench.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "build-refs": ("build_refs", "regenerate the golden bundles in refs/"),
    "inspect": ("inspect", "validate a bundle and print its config, tensors, prompt and goldens"),
    "generate": ("generate", "greedy (or sampled) decoding of a bundle"),
    "import-hf": ("import_hf", "convert a HF DeepseekV3 / Kimi-K2 checkpoint directory to a bundle"),
    "export-hf": ("export_hf", "write a bundle as a HF checkpoint directory transformers loads"),
    "quantize": ("quantize", "quantize a bundle's MLP or routed-expert weights to INT4 W4A16 (--policy)"),
    "bench": ("bench", "GPU benchmarks: {benches} (bench NAME --help)"),
    "report": ("report", "run the notebooks with papermill into HTML reports"),
    "train": ("train", "train the small code model and its DFlash drafter, export their bundles"),
    "measure": ("measure", "acceptance (tau vs budget, DFlash chain, expert union) and INT4 drift of a pair"),
}


class UserError(Exception):
    """Bad input or arguments: reported as one line, exit code 2."""


def check_out_file(path: str | os.PathLike) -> None:
    """Raise UserError unless ``path`` can be written as a file: not a directory, in an existing folder.

    Commands call it before their work, so a mistyped output path fails at once with one line.
    """
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{path} is a directory; give a file path")
    if not p.absolute().parent.is_dir():
        raise UserError(f"{path}: folder {p.absolute().parent} does not exist")


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
        if "{benches}" in help_text:             # named by commands/bench.py's table (stdlib imports only)
            from .commands.bench import BENCHES
            help_text = help_text.format(benches=", ".join(BENCHES))
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(f"workbench.commands.{module}").add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    user_errors = _user_errors()
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        command = next((a for a in argv if not a.startswith("-")), None)
        args = build_parser(command).parse_args(argv)
        return int(importlib.import_module(f"workbench.commands.{args._module}").run(args) or 0)
    except user_errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # an unwritable or unreadable path the user gave: one line, not a traceback
        if e.filename is None:
            raise
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return int(e.code or 0)


if __name__ == "__main__":
    sys.exit(main())
