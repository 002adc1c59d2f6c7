"""JupyterLab on the notebooks: jupytext's contents manager (py:percent files open as notebooks,
paired per notebooks/jupytext.toml), with every kernel started at the repository root, as the
report runner starts them, so that the notebooks' relative paths (refs/, reports/) mean the same.

lab/jupyter_server_config.py names this class; ``make lab`` starts JupyterLab with that config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupytext import AsyncTextFileContentsManager

REPO = Path(__file__).resolve().parents[1]


class RepoContentsManager(AsyncTextFileContentsManager):
    async def get_kernel_path(self, path: str, model: Any = None) -> str:
        """The repository root as an API path when the server's root holds it, else jupyter's default."""
        try:
            rel = REPO.relative_to(Path(self.root_dir).resolve())
        except ValueError:
            return await super().get_kernel_path(path, model)
        return "" if rel == Path(".") else rel.as_posix()
