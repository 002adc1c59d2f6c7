"""A small ``k2_depth`` result set in the benchmark's format, with made-up times (not measurements): the
parts of a 61-layer step at 1, 2, 5 and 9 rows, AR, the oracle at two p, the pair replayed and one
cost-aware run."""

from __future__ import annotations

from pathlib import Path

from workbench.fileio import write_json_atomic
from workbench.results import result_set, write_csv

BUDGETS = (1, 4, 8)
MOE = {"attention": 40.0, "router": 5.0, "routed_experts": 150.0, "shared_expert": 10.0}


def part_rows() -> list[dict]:
    rows = []
    for n in (1, *(b + 1 for b in BUDGETS)):
        grow = 1.0 + 0.15 * (n - 1)                                  # a verify reads more experts
        moe = {p: us * (grow if p == "routed_experts" else 1.0) for p, us in MOE.items()}
        moe["rest"] = 3.0
        for p, us in {**moe, "layer": sum(moe.values()), "step_rows": 6.0}.items():
            rows.append({"table": "part", "part": f"moe.{p}", "layer": 1, "rows": n, "context": 512,
                         "us": us})
        rows += [{"table": "part", "part": "dense.layer", "layer": 0, "rows": n, "context": 512, "us": 300.0},
                 {"table": "part", "part": "embed", "rows": n, "context": 512, "us": 4.0},
                 {"table": "part", "part": "head", "rows": n, "context": 512, "us": 520.0 + n}]
        if n > 1:
            rows.append({"table": "part", "part": "tree", "rows": n, "context": 512, "us": 20.0})
    rows.append({"table": "part", "part": "drafter", "rows": 8, "context": 512, "us": 3000.0})
    return rows


def run_rows(ar_ms: float = 14.0) -> list[dict]:
    rows = [{"table": "run", "source": "ar", "budget": 0, "tokens": 135, "rounds": 135, "tau": 1.0,
             "ms_per_token": ar_ms, "round_ms": ar_ms, "speedup": 1.0, "tokens_equal_ar": True}]
    round_ms = {b: 20.0 + 1.5 * b for b in BUDGETS}
    for p, taus in (("0.8", {1: 1.8, 4: 3.0, 8: 3.6}), ("0.5", {1: 1.5, 4: 1.9, 8: 2.0})):
        for b in BUDGETS:
            ms = round_ms[b] / taus[b]
            rows.append({"table": "run", "source": f"oracle p={p}", "budget": b, "tokens": 128,
                         "rounds": round(128 / taus[b]), "tau": taus[b], "ms_per_token": ms,
                         "round_ms": round_ms[b], "speedup": ar_ms / ms, "tokens_equal_ar": True,
                         "build_us_per_round": 200.0 + 10 * b, "walk_us_per_round": 300.0,
                         "verify_ms_per_round": 15.0, "draft_ms_per_round": 0.5, "drafter_ms_per_round": 0.1})
    for b, tau in ((1, 1.6), (4, 2.3), (8, 2.6)):
        rows.append({"table": "run", "source": "pair code (replayed)", "budget": b, "tau": tau,
                     "round_ms": round_ms[b], "ms_per_token": round_ms[b] / tau,
                     "speedup": ar_ms * tau / round_ms[b]})
    return rows


def write_depth_set(folder: Path, sha: str = "abc1234", gpu: str = "NVIDIA H200") -> Path:
    """Write ``k2_depth_<sha>.csv/.json`` into ``folder``; the CSV's path."""
    rs = result_set(folder, "k2_depth", sha)
    folder.mkdir(parents=True, exist_ok=True)
    auto = {"table": "cost_aware", "source": "oracle p=0.8, cost-aware", "oracle_p": 0.8, "budget": 8,
            "tokens": 128, "rounds": 43, "tau": 2.98, "expected_tau": 3.2, "ms_per_token": 10.5,
            "tree_nodes": 4.0, "best_fixed_budget": 4, "best_fixed_ms_per_token": 8.67,
            "vs_best_fixed": 8.67 / 10.5, "tokens_equal_ar": True}
    write_csv(run_rows()[:1] + part_rows() + run_rows()[1:] + [auto], rs.csv)
    write_json_atomic(rs.meta, {"bench": "k2_depth", "git_sha": sha, "gpu": gpu,
                                "time_utc": "2026-12-03T09:00:00+00:00", "model": "k2_6 (61 layers)",
                                "weights": "K2.6-shape stand-in with random weights (not K2's weights)",
                                "sets": 10, "pair_set": "pair_fixture", "checks_passed": True,
                                "oracle_hit_rate": {"0.8": 0.73, "0.5": 0.42}})
    return rs.csv
