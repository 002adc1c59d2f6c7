"""The repository explains itself: it cites only documents it contains, its links resolve, it speaks
of the workbench rather than of how the work was organised, and reports/bench keeps one result set
per benchmark, the newest GPU-tier log per tier and an index of the retired files in git."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from workbench.results import BENCHES, UNMEASURED, result_sets

ROOT = Path(__file__).resolve().parents[1]
_SHARED = "shared"             # spelled apart so this pattern is not itself a citation
OUTSIDE = re.compile(rf"\.\./{_SHARED}|{_SHARED}/design|design card", re.IGNORECASE)
MD_NAME = re.compile(r"(?<![\w/.-])([\w./-]*?)([\w-]+\.md)\b")
ORGANISED = re.compile(r"\b(sessions?|issues?|stops?)\s+#?\d+\b", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _tracked() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (git ls-files)")
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if (ROOT / p).is_file()]


def _texts() -> dict[Path, str]:
    """Tracked text files (generated HTML reports and binary files left out), path -> text."""
    out = {}
    for p in _tracked():
        if p.suffix == ".html" or p == Path(__file__):
            continue
        data = p.read_bytes()
        if b"\0" in data[:8192]:
            continue
        out[p] = data.decode("utf-8", errors="replace")
    return out


def test_only_documents_in_the_repository_are_cited():
    names = {p.name for p in _tracked()}
    bad = []
    for p, text in _texts().items():
        for i, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                bad.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:80]}")
            for m in MD_NAME.finditer(line):
                if m.group(2) not in names and "<" not in m.group(1):
                    bad.append(f"{p.relative_to(ROOT)}:{i}: cites {m.group(0)}, not in the repository")
    assert not bad, "\n".join(bad)


def test_no_file_speaks_of_how_the_work_was_organised():
    bad = [str(p.relative_to(ROOT)) for p in _tracked() if "session" in p.name.lower()]
    for p, text in _texts().items():
        for i, line in enumerate(text.splitlines(), 1):
            if ORGANISED.search(line):
                bad.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()[:80]}")
    assert not bad, "\n".join(bad)


def test_markdown_links_resolve():
    bad = []
    for p, text in _texts().items():
        if p.suffix != ".md":
            continue
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (p.parent / target).exists():
                bad.append(f"{p.relative_to(ROOT)}: link to {target}")
    assert not bad, "\n".join(bad)


def test_bench_results_one_set_per_benchmark_and_an_indexed_history():
    bench = ROOT / "reports" / "bench"
    for name in BENCHES:
        sets = result_sets(bench, name)
        if name in UNMEASURED:
            assert not sets, f"{name} has a result set: take it out of UNMEASURED"
            continue
        assert len(sets) == 1, f"{name}: {[s.stem for s in sets]}"
        s = sets[0]
        assert s.csv.is_file() and s.meta.is_file(), s.stem
        assert s.read_meta().get("git_sha", "").startswith(s.commit), (s.stem, s.read_meta().get("git_sha"))
    files = [p for p in bench.iterdir() if p.name != "README.md"]
    assert all(p.is_file() for p in files), "reports/bench holds current files only (history is in git)"
    tiers = [re.fullmatch(r"gpu_tier_(.+)_[0-9a-f]{7}\.log", p.name) for p in files]
    names = [m.group(1) for m in tiers if m]
    assert len(names) == len(set(names)), f"one GPU-tier log per tier: {sorted(names)}"
    readme = (bench / "README.md").read_text(encoding="utf-8")
    current, _, retired = readme.partition("## Retired")
    assert all(p.stem in current for p in files), sorted(p.name for p in files if p.stem not in current)
    held: dict[str, str] = {}                       # retired file -> the commit its section names
    commit = None
    for line in retired.splitlines():
        named = re.search(r"last held by commit `([0-9a-f]{7,})`", line)
        commit = named.group(1) if named else commit
        row = re.match(r"\| `([^`]+?)(?: / [^`]*)?` \|", line)
        if row:
            assert commit, f"{row.group(1)} is listed before any commit"
            held[row.group(1)] = commit
    assert held and not any((bench / n).exists() for n in held), "a retired file is still in the tree"
    for c in set(held.values()):
        have = subprocess.run(["git", "cat-file", "-e", f"{c}^{{commit}}"], cwd=ROOT, capture_output=True)
        if have.returncode:
            pytest.skip(f"commit {c} is not in this clone (shallow): retired files not checked")
    gone = [f"{n} at {c}" for n, c in held.items() if subprocess.run(
        ["git", "cat-file", "-e", f"{c}:reports/bench/{n}"], cwd=ROOT, capture_output=True).returncode]
    assert not gone, f"not there: {gone}"
