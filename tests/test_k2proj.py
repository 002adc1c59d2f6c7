"""The full-K2 projection from bench k2's layer times: the committed result set loads, and the arithmetic
(1 dense + 60 MoE layers, tau over the step) on made-up times."""

from pathlib import Path

from workbench import k2proj
from workbench.config import preset


def test_committed_k2_layer_set_loads_decode_and_tree_rows():
    times, meta = k2proj.load_layers(Path(__file__).resolve().parents[1] / "reports" / "bench")
    assert {1, 2, 5, 17, 65} <= set(times["dense"]) and {1, 2, 5, 17, 65} <= set(times["moe"])
    assert {1, 2, 5, 17, 65} <= set(times["experts"])
    assert all(times["experts"][n] < times["moe"][n] for n in times["experts"])      # a part of the layer
    assert meta["bench"] == "k2_layer" and all(v > 0 for t in times.values() for v in t.values())


def test_projection_is_tau_over_the_61_layer_step():
    times = {"dense": {1: 100.0, 5: 200.0}, "moe": {1: 10.0, 5: 30.0}}
    rows = k2proj.project(preset("k2"), times, {4: 3.0, 16: 9.0})          # 17 rows not measured: left out
    assert [r["budget"] for r in rows] == [0, 4]
    ar, b4 = rows
    assert ar["step_ms"] == (100 + 60 * 10) / 1e3 and ar["speedup"] == 1.0
    assert b4["step_ms"] == (200 + 60 * 30) / 1e3
    assert abs(b4["speedup"] - 3.0 * 700 / 2000) < 1e-12 and abs(b4["tok_s"] - 3e6 / 2000) < 1e-9


def test_the_steps_shared_attention_rows_count_once_per_step():
    times = {"dense": {1: 100.0, 5: 200.0}, "moe": {1: 10.0, 5: 30.0}, "step": {1: 7.0, 5: 9.0}}
    ar, b4 = k2proj.project(preset("k2"), times, {4: 3.0})
    assert ar["step_ms"] == (7 + 100 + 60 * 10) / 1e3 and b4["step_ms"] == (9 + 200 + 60 * 30) / 1e3


def test_overlap_scales_the_routed_experts_part():
    times = {"dense": {1: 100.0, 5: 200.0}, "moe": {1: 10.0, 5: 30.0}, "experts": {1: 4.0, 5: 20.0}}
    plain = k2proj.project(preset("k2"), times, {4: 3.0})
    shared = k2proj.project(preset("k2"), times, {4: 3.0}, overlap={4: 0.5})
    assert shared[0] == plain[0]                                          # decode is one token: no sharing
    assert shared[1]["step_ms"] == (200 + 60 * (30 - 0.5 * 20)) / 1e3
    assert k2proj.project(preset("k2"), times, {4: 3.0}, overlap={}) == plain[:1]    # no ratio: left out


def test_load_layers_reads_one_way_of_holding_the_dense_projections(tmp_path):
    from workbench.fileio import write_json_atomic
    from workbench.results import result_set, write_csv
    rs = result_set(tmp_path, "k2_layer", "abc1234")
    base = dict(impl="numba engine", experts="int4", part="layer", routing="router", rows=1)
    write_csv([dict(base, dense="fp32", us=700.0), dict(base, dense="bf16", us=600.0),
               dict(base, routing="-", dense="bf16", us=900.0),
               dict(base, part="step_rows", dense="bf16", us=8.0)], rs.csv)
    write_json_atomic(rs.meta, {"bench": "k2_layer", "time_utc": "x"})
    times, meta = k2proj.load_layers(tmp_path)
    assert meta["dense_used"] == "bf16" and times["moe"] == {1: 600.0} and times["dense"] == {1: 900.0}
    assert times["step"] == {1: 8.0}
    times, meta = k2proj.load_layers(tmp_path, dense="fp32")
    assert meta["dense_used"] == "fp32" and times["moe"] == {1: 700.0} and times["dense"] == {}


def test_busiest_gpu_holds_its_share_of_the_union_or_more():
    from workbench.report.spec import analytic_coverage
    one = k2proj.busiest_gpu_experts(384, 8, 17, 1)
    assert abs(one - float(analytic_coverage(384, 8, 17))) < 1.0       # one GPU: the whole union
    eight = k2proj.busiest_gpu_experts(384, 8, 17, 8)
    assert one / 8 < eight < one / 4                     # the busiest of 8 holds more than its 1/8
    assert k2proj.busiest_gpu_experts(384, 8, 1, 8) >= 1.0


def test_experts_us_interpolates_the_measured_curve_and_extends_it():
    times = {"random": {1: 72.0, 2: 130.0, 5: 290.0}, "random_unique": {1: 8.0, 2: 16.0, 5: 39.0}}
    assert k2proj.experts_us(times, 16.0) == 130.0
    assert abs(k2proj.experts_us(times, 12.0) - 101.0) < 1e-9
    assert abs(k2proj.experts_us(times, 2.0) - (72.0 - 6 * 58.0 / 8)) < 1e-9   # along the first two points


def test_expert_parallel_projection_swaps_only_the_routed_experts_part():
    times = {"dense": {1: 100.0, 5: 200.0}, "moe": {1: 50.0, 5: 400.0}, "experts": {1: 20.0, 5: 300.0},
             "random": {1: 20.0, 5: 300.0}, "random_unique": {1: 8.0, 5: 38.4}}
    rows = k2proj.project_ep(preset("k2"), times, {4: 3.0})
    u1 = k2proj.busiest_gpu_experts(384, 8, 1, 8)
    assert abs(rows[0]["step_ms"] * 1e3 - (100 + 60 * (30 + k2proj.experts_us(times, u1)))) < 1e-6
    one_gpu = k2proj.project(preset("k2"), times, {4: 3.0})
    assert rows[1]["budget"] == 4 and rows[1]["step_ms"] < one_gpu[1]["step_ms"]


def test_measured_local_share_replaces_the_interpolated_one(tmp_path):
    from workbench.fileio import write_json_atomic
    from workbench.results import result_set, write_csv
    assert k2proj.load_ep(tmp_path) is None
    rs = result_set(tmp_path, "ep_moe", "abc1234")
    turn = dict(impl="ranks in turn", phase="local_moe")
    write_csv([dict(turn, world=8, rows=1, us=9.0), dict(turn, world=8, rows=5, us=40.0),
               dict(turn, world=4, rows=1, us=14.0),
               dict(impl="expert parallel", phase="total", world=8, rows=1, us=500.0)], rs.csv)
    write_json_atomic(rs.meta, {"bench": "ep_moe", "time_utc": "x", "git_sha": "abc1234"})
    rows, meta = k2proj.load_ep(tmp_path)
    local = k2proj.ep_local(rows, 8)
    assert local == {1: 9.0, 5: 40.0} and meta["bench"] == "ep_moe" and k2proj.ep_local(rows, 2) == {}
    assert {r["run"] for r in rows} == {"abc1234"}            # one run's set: its rows name its commit
    times = {"dense": {1: 100.0, 5: 200.0, 9: 300.0}, "moe": {1: 50.0, 5: 400.0, 9: 600.0},
             "experts": {1: 20.0, 5: 300.0, 9: 450.0}}
    rows = k2proj.project_ep(preset("k2"), times, {4: 3.0, 8: 4.0}, local=local)     # 9 rows: not measured
    assert [r["budget"] for r in rows] == [0, 4]
    assert rows[0]["step_ms"] == (100 + 60 * (50 - 20 + 9)) / 1e3
    assert rows[1]["step_ms"] == (200 + 60 * (400 - 300 + 40)) / 1e3


def test_committed_ep_set_has_the_split_measured_at_every_p():
    rows, meta = k2proj.load_ep(Path(__file__).resolve().parents[1] / "reports" / "bench")
    assert meta["bench"] == "ep_moe" and all(c["passed"] for c in meta["checks"])
    for p in (1, 2, 4, 8):
        assert {1, 2, 5, 17, 65} <= set(k2proj.ep_local(rows, p)), p


def test_best_budgets_names_each_groups_best():
    rows = [{"drafter": d, "budget": b, "speedup": s, "tok_s": 10.0 * s} for d, b, s in
            [("a", 0, 1.0), ("a", 4, 1.5), ("a", 8, 1.2), ("b", 0, 1.0), ("b", 4, 0.9)]]
    assert k2proj.best_budgets(rows) == ("a: **1.50×** AR at B = 4 (15 tok/s, AR 10); "
                                         "b: **1.00×** AR at B = 0 (10 tok/s, AR 10)")
