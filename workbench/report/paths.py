"""The repository root, found from the package's own location, for notebooks whose kernel starts
anywhere (the report runner, JupyterLab, ``jupyter nbconvert --execute`` from another folder)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def enter_repo() -> None:
    """Make the repository root the working directory: a notebook's relative paths (``refs/``,
    ``models/``, ``reports/``) then name the repository's files wherever its kernel started."""
    os.chdir(ROOT)
