"""Kernel benchmark results for the throughput notebook: find and read the current result set that
``python -m workbench bench kernels`` writes (``kernels_<commit>.csv`` + ``.json``, see
workbench/results.py), re-run it on a GPU, and the bytes model of a W4A16 or bf16 matmul that
the measured GB/s are read against.

CSV columns are matched by name, not position: case ('gate_up M=16', 'moe T=4', 'down copy
ceiling'), impl, M or T, median_us, gbs or gbps, pct_copy, floor_us; anything else is kept as is.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..results import cell, current_set, read_csv  # noqa: F401  (cell, read_csv: read here by notebooks)

GBPS_NAMES = ("gbs", "gbps", "GB/s", "eff_gbps")


def find_results(bench_dir: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """[(csv path, metadata)] of the current kernel-benchmark set under bench_dir, [] when it has none
    (the engine benchmark's set is enginedata's)."""
    rs = current_set(bench_dir, "kernels")
    return [(rs.csv, rs.read_meta())] if rs else []


def column(rows: list[dict[str, Any]], *names: str) -> str | None:
    """The first of ``names`` that the rows have (case-insensitive), as spelled in the CSV."""
    keys = {k.lower(): k for k in (rows[0] if rows else {})}
    return next((keys[n.lower()] for n in names if n.lower() in keys), None)


def copy_gbps(meta: dict[str, Any], rows: list[dict[str, Any]]) -> float | None:
    """The copy bandwidth measured in the same run: a metadata key with 'copy', else median_us/pct_copy."""
    for k, v in meta.items():
        if "copy" in k.lower() and isinstance(v, (int, float)):
            return float(v)
    g, pct = column(rows, *GBPS_NAMES), column(rows, "pct_copy")
    ratios = [r[g] / (r[pct] / 100.0) for r in rows if g and pct and isinstance(r.get(pct), (int, float))
              and r[pct] > 0 and isinstance(r.get(g), (int, float))]
    return float(sum(ratios) / len(ratios)) if ratios else None


def rerun(out_dir: str | Path, timeout_s: float = 1800, what: str = "kernels") -> tuple[bool, str]:
    """Run ``python -m workbench bench <what> --out out_dir`` (what: 'kernels' or 'engine');
    (ok, last lines of its output)."""
    if what not in ("kernels", "engine"):
        raise InputError(f"what must be 'kernels' or 'engine', got {what!r}")
    cmd = [sys.executable, "-m", "workbench", "bench", what, "--out", str(out_dir)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout_s:g} s"
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-5:])
    return r.returncode == 0, tail


def matmul_bytes(m: int, n: int, k: int, weight: str, group_size: int = 32) -> float:
    """Bytes a [M, K] x [K, N] matmul must move at least: bf16 activations in and out, weights once
    ('bf16': 2 B each, 'int4': 0.5 B plus a float16 scale per group)."""
    w = n * k * (2.0 if weight == "bf16" else 0.5 + 2.0 / group_size)
    return w + 2.0 * m * k + 2.0 * m * n


def family(case: Any) -> str:
    """'gate_up M=16' -> 'gate_up', 'moe T=4' -> 'moe', 'down copy ceiling' -> 'down'."""
    return re.sub(r"\s+(copy ceiling|[A-Za-z]+=\S+)$", "", str(case)).strip()


def is_ceiling(row: dict[str, Any], case_col: str) -> bool:
    """A copy-ceiling row: the run's device-to-device copy of the same bytes as one launch."""
    return str(row.get(case_col, "")).endswith("copy ceiling")


def families(rows: list[dict[str, Any]], case_col: str | None) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by case family, in first-seen order (one group '' without a case column)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(family(r[case_col]) if case_col else "", []).append(r)
    return out


def series(rows: list[dict[str, Any]], x: str, y: str,
           impl_col: str) -> dict[str, tuple[list[Any], list[Any]]]:
    """impl -> (x values, y values) sorted by x; rows whose x or y is not a number are left out."""
    out: dict[str, list[tuple[Any, Any]]] = {}
    for r in rows:
        if isinstance(r.get(x), (int, float)) and isinstance(r.get(y), (int, float)):
            out.setdefault(str(r[impl_col]), []).append((r[x], r[y]))
    return {k: ([a for a, _ in sorted(v)], [b for _, b in sorted(v)]) for k, v in out.items()}
