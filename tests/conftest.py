"""Test-wide settings. Kernels run in numba's CUDA simulator unless KDTREE_GPU=1 (the GPU tier)."""

import os

if os.environ.get("KDTREE_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# The longest tests (30-70 s each on 2 cores), started first: xdist hands tests out in collection order,
# and one collected last runs alone while the other worker idles.
LONG_FIRST = (
    "tests/report/test_notebooks.py::test_smoke_profile_of_every_notebook",
    "tests/kernels/test_compile_ptx.py::test_moe_stream_k_gemms",
    "tests/bench/test_pair.py::test_loop_runs_ar_every_budget_then_the_cost_aware_one_all_equal_to_ar",
    "tests/report/test_runner.py::test_fixtures_each_reported_with_a_reason",
    "tests/engine/test_ddtree.py::test_engine_ddtree_matches_reference_and_golden[tiny-oracle-64]",
    "tests/engine/test_ddtree.py::test_engine_ddtree_matches_reference_and_golden[int4_tiny2-dflash-16]",
    "tests/engine/test_ar.py::test_engine_ar_matches_golden_and_reference_logits[int4_tiny2]",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))        # stable: the rest keep their order
