"""Benchmark result sets, read and written: their names (one set per benchmark, named by the benchmark
and the commit it ran) and their CSV files. The benchmarks (``workbench/bench``) write sets with it, the
report helpers (``workbench/report``) read them with it.

A set in a folder (``reports/bench/`` for the committed ones) is ``<bench>_<commit>.csv`` (results),
``.json`` (run metadata, whose ``git_sha`` is the commit), ``.png`` (plot) and ``.log`` (console).
``bench kernels|engine --out DIR`` writes one and then removes the folder's earlier sets of the same
benchmark (git keeps the committed ones); the report notebooks read ``current_set``. The CSV keeps
every float exactly (shortest round-trip form), missing values and NaN as empty cells. Standard library
and (inside ``write_csv``) pandas only: the report side imports it without torch.
"""

from __future__ import annotations

import csv
import io
import json
import numbers
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .fileio import write_text_atomic

if TYPE_CHECKING:
    import pandas as pd

BENCHES = ("kernels", "engine", "k2_layer", "ep_moe", "pair", "k2_depth")
UNMEASURED: tuple[str, ...] = ()           # benchmarks with no committed result set yet
SUFFIXES = (".csv", ".json", ".png", ".log")
_TOKEN = r"[0-9A-Za-z.-]+"                  # a commit as a file-name token: no '_', no '/'


def commit_token(sha: str) -> str:
    """``sha`` (e.g. 'dca7e65', 'dca7e65-dirty', 'unknown') as a file-name token."""
    return re.sub(r"[^0-9A-Za-z.-]+", "-", str(sha)).strip("-.") or "unknown"


@dataclass(frozen=True)
class ResultSet:
    folder: Path
    bench: str                              # one of BENCHES
    commit: str                             # commit_token of the run's git_sha

    @property
    def stem(self) -> str:
        return f"{self.bench}_{self.commit}"

    def path(self, suffix: str) -> Path:
        return self.folder / f"{self.stem}{suffix}"

    @property
    def csv(self) -> Path:
        return self.path(".csv")

    @property
    def meta(self) -> Path:
        return self.path(".json")

    @property
    def plot(self) -> Path:
        return self.path(".png")

    @property
    def log(self) -> Path:
        return self.path(".log")

    def read_meta(self) -> dict[str, Any]:
        """The metadata JSON ({} when the set has none)."""
        return json.loads(self.meta.read_text(encoding="utf-8")) if self.meta.is_file() else {}


def _check_bench(bench: str) -> None:
    if bench not in BENCHES:
        raise ValueError(f"unknown benchmark {bench!r} (choose from {', '.join(BENCHES)})")


def result_set(folder: str | Path, bench: str, sha: str) -> ResultSet:
    """The set a run of ``bench`` at commit ``sha`` writes into ``folder``."""
    _check_bench(bench)
    return ResultSet(Path(folder), bench, commit_token(sha))


def result_sets(folder: str | Path, bench: str) -> list[ResultSet]:
    """Every set of ``bench`` in ``folder`` that has a CSV, sorted by file name."""
    _check_bench(bench)
    d = Path(folder)
    if not d.is_dir():
        return []
    pat = re.compile(rf"{bench}_({_TOKEN})\.csv")
    return [ResultSet(d, bench, m.group(1)) for p in sorted(d.glob(f"{bench}_*.csv"))
            if (m := pat.fullmatch(p.name))]


def current_set(folder: str | Path, bench: str) -> ResultSet | None:
    """The newest set of ``bench`` in ``folder`` (latest metadata ``time_utc``, then file name), or None."""
    sets = result_sets(folder, bench)
    if not sets:
        return None

    def key(s: ResultSet) -> tuple[str, str]:
        try:
            return str(s.read_meta().get("time_utc", "")), s.stem
        except (OSError, ValueError):               # unreadable metadata sorts first
            return "", s.stem
    return max(sets, key=key)


def retire_others(keep: ResultSet) -> list[Path]:
    """Remove the files of every other set of ``keep.bench`` in its folder; the removed paths."""
    gone = []
    pat = re.compile(rf"{keep.bench}_({_TOKEN})({'|'.join(map(re.escape, SUFFIXES))})")
    for p in sorted(keep.folder.glob(f"{keep.bench}_*")):
        m = pat.fullmatch(p.name)
        if m and m.group(1) != keep.commit and p.is_file():
            p.unlink()
            gone.append(p)
    return gone


# ---- CSV files ---------------------------------------------------------------------------------

def _column(values: pd.Series) -> pd.Series:
    present = values.dropna()
    if len(present) and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in present):
        return values.astype("Int64")                    # ints with gaps stay ints (pandas would make floats)
    return values.infer_objects()


def frame(table: pd.DataFrame | list[dict[str, Any]]) -> pd.DataFrame:
    """``table`` (a DataFrame, or rows: a list of dicts) as a DataFrame: rows become columns in
    first-seen key order, typed per column."""
    import pandas as pd
    if isinstance(table, pd.DataFrame):
        return table
    df = pd.DataFrame(table, dtype=object)
    return df.apply(_column) if len(df.columns) else df


def write_csv(table: pd.DataFrame | list[dict[str, Any]], path: str | Path) -> None:
    """Write ``table`` as CSV (atomically) with every float at full precision."""
    buf = io.StringIO()
    frame(table).to_csv(buf, index=False, na_rep="", lineterminator="\n")
    write_text_atomic(path, buf.getvalue())


def _num(v: str) -> Any:
    try:
        f = float(v)
    except ValueError:
        return v
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def cell(v: Any) -> Any:
    """A CSV cell as written by a benchmark: 'True' / 'False' as bools, '' as None, the rest as read."""
    return {"True": True, "False": False, "": None}.get(v, v) if isinstance(v, str) else v


def read_csv(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a benchmark CSV with numeric cells converted (ints stay ints)."""
    with open(path, newline="", encoding="utf-8") as f:
        return [{k: _num(v) for k, v in row.items()} for row in csv.DictReader(f)]
