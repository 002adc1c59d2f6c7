"""Typed errors shared by the library. Each carries a one-line message for the CLI."""

from numformats.errors import InputError


class UserError(Exception):
    """Bad input or arguments: reported as one line, exit code 2 (``workbench.cli``)."""


__all__ = ["InputError", "UserError"]
