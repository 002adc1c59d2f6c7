"""Which kernels each layer of each model runs on (``DeviceModel.paths``), so a silent fallback from the
tensor-core kernels to the portable ones fails here: int4_tiny (every width a multiple of 64) runs
int4_matmul and fused_moe; int4_tiny2's experts (width 32) the portable kernels, its dense MLP (192 / 256)
int4_matmul; FP32 models and ``fast_kernels=False`` the portable kernels only; policy 'experts' puts only
the routed experts on fused_moe. Also the loader's one-line errors."""

import numpy as np
import pytest

from kernels_numba.ops import FUSED_MOE, INT4_MATMUL, PORTABLE
from tests.engine.common import bundle, engine, experts_model
from workbench.engine.build import upload_model
from workbench.errors import InputError


def _expect(cfg, dense: str, experts: str, shared: str):
    return [{"mlp": dense} if not cfg.is_moe_layer(i) else {"experts": experts, "shared": shared}
            for i in range(cfg.num_hidden_layers)]


@pytest.mark.parametrize("name,dense,experts,shared", [
    ("tiny", PORTABLE, PORTABLE, PORTABLE),
    ("tiny2", PORTABLE, PORTABLE, PORTABLE),
    ("int4_tiny", INT4_MATMUL, FUSED_MOE, FUSED_MOE),
    ("int4_tiny2", INT4_MATMUL, PORTABLE, PORTABLE)])
def test_golden_bundles_run_the_expected_kernels(name, dense, experts, shared):
    b, _, _ = bundle(name)
    assert engine(name).model.paths() == _expect(b.config, dense, experts, shared)


@pytest.mark.parametrize("name,experts", [("tiny", FUSED_MOE), ("tiny2", PORTABLE)])
def test_policy_experts_puts_only_the_routed_experts_on_int4(name, experts):
    b, w, _ = experts_model(name)
    assert upload_model(b.config, w).paths() == _expect(b.config, PORTABLE, experts, PORTABLE)


def test_fast_kernels_off_keeps_every_layer_portable():
    b, w, _ = bundle("int4_tiny")
    assert upload_model(b.config, w, fast=False).paths() == _expect(b.config, PORTABLE, PORTABLE, PORTABLE)


def test_loader_errors_are_one_line_input_errors():
    b, w, _ = bundle("int4_tiny")
    mixed = dict(w)
    mixed["layers.1.ffn.experts.0.w1"] = np.zeros((b.config.moe_intermediate_size, b.config.hidden_size),
                                                  np.float32)
    del mixed["layers.1.ffn.experts.0.w1.packed"], mixed["layers.1.ffn.experts.0.w1.scale"]
    with pytest.raises(InputError, match="mixed FP32 / INT4"):
        upload_model(b.config, mixed)
    packed_attn = {k: v for k, v in w.items() if k != "layers.0.attn.wo"}
    packed_attn["layers.0.attn.wo.packed"] = np.zeros((b.config.hidden_size, 8), np.int32)
    with pytest.raises(InputError, match="INT4-packed"):
        upload_model(b.config, packed_attn)
    with pytest.raises(InputError, match="missing weight tensor 'head'"):
        upload_model(b.config, {k: v for k, v in w.items() if k != "head"})
