"""The training text: Python sources of pinned pure-Python packages, fixed by a committed manifest.

Why these packages: their wheels are ``py3-none-any``, so the files are byte-identical on every Python
version and platform (the standard library is not: 3.11 and 3.12 differ). They are pinned in
pyproject.toml; their sources are read from the installed distributions or, where another version is
installed (a GPU image), straight from the pinned wheels in a folder (``--wheels``), never installed.

Selection rule (``select_files``): every ``*.py`` file a distribution's RECORD lists, in path order,
of ``MIN_BYTES`` to ``MAX_BYTES`` bytes, valid UTF-8, sharing no text with any HumanEval prompt
(``humaneval.OverlapProbe``). Split: a file is held out when the first 8 hex digits of the sha256 of
its path are divisible by ``HELDOUT_EVERY``. The manifest (``data/corpus_manifest.json``) records path,
sha256, size and split of every file; ``read_corpus`` refuses any file whose bytes differ.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..fileio import write_text_atomic
from .humaneval import OverlapProbe, load_problems

PACKAGES = {"networkx": "3.6.1", "sympy": "1.14.0", "mpmath": "1.3.0"}   # pinned in pyproject.toml
MIN_BYTES = 256
MAX_BYTES = 200_000
HELDOUT_EVERY = 32
MANIFEST = Path(__file__).resolve().parents[2] / "data" / "corpus_manifest.json"
FORMAT = 1


@dataclass(frozen=True)
class CorpusFile:
    dist: str
    path: str              # path inside site-packages (= inside the wheel)
    sha256: str
    nbytes: int
    split: str             # "train" or "heldout"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split_of(path: str) -> str:
    return "heldout" if int(sha256(path.encode())[:8], 16) % HELDOUT_EVERY == 0 else "train"


class Source:
    """Reads the files of one pinned distribution: installed (same version) or from its wheel."""

    def __init__(self, dist: str, version: str, wheels: str | Path | None = None) -> None:
        self.dist, self.version, self._zip, self._dist = dist, version, None, None
        try:
            d = md.distribution(dist)
            if d.version == version:
                self._dist = d
        except md.PackageNotFoundError:
            pass
        if self._dist is None and wheels is not None:
            hits = sorted(Path(wheels).glob(f"{dist}-{version}-py3-none-any.whl"))
            if hits:
                self._zip = zipfile.ZipFile(hits[0])
        if self._dist is None and self._zip is None:
            where = (f"and no {dist}-{version}-py3-none-any.whl in {wheels}" if wheels
                     else "(give --wheels DIR)")
            raise InputError(f"corpus package {dist}=={version} is not installed {where}")

    def names(self) -> list[str]:
        """Every file the distribution ships (RECORD order is not relied on: sorted)."""
        if self._dist is not None:
            return sorted(str(f) for f in (self._dist.files or []))
        return sorted(n for n in self._zip.namelist() if not n.endswith("/"))

    def read(self, path: str) -> bytes:
        try:
            if self._dist is not None:
                return Path(self._dist.locate_file(path)).read_bytes()
            return self._zip.read(path)
        except (OSError, KeyError):
            raise InputError(f"corpus file {path} is missing from {self.dist}=={self.version}") from None


def select_files(wheels: str | Path | None = None, packages: dict[str, str] = PACKAGES) -> dict[str, Any]:
    """The manifest dict the selection rule gives on this machine (see the module docstring)."""
    probe = OverlapProbe.of([p.prompt for p in load_problems(wheels)])
    files, excluded = [], []
    for dist, version in sorted(packages.items()):
        src = Source(dist, version, wheels)
        for path in src.names():
            if not path.endswith(".py") or ".dist-info/" in path:
                continue
            data = src.read(path)
            if not MIN_BYTES <= len(data) <= MAX_BYTES:
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if probe.shared(text) is not None:
                excluded.append(path)
                continue
            files.append({"dist": dist, "path": path, "sha256": sha256(data), "bytes": len(data),
                          "split": split_of(path)})
    return {"format": FORMAT, "packages": dict(sorted(packages.items())),
            "rule": {"min_bytes": MIN_BYTES, "max_bytes": MAX_BYTES, "heldout_every": HELDOUT_EVERY,
                     "humaneval_overlap_excluded": excluded},
            "files": files}


def write_manifest(manifest: dict[str, Any], path: str | Path = MANIFEST) -> Path:
    return write_text_atomic(path, json.dumps(manifest, indent=0, sort_keys=True) + "\n")


def load_manifest(path: str | Path = MANIFEST) -> tuple[dict[str, Any], str]:
    """(manifest, sha256 of the file's bytes); InputError for a missing or malformed file."""
    try:
        raw = Path(path).read_bytes()
        m = json.loads(raw)
    except OSError as e:
        raise InputError(f"corpus manifest {path}: {e.strerror}") from None
    except ValueError:
        raise InputError(f"corpus manifest {path} is not valid JSON") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT or not isinstance(m.get("files"), list):
        raise InputError(f"corpus manifest {path} is not a format-{FORMAT} manifest")
    return m, sha256(raw)


def read_corpus(manifest: dict[str, Any], wheels: str | Path | None = None,
                split: str | None = None) -> Iterator[tuple[CorpusFile, str]]:
    """(file, text) of every manifest file (of ``split`` if given), in manifest order; InputError naming
    the first file that is missing or whose sha256 differs from the manifest's."""
    sources = {d: Source(d, v, wheels) for d, v in manifest["packages"].items()}
    for f in manifest["files"]:
        cf = CorpusFile(f["dist"], f["path"], f["sha256"], int(f["bytes"]), f["split"])
        if split is not None and cf.split != split:
            continue
        data = sources[cf.dist].read(cf.path)
        got = sha256(data)
        if got != cf.sha256:
            raise InputError(f"corpus file {cf.path}: sha256 {got[:12]}... differs from the manifest's "
                             f"{cf.sha256[:12]}... (want {cf.dist}=={manifest['packages'][cf.dist]})")
        yield cf, data.decode("utf-8")
