"""Typed errors shared by the library. Each carries a one-line message for the CLI."""


class InputError(ValueError):
    """Bad user input (prompt token past the vocab, unknown option value, wrong shape...)."""
