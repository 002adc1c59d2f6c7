"""The device-layer builder (workbench/engine/build.py): a model whose MoE layers cycle over a few distinct
weight sets, from a weights mapping or drawn at random in the kernels' layouts, decodes the tokens the
numpy reference decodes on the same weights (the same layers at the same positions).

The config is tiny2's with an expert width of 64 (fused_moe's tile layout wants multiples of 64), one
dense layer and four MoE positions over two sets: K2's stand-in in miniature. W16A16 projections run on
the BLAS path (torch's CPU BLAS under the simulator): tokens must match up to the first step whose
reference top-2 margin is within the W16A16 noise, logits within it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from workbench.config import preset
from workbench.reference.generate import greedy_generate, top2_margin
from workbench.reference.model import LatentCache, forward

from .common import E2E, GPU, blas_on, sure_steps
from .test_ar import W16A16_ATOL

CFG = dataclasses.replace(preset("tiny2"), moe_intermediate_size=64, num_hidden_layers=5,
                          first_k_dense_replace=1)
SETS = 2
PROMPT = np.array([300, 7, 77, 123, 9, 10], np.int64)
N = 12 if GPU else 5


def _engine(model):
    from workbench.engine.runtime import Engine
    return Engine(CFG, None, max_len=len(PROMPT) + N + 2, max_rows=len(PROMPT), model=model)


def _settled(ref_weights, ref) -> int:
    """The steps before the first whose logits the reference itself gives two ways more than the tolerance
    apart (step by step, as generated, and in one forward over the whole sequence): a routing near-tie
    that float summation order decides, so no implementation owes the reference's token past it."""
    seq = np.concatenate([PROMPT, ref.tokens[:-1]])
    whole = forward(CFG, ref_weights, seq, LatentCache.empty(CFG, len(seq))).logits[len(PROMPT) - 1:]  # [N,V]
    apart = np.flatnonzero(np.abs(whole - ref.logits).max(axis=1) > W16A16_ATOL)
    return int(apart[0]) if apart.size else N


def _reference(ref_weights):
    """(the reference's generation, the steps whose tokens and the steps whose logits it owes an
    implementation within the tolerance)."""
    ref = greedy_generate(CFG, ref_weights, PROMPT, N)
    settled = _settled(ref_weights, ref)
    sure = sure_steps([top2_margin(lg) for lg in ref.logits], W16A16_ATOL, N)
    return ref, min(sure, settled), min(sure + 1, settled)


def _same_tokens(model, ref_weights, reference=None):
    from workbench.engine.ar import engine_ar_generate
    got = engine_ar_generate(_engine(model), PROMPT, N, return_logits=True)
    ref, tokens, logits = reference or _reference(ref_weights)
    assert tokens >= 2, "the random model's margins leave nothing to compare"
    np.testing.assert_array_equal(got.tokens[:tokens], ref.tokens[:tokens])
    err = np.abs(got.logits[:logits] - ref.logits[:logits]).max(axis=1)
    assert err.max() <= W16A16_ATOL, f"logit error per step {err}"
    return ref


def test_source_layer_cycles_moe_layers():
    from workbench.engine.build import source_layer
    k2 = preset("k2_6")
    got = [source_layer(k2, i, 12) for i in range(k2.num_hidden_layers)]
    assert got[:14] == [0, *range(1, 13), 1] and set(got[1:]) == set(range(1, 13))
    assert [source_layer(CFG, i, None) for i in range(5)] == list(range(5))


@E2E
def test_mapping_source_cycled_sets_match_reference():
    """Seeded weights of K2's layout (INT4 experts, bf16 W16A16 projections) for one dense + two MoE
    layers, built with the MoE positions cycling over the two."""
    from workbench.engine.build import Cycled, MappingSource, build_model
    from workbench.quant.w16a16 import w16a16
    from workbench.seeded import SeededWeights
    small = dataclasses.replace(CFG, num_hidden_layers=1 + SETS)
    w = w16a16(small, SeededWeights(small, 5, "experts"))
    with blas_on():
        model = build_model(CFG, MappingSource(CFG, w), sets=SETS)
    assert model.layers[1] is model.layers[3] and model.layers[2] is model.layers[4]
    assert [p.get("experts") for p in model.paths()[1:]] == ["fused_moe"] * 4
    ref = _same_tokens(model, Cycled(CFG, w, SETS))
    other = greedy_generate(CFG, Cycled(CFG, w, 1), PROMPT, 2)       # a different cycle is another model
    assert not np.allclose(other.logits, ref.logits[:2], atol=W16A16_ATOL)


@E2E
def test_random_source_matches_reference_on_its_downloaded_weights():
    """Random weights drawn in the kernels' layouts, downloaded back (tile layout unpacked), give the
    reference the engine's tokens. The draws differ between the simulator and a GPU: the first seed whose
    reference settles two steps (no routing near-tie its own summation order decides) is compared."""
    from workbench.engine.build import Cycled, RandomSource, build_model, model_weights
    for seed in (6, 7, 8):
        with blas_on():
            model = build_model(CFG, RandomSource(CFG, seed=seed), sets=SETS)
        w = Cycled(CFG, model_weights(model, SETS), SETS)
        reference = _reference(w)
        if reference[1] >= 2:
            break
    scale = w["layers.1.ffn.experts.0.w2.scale"]
    assert scale.dtype == np.float16 and (scale > 0).all()
    _same_tokens(model, w, reference)


def test_random_source_needs_the_tile_layout():
    from kernels_numba import KernelInputError
    from workbench.engine.build import RandomSource
    bad = dataclasses.replace(CFG, moe_intermediate_size=32)
    with blas_on(), pytest.raises(KernelInputError, match="multiples of 64"):
        RandomSource(bad).experts()


def test_random_expert_codes_are_zero_mean():
    """INT4 codes in [-7, 7] (no q = -8): a common offset in every expert would pull every token's hidden
    state along one direction and route every token alike."""
    from workbench.engine.build import RandomSource
    with blas_on():
        fw = RandomSource(CFG, seed=1).experts()
    words = np.asarray(fw.w2.wq).view(np.uint8)
    q = np.concatenate([words & 15, words >> 4]).astype(np.int64) - 8
    assert q.min() == -7 and q.max() == 7 and abs(q.mean()) < 0.05
