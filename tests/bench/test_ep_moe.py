"""bench ep without a GPU: the plan's byte counts, the per-step slowest-rank medians, the dry-run CLI."""

import math
import subprocess
import sys

import numpy as np
import pytest

from workbench.bench.ep_in_turn import _row
from workbench.bench.ep_moe import FLOOR_COLS, PHASE_COLS, plan, ranks_touched, summarise
from workbench.config import preset


def test_ranks_touched_matches_sampling():
    rng = np.random.default_rng(0)
    hits = [len(set(rng.permutation(384)[:8] // 48)) for _ in range(20000)]
    assert ranks_touched(384, 48, 8) == pytest.approx(np.mean(hits), rel=0.01)
    assert ranks_touched(384, 384, 8) == 1.0


def test_plan_bytes_at_k2():
    rows = {(r["world"], r["rows"]): r for r in plan(preset("k2_slice"))}
    r = rows[8, 17]
    assert r["experts_per_rank"] == 48 and r["slots"] == 8 and r["row_bytes"] == 2 * 7168 + 64
    assert r["dispatch_bytes"] == round(17 * ranks_touched(384, 48, 8) * r["row_bytes"])
    assert r["gather_bytes"] == 8 * 3 * 4 * 7168
    assert rows[1, 1]["ranks_per_row"] == 1.0 and math.isclose(rows[1, 1]["distinct_local_experts"], 8.0)


def test_summarise_takes_the_slowest_rank_per_step_then_the_median():
    cols = (*PHASE_COLS, *FLOOR_COLS, "distinct_local_experts")

    def step(v):
        return {c: float(v) for c in cols}
    ranks = [{"samples": {3: [step(1), step(5), step(2)]}}, {"samples": {3: [step(4), step(1), step(1)]}}]
    out = summarise(2, 3, ranks, None)
    total = next(r for r in out if r["phase"] == "total")
    assert total["us"] == 4.0 and total["max_us"] == 5.0 and total["min_us"] == 2.0     # per step 4, 5, 2
    assert total["floor_us"] == 4.0 * len(FLOOR_COLS) and total["pct_floor"] == 100.0 * len(FLOOR_COLS)
    assert {r["phase"] for r in out} == set(PHASE_COLS)


def test_in_turn_row_is_the_busiest_rank_per_step_then_the_median():
    steps = [{"busiest": b, "mean": b / 2, "sum": 2 * b, "distinct": u, "received": 3}
             for b, u in ((10.0, 2), (30.0, 4), (20.0, 3))]
    row = _row(8, 5, steps, expert_bytes=1e6, copy_gbs=1e3)            # 1 us per expert at the copy rate
    assert (row["world"], row["rows"], row["tree_nodes"], row["impl"]) == (8, 5, 4, "ranks in turn")
    assert (row["us"], row["min_us"], row["max_us"], row["sum_ranks_us"]) == (20.0, 10.0, 30.0, 40.0)
    assert row["distinct_local_experts"] == 3 and row["floor_moe_us"] == 3.0 and row["pct_floor"] == 15.0


def test_dry_run_prints_the_plan_without_a_gpu():
    res = subprocess.run([sys.executable, "-m", "workbench", "bench", "ep", "--dry-run", "--worlds", "2,4"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 16 and lines[0].startswith("world=2, rows=1,")
    bad = subprocess.run([sys.executable, "-m", "workbench", "bench", "ep", "--dry-run", "--worlds", "3"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--worlds" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "workbench", "bench", "ep", "--in-turn", "2,6"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--in-turn takes 1, 2, 4 and 8 or none" in bad.stderr
