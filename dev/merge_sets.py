"""Merge partial runs of ``bench k2`` or ``bench ep`` into one result set, every row keeping the commit
that measured it.

    .venv/bin/python dev/merge_sets.py --out reports/bench DIR/k2_layer_<a>.csv DIR/k2_layer_<b>.csv ...

A device session's time may not fit every part in one run (``bench k2 --layers 1 --dense bf16``
re-measures one layer, ``bench ep --worlds 2`` on one GPU only the ranks-in-turn rows); the reports
read one set. Rows are keyed by the bench's ``KEYS`` (k2_layer: layer, experts, dense, impl, part,
routing, rows; ep_moe: world, rows, impl, phase): a later source replaces an earlier one's row, so
list the sources oldest first. Rows from before ``--dense`` existed count as dense ``fp32``. Writes
``<bench>_<last source's commit>`` (CSV with a ``run`` column; a merged set may be a source and keeps
its rows' runs; metadata of the last source plus ``runs``: each source's commit, time and row count,
every source's checks, and the union of the sources' ``worlds`` / ``in_turn``; the plot), and
concatenates the sources' logs under one header each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.bench import ep_moe, k2_layer  # noqa: E402
from workbench.fileio import write_json_atomic, write_text_atomic  # noqa: E402
from workbench.results import (
    read_csv,  # noqa: E402
    result_set,  # noqa: E402
    write_csv,  # noqa: E402
)

KEYS = {"k2_layer": ("layer", "experts", "dense", "impl", "part", "routing", "rows"),
        "ep_moe": ("world", "rows", "impl", "phase")}
PLOTS = {"k2_layer": k2_layer.plot, "ep_moe": ep_moe.plot}
UNION = ("worlds", "in_turn")                  # list metadata a merged set holds from every source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("sources", nargs="+", type=Path, help="<bench>_<commit>.csv files of one bench, oldest "
                    "first")
    a = ap.parse_args()
    merged: dict[tuple, dict] = {}
    runs, checks, logs = [], [], []
    benches = {json.loads(src.with_suffix(".json").read_text())["bench"] for src in a.sources}
    if len(benches) != 1 or not benches <= set(KEYS):
        print(f"error: sources of one of {', '.join(KEYS)} needed, got {sorted(benches)}", file=sys.stderr)
        return 2
    bench = benches.pop()
    union: dict[str, set] = {}
    for src in a.sources:
        meta = json.loads(src.with_suffix(".json").read_text())
        rows = read_csv(src)
        for r in rows:
            if r["impl"] == "numba engine" and not r.get("dense"):
                r["dense"] = "fp32"
            r["run"] = r.get("run") or meta["git_sha"]             # a merged source keeps its rows' runs
            merged[tuple(str(r.get(k, "")) for k in KEYS[bench])] = r
        for k in UNION:
            if k in meta:
                union.setdefault(k, set()).update(meta[k])
        own = {"git_sha": meta["git_sha"], "time_utc": meta["time_utc"], "rows": len(rows)}
        runs += meta.get("runs") or [own]
        checks += [{"run": meta["git_sha"], **c} for c in meta.get("checks", [])]
        log = src.with_suffix(".log")
        text = log.read_text() if log.exists() else "(no log)\n"
        logs.append(f"==== run {meta['git_sha']} ({meta['time_utc']}): {src.name} ====\n{text}")
    rs = result_set(a.out, bench, runs[-1]["git_sha"])
    rows = list(merged.values())
    cols = list(dict.fromkeys(k for r in rows for k in r))
    write_csv([{c: r.get(c, "") for c in cols} for r in rows], rs.csv)
    write_json_atomic(rs.meta, {**meta, **{k: sorted(v) for k, v in union.items()}, "checks": checks,
                                "runs": runs})
    write_text_atomic(rs.log, "".join(logs))
    PLOTS[bench](rows, rs.plot)
    print(f"wrote {rs.csv} ({len(rows)} rows from {len(runs)} runs), {rs.meta}, {rs.log}, {rs.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
