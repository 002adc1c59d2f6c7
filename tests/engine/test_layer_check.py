"""The one layer check (``engine.scenarios.check_layer``) split in its two sides: the reference side
computed in another process (as bench k2 runs it beside the device's timing) gives the comparison the
in-line check gives."""

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from kernels_numba.sim import sim_speed
from tests.bench.test_k2_layer import SMALL, _rig
from workbench.ddtree.scenarios import layer_reference
from workbench.engine.scenarios import check_layer, check_moe_block, compare_layer, engine_layer


def test_reference_side_in_a_spawned_process_compares_as_the_inline_check():
    rig = _rig(SMALL, 1)
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        fut = pool.submit(layer_reference, SMALL, 3, 1, "int4", "fp32", 4, 16)
        with sim_speed():
            eng = engine_layer(SMALL, 3, rig, 4, 16)
        ref = fut.result()
    here = layer_reference(SMALL, 3, 1, "int4", "fp32", 4, 16)
    np.testing.assert_allclose(ref["prefix_rows"], here["prefix_rows"], rtol=1e-6, atol=1e-7)
    for a, b in zip(ref["steps"], here["steps"], strict=True):
        np.testing.assert_allclose(a["y"], b["y"], rtol=1e-6, atol=1e-6)
        assert (a["routes"] == b["routes"]).all()
    res = compare_layer(SMALL, 3, 1, "int4", "fp32", eng, ref, 4, 16, log=lambda m: None)
    inline = check_layer(SMALL, 3, rig, prefix=4, tree_nodes=16, log=lambda m: None)
    assert [r["scenario"] for r in res] == [r["scenario"] for r in inline]
    assert all(r["passed"] for r in res) and all(r["passed"] for r in inline), (res, inline)


def test_moe_block_check_passes_its_layer_and_fails_another_seeds():
    """The block check (what ``bench ep`` runs before its shares) on the layer the builder made of seed
    3: it passes against seed 3's reference block and fails against seed 4's."""
    rig = _rig(SMALL, 1)
    ok = check_moe_block(SMALL, 3, 1, rig.lay.moe, rig.scratch, rows=4, log=lambda m: None)
    assert ok["passed"] and ok["max_rel_err"] < 1e-3, ok
    bad = check_moe_block(SMALL, 4, 1, rig.lay.moe, rig.scratch, rows=4, log=lambda m: None)
    assert not bad["passed"], bad
