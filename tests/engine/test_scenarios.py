"""The engine's reference scenarios (workbench.engine.scenarios) against the reference's: a prefill
and greedy decode steps, and one verify of a random 16-node tree with its latent rows. In the
simulator on a small K2-like seeded model built the way the K2-size run builds it
(``engine.build.SeededSource``: every K a multiple of 64, fused_moe, INT4 experts; or BF16 experts on
grouped GEMMs); on the GPU tier
also on the real k2_slice (dev/k2_slice_engine.py prints the same comparison with its numbers)."""

import numpy as np
import pytest

from tests.bench.test_k2_layer import ON_GPU, SMALL
from tests.engine.common import sure_steps
from workbench.ddtree.scenarios import (
    decode_reference,
    random_prompt,
    random_tree,
    tree_verify_reference,
)
from workbench.engine.build import SeededSource, build_model
from workbench.engine.runtime import Engine
from workbench.engine.scenarios import engine_decode, engine_tree_verify
from workbench.quant.w16a16 import w16a16
from workbench.seeded import SeededWeights

ATOL = 3e-2                  # W4A16 experts: float16 roundings can flip (tests/engine/common.py)


def _rel(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.maximum(np.linalg.norm(b, axis=-1), 1e-30)


def _check(cfg, seed, n_decode, nodes, workers=1, experts="int4"):
    w = SeededWeights(cfg, seed, "experts")
    if experts == "bf16":                        # the bf16 layout's experts, W16A16 with bf16 outputs
        w = w16a16(cfg, SeededWeights(cfg, seed, "bf16"), dense=False, experts=True)
    prompt = random_prompt(cfg, 6, seed)
    model = build_model(cfg, SeededSource(cfg, seed, experts=experts, workers=workers))
    eng = Engine(cfg, None, max_len=len(prompt) + max(n_decode, nodes) + 4,
                 max_rows=max(len(prompt), nodes + 1), model=model)
    tokens, logits = engine_decode(eng, prompt, n_decode)
    ref = decode_reference(cfg, w, prompt, n_decode)
    sure = sure_steps(ref.margins, ATOL, n_decode + 1)
    np.testing.assert_array_equal(tokens[:sure], ref.tokens[:sure])
    assert np.abs(logits[:sure + 1] - ref.logits[:sure + 1]).max() <= ATOL
    parents, node_tokens = random_tree(cfg, nodes, seed)
    got = engine_tree_verify(eng, prompt, parents, node_tokens)
    want = tree_verify_reference(cfg, w, prompt, parents, node_tokens)
    assert np.abs(got.logits - want.logits).max() <= ATOL
    assert _rel(got.latents, want.latents).max() <= 1e-3
    sure_nodes = want.margins > 2 * ATOL
    np.testing.assert_array_equal(got.logits.argmax(axis=1)[sure_nodes],
                                  want.logits.argmax(axis=1)[sure_nodes])
    return sure, int(sure_nodes.sum())


def test_small_k2_model_decodes_and_verifies_as_the_reference():
    sure, sure_nodes = _check(SMALL, 3, 4, 16)
    assert sure >= 2 and sure_nodes >= 8                         # the check compared tokens


def test_small_k2_model_with_bf16_experts_decodes_and_verifies_as_the_reference(monkeypatch):
    from kernels_numba import ops
    monkeypatch.setattr(ops, "BLAS", True)                       # grouped GEMMs run on the BLAS path
    sure, sure_nodes = _check(SMALL, 3, 4, 16, experts="bf16")
    assert sure >= 2 and sure_nodes >= 8


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="GPU tier: needs KDTREE_GPU=1 and a CUDA GPU")
@pytest.mark.parametrize("experts", ["int4", "bf16"])
def test_k2_slice_decodes_8_steps_and_verifies_a_16_node_tree_as_the_reference(experts):
    from workbench.config import preset
    _check(preset("k2_slice"), 0, 8, 16, workers=16, experts=experts)
