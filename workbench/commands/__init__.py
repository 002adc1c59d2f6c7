"""One module per CLI subcommand (see workbench/cli.py)."""
