"""Compose the ``bench depth`` result set from two H200 runs, each row naming the run that measured it.

    .venv/bin/python dev/depth_compose.py --out reports/bench --acceptance RUN1.csv --rounds RUN2.csv

RUN1.csv is a run's CSV, or a composed set whose ``run_collapsed`` rows (and metadata) are RUN1's.

Why two: in RUN1 (6839a9f) the stand-in's INT4 codes were uniform in [-8, 7]; their common offset pulled
every hidden state one way and every token routed to the same 8 experts, so its verify costs are too low
(8 distinct experts at any budget), but its DDTree runs equal AR token for token, so its tau(p, B) is the
oracle's acceptance. In RUN2 (codes in [-7, 7]) the routing is near uniform (a verify of B + 1 rows touches
15-205 distinct experts) and its parts and round times are the stand-in's, but some of its oracle runs
lose the oracle's truth: a verify's rows and AR's one-row decode can sum in another order (from 9 rows
for the root row; for the other rows of a tree with siblings), and through 61 layers of random routing
that moves a token, after which the oracle proposes the wrong continuation and the run's tau is void. The
set: RUN2's parts, AR and per-round phase times (every round of a run: a round's cost does not depend on
what is accepted), with tau from RUN1 (oracle, same p and B; where a RUN2 run equals AR its tau is the
same, the oracle's draws being seeded by position) or from the trained code pair (``pair_tau``): ms per
token = RUN2's round / tau. A (p, B) that RUN2 left out takes the mean round of RUN2's other p at that B.
RUN1's own rows are kept as ``table = run_collapsed``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.bench.k2_depth import pair_tau, plot  # noqa: E402
from workbench.config import preset  # noqa: E402
from workbench.fileio import write_json_atomic, write_text_atomic  # noqa: E402
from workbench.k2proj import depth_parts, project_depth  # noqa: E402
from workbench.results import read_csv, result_set, write_csv  # noqa: E402

PHASES = (("drafter_ms_per_round", 1.0), ("draft_ms_per_round", 1.0), ("build_us_per_round", 1e-3),
          ("verify_ms_per_round", 1.0), ("walk_us_per_round", 1e-3))


def round_ms(r: dict) -> float:
    """A run's mean round (ms) as the sum of its phases' means over every round."""
    return sum(float(r[k]) * f for k, f in PHASES)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--acceptance", type=Path, required=True, help="RUN1's CSV (tau of the oracle runs)")
    ap.add_argument("--rounds", type=Path, required=True, help="RUN2's CSV (parts, AR, round phases)")
    ap.add_argument("--pair-dir", type=Path, default=Path("reports/bench"))
    a = ap.parse_args()
    m1 = json.loads(a.acceptance.with_suffix(".json").read_text())
    m2 = json.loads(a.rounds.with_suffix(".json").read_text())
    r1, r2 = read_csv(a.acceptance), read_csv(a.rounds)
    if any(r["table"] == "run_collapsed" for r in r1):            # a composed set: RUN1 is inside it
        r1 = [{**r, "table": "run"} for r in r1 if r["table"] == "run_collapsed"]
        m1 = {**m1["runs"][0], "checks": m1["checks_run1"]}
    run1, run2 = m1["git_sha"], m2["git_sha"]
    tau1 = {(r["source"], int(r["budget"])): float(r["tau"]) for r in r1
            if r["table"] == "run" and r["source"].startswith("oracle")}
    oracle2 = {(r["source"], int(r["budget"])): r for r in r2
               if r["table"] == "run" and r["source"].startswith("oracle")}
    by_b: dict[int, list[float]] = {}
    for (_, b), r in oracle2.items():
        by_b.setdefault(b, []).append(round_ms(r))
    rows = [{**r, "run": run2} for r in r2 if r["table"] == "part"]
    ar = next(r for r in r2 if r["table"] == "run" and r["source"] == "ar")
    ar_ms = float(ar["ms_per_token"])
    rows.append({**ar, "run": run2})
    for (src, b), tau in sorted(tau1.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        r = oracle2.get((src, b))
        rms = round_ms(r) if r is not None else statistics.mean(by_b[b])
        row = {"table": "run", "source": src, "budget": b, "tau": tau, "round_ms": rms,
               "ms_per_token": rms / tau, "speedup": ar_ms * tau / rms, "tokens_equal_ar": True,
               "run": f"tau {run1}, round {run2}" + ("" if r is not None else " (mean of its other p)")}
        if r is not None:
            row.update({k: r[k] for k, _ in PHASES})
            row.update(distinct_experts=r["distinct_experts"], tree_nodes=r["tree_nodes"])
        rows.append(row)
    pair, pair_set = pair_tau(a.pair_dir)
    for b in sorted(by_b):
        if b in pair:
            rms = statistics.mean(by_b[b])
            rows.append({"table": "run", "source": "pair code (replayed)", "budget": b, "tau": pair[b],
                         "round_ms": rms, "ms_per_token": rms / pair[b], "speedup": ar_ms * pair[b] / rms,
                         "run": f"tau {pair_set}, round {run2}"})
    runs = [r for r in rows if r.get("table") == "run"]
    for pr in project_depth(preset("k2_6"), depth_parts(rows), runs):
        rows.append({"table": "projection", **pr, "run": run2})
    rows += [{**r, "table": "run_collapsed", "run": run1} for r in r1 if r["table"] == "run"]
    ddtree = [c for c in m2["checks"] if c["check"].startswith("DDTree greedy == AR")]
    equal = [c["check"].split(", ", 1)[1] for c in ddtree if c["passed"]]
    apart = [c["check"].split(", ", 1)[1] for c in ddtree if not c["passed"]]
    rs = result_set(a.out, "k2_depth", run2)
    write_csv(rows, rs.csv)
    meta = {**m2, "runs": [
        {"git_sha": run1, "time_utc": m1["time_utc"], "what": "INT4 codes in [-8, 7]: every token routed to "
         "the same 8 experts (verify costs too low); every DDTree run equal to AR: its tau is used",
         "checks_passed": m1["checks_passed"], "elapsed_s": m1["elapsed_s"]},
        {"git_sha": run2, "time_utc": m2["time_utc"], "what": "INT4 codes in [-7, 7]: near-uniform routing; "
         "parts, AR and round phases used; DDTree equal to AR in "
         f"{', '.join(equal) or 'no run'}, departing from it in {', '.join(apart) or 'none'} "
         "(tau void there)",
         "checks_passed": m2["checks_passed"], "elapsed_s": m2["elapsed_s"],
         "prefill_repeat": m2.get("prefill_repeat")}],
        "checks_run1": m1["checks"], "composition": __doc__.split("\n\n", 2)[2].strip(),
        "pair_set": pair_set}
    write_json_atomic(rs.meta, meta)
    plot(rows, rs.plot, f"{m2['weights']}, {m2['sets']} distinct MoE sets (runs {run1}, {run2})")
    logs = []
    for src, name in ((a.acceptance, run1), (a.rounds, run2)):
        con, old = src.parent / "console.log", src.with_suffix(".log")
        if con.is_file():
            logs.append(f"==== run {name}: console ====\n{con.read_text()}")
        elif old.is_file():                                      # a composed set's log: that run's part
            logs += [f"==== run {part}" for part in old.read_text().split("==== run ")[1:]
                     if part.startswith(name)]
    write_text_atomic(rs.log, "\n".join(logs))
    print(f"wrote {rs.csv}, {rs.meta}, {rs.plot}, {rs.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
