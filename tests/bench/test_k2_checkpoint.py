"""``bench k2 --checkpoint``'s layers: ``k2_layer.layer`` of a lazy K2.6-layout checkpoint (the engine's own
upload, INT4 experts with bf16 scales repacked on worker processes that reopen the checkpoint) against the
reference layer on the same mapping, in the simulator at small widths."""

import pytest

from kernels_numba import ops
from kernels_numba.sim import sim_speed
from tests.bench.test_k2_layer import SMALL
from workbench.bench import k2_layer
from workbench.checkpoint import open_checkpoint
from workbench.checkpoint.synthetic import write_k26_checkpoint
from workbench.ddtree.scenarios import layer_reference
from workbench.engine.layer import LayerRig
from workbench.engine.scenarios import compare_layer, engine_layer
from workbench.errors import InputError

CFG = SMALL.replace(num_hidden_layers=3)


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    return open_checkpoint(write_k26_checkpoint(tmp_path_factory.mktemp("ck") / "k26", CFG, seed=2))


@pytest.mark.parametrize("layer, workers", [(0, 1), (2, 2)])
def test_a_checkpoint_layer_on_the_engine_matches_the_reference_layer(ck, layer, workers):
    lay = k2_layer.layer(ck.cfg, ck, layer, "int4", workers=workers)
    rig = LayerRig(ck.cfg, layer, lay, 17, 24)
    with sim_speed():
        eng = engine_layer(ck.cfg, 3, rig, prefix=4, tree_nodes=16)
    ref = layer_reference(ck.cfg, 3, layer, "int4", "fp32", prefix=4, tree_nodes=16, weights=ck)
    res = compare_layer(ck.cfg, 3, layer, "int4", "fp32", eng, ref, prefix=4, tree_nodes=16,
                           log=lambda m: None)
    assert all(r["passed"] for r in res), res
    if layer:
        assert lay.moe.path == ops.FUSED_MOE and all(r["routes_match"] for r in res[1:])


def test_a_checkpoint_layer_runs_its_own_int4_experts_only(ck):
    with pytest.raises(InputError, match="runs the experts it holds"):
        k2_layer.layer(ck.cfg, ck, 1, "fp32")
