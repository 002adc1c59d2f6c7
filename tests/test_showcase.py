"""dev/showcase/: the wheels that carry the report's packages to the GPU machine stay complete
(every runtime dependency of papermill, nbconvert, jupytext, ipykernel and pandas is carried, on the
image, or interactive-only) and in step with pyproject.toml's pins; the scripts parse."""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SHOWCASE = ROOT / "dev" / "showcase"
ROOTS = ("papermill", "nbconvert", "jupytext", "ipykernel", "pandas")
GPU_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_list() -> tuple[dict[str, str], set[str], set[str]]:
    """(pins name -> version, names on the image, names left out as interactive-only)."""
    pins, lists = {}, {"image": set(), "interactive": set()}
    for line in (SHOWCASE / "wheels.txt").read_text().splitlines():
        if m := re.fullmatch(r"# (image|interactive): (.+)", line.strip()):
            lists[m[1]] |= {norm(n) for n in m[2].split()}
        elif line and not line.startswith("#"):
            name, version = line.split("==")
            assert norm(name) not in pins, f"{name} listed twice"
            pins[norm(name)] = version
    return pins, lists["image"], lists["interactive"]


def runtime_closure(roots: tuple[str, ...]) -> set[str]:
    """Names of ``roots`` and everything they require on the GPU machine's Python, from the installed
    metadata (a requirement not installed here, such as one only python 3.12 needs, is a leaf)."""
    env = {**default_environment(), **GPU_PYTHON, "extra": ""}
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [r.name for r in map(Requirement, requires) if r.marker is None or r.marker.evaluate(env)]
    return seen


def test_every_runtime_dependency_is_carried_or_on_the_image():
    pins, image, interactive = wheel_list()
    assert not (set(pins) & (image | interactive)) and not (image & interactive)
    missing = runtime_closure(ROOTS) - set(pins) - image - interactive
    assert not missing, f"add to dev/showcase/wheels.txt (or name them on the image): {sorted(missing)}"
    assert set(ROOTS) <= set(pins)


def test_carried_versions_are_the_pinned_ones():
    pins, _, _ = wheel_list()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = {norm(Requirement(r).name): str(Requirement(r).specifier).removeprefix("==") for r in project}
    both = set(pins) & set(pinned)
    assert {"numpy", "cffi", "pandas", "papermill", "nbconvert", "jupytext", "ipykernel"} <= both
    assert {n: pins[n] for n in both} == {n: pinned[n] for n in both}


def test_scripts_parse():
    for script in ("fetch_wheels.sh", "render_gpu.sh"):
        subprocess.run(["bash", "-n", str(SHOWCASE / script)], check=True)
