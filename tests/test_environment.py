"""environment.yml (conda) and pyproject.toml pin the same Python packages at the same versions."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    """'Numba-CUDA[cu13] == 0.30.4' -> 'numba-cuda[cu13]==0.30.4' (PEP 503 name, no spaces)."""
    req = req.replace(" ", "")
    m = re.match(r"^([A-Za-z0-9._-]+)(.*)$", req)
    if m is None:
        raise ValueError(f"unparsable requirement {req!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower() + m.group(2)


def pyproject_requirements() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"])
    for extra in data["project"].get("optional-dependencies", {}).values():
        reqs += extra
    return {_norm(r) for r in reqs}


def environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def environment_pip() -> list[str]:
    pip = [d["pip"] for d in environment()["dependencies"] if isinstance(d, dict) and "pip" in d]
    if len(pip) != 1:
        raise ValueError("environment.yml needs exactly one pip: section")
    return pip[0]


def test_same_pinned_packages():
    env = {_norm(r) for r in environment_pip() if not r.startswith("-e")}
    py = pyproject_requirements()
    assert env == py, f"only in environment.yml: {sorted(env - py)}; only in pyproject: {sorted(py - env)}"


def test_every_pin_is_exact():
    for r in pyproject_requirements():
        assert re.fullmatch(r"[a-z0-9-]+(\[[a-z0-9,-]+\])?==[0-9][0-9a-z.+]*", r), r


def test_python_and_pip_match_pyproject():
    deps = [d for d in environment()["dependencies"] if isinstance(d, str)]
    assert "pip" in deps  # conda must install pip itself before the pip: section
    pythons = [d for d in deps if d.startswith("python")]
    assert pythons == ["python=3.11"]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert ">=3.11" in requires
    assert "-e ." in environment_pip()  # the workbench package itself, editable


def test_normalisation_catches_differences():
    assert _norm("Numba_CUDA[cu13] == 0.30.4") == "numba-cuda[cu13]==0.30.4"
    assert _norm("numpy==2.4.6") != _norm("numpy==2.4.5")
