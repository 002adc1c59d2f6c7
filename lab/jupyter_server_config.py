# JupyterLab for kdtree-workbench, loaded by `make lab` (JUPYTER_CONFIG_PATH=lab) on top of the venv's
# own config (which enables the jupyterlab and jupytext server extensions).
from pathlib import Path

c = get_config()  # noqa: F821 (provided by the config loader)

# jupytext's contents manager, starting kernels at the repository root (workbench/lab.py)
c.ServerApp.contents_manager_class = "workbench.lab.RepoContentsManager"
c.ServerApp.root_dir = str(Path(__file__).resolve().parents[1])
# the project's kernel for notebooks that name none (make installs it into the venv)
c.MappingKernelManager.default_kernel_name = "kdtree-workbench"
# lab/settings/overrides.json: a double-click opens a .py file as a jupytext notebook
c.LabApp.app_settings_dir = str(Path(__file__).resolve().parent / "settings")
# the file browser opens on the notebooks
c.ContentsManager.preferred_dir = "notebooks"
