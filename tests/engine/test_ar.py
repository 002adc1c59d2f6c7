"""Engine greedy AR on the golden bundles: tokens == golden, logits == reference at every step.

The GPU tier checks every golden token from the bundle prompt, the simulator the first SIM_TOKENS.
"""

import numpy as np
import pytest

from kernels_numba import ops
from tests.engine.common import (
    ATOL,
    BUNDLES,
    E2E,
    EXPERTS_TOKENS,
    GPU,
    blas_engine,
    bundle,
    engine,
    experts_engine,
    experts_model,
    reference_greedy,
    sure_steps,
    w16a16_engine,
    w16a16_model,
)
from workbench.engine.ar import engine_ar_generate

SIM_TOKENS = 12                      # a simulated W4A16 decode step costs ~1 s
W16A16_ATOL = 0.15                   # bf16 rounding flips between two summation orders (test below)


@E2E
@pytest.mark.parametrize("name", BUNDLES)
def test_engine_ar_matches_golden_and_reference_logits(name):
    b, _, _ = bundle(name)
    n = len(b.golden) if GPU else SIM_TOKENS
    res = engine_ar_generate(engine(name), b.prompt, n, return_logits=True)
    np.testing.assert_array_equal(res.tokens, np.asarray(b.golden[:n]))
    ref = reference_greedy(name, n)
    err = np.abs(res.logits - ref.logits).max(axis=1)            # [n] per step
    assert err.max() <= ATOL[name], f"logit error per step {err}"
    assert not np.array_equal(res.logits[0], np.zeros_like(res.logits[0]))


@E2E
@pytest.mark.parametrize("name", ["tiny", "int4_tiny"])
def test_engine_ar_on_blas_matches_golden_and_reference_logits(name):
    """Attention, projections, head, router logits and FP32 MLPs on the BLAS path."""
    from kernels_numba.ops import BLAS_PATH
    eng = blas_engine(name)
    assert {lay.attn.path for lay in eng.model.layers} == {BLAS_PATH} and eng.model.head.path == BLAS_PATH
    b, _, _ = bundle(name)
    n = len(b.golden) if GPU else SIM_TOKENS // 2
    res = engine_ar_generate(eng, b.prompt, n, return_logits=True)
    np.testing.assert_array_equal(res.tokens, np.asarray(b.golden[:n]))
    err = np.abs(res.logits - reference_greedy(name, n).logits).max(axis=1)
    assert err.max() <= ATOL[name], f"logit error per step {err}"


@E2E
@pytest.mark.parametrize("name", ["tiny", "tiny2"])
def test_engine_ar_policy_experts_matches_reference(name):
    """Policy 'experts' (tiny: routed experts on fused_moe, the FP32 shared expert on the portable
    kernels; tiny2: all portable): tokens == the reference's greedy tokens, logits within the W4A16
    tolerance, every step's reference margin wider than twice that tolerance (so equal tokens are owed)."""
    from workbench.reference.generate import greedy_generate
    b, w, _ = experts_model(name)
    n = EXPERTS_TOKENS[name]
    ref = greedy_generate(b.config, w, b.prompt, n)
    assert ref.margins.min() > 2 * ATOL["int4_tiny"], ref.margins
    res = engine_ar_generate(experts_engine(name), b.prompt, n, return_logits=True)
    np.testing.assert_array_equal(res.tokens, ref.tokens)
    err = np.abs(res.logits - ref.logits).max(axis=1)
    assert err.max() <= ATOL["int4_tiny"], f"logit error per step {err}"


def test_engine_ar_rejects_bad_requests():
    from workbench.errors import InputError
    b, _, _ = bundle("tiny")
    with pytest.raises(InputError):
        engine_ar_generate(engine("tiny"), [b.config.vocab_size], 1)
    with pytest.raises(InputError):
        engine_ar_generate(engine("tiny"), b.prompt, 0)
    with pytest.raises(InputError):
        engine_ar_generate(engine("tiny"), b.prompt, 10_000)


@E2E
@pytest.mark.parametrize("seed", [0, pytest.param(7, marks=pytest.mark.slow)])
def test_engine_ar_sampled_equals_reference(seed):  # CI: 3-token prompt, 3 tokens
    """T = 1: same Generator, one draw per token, as ``ar_generate``: the same tokens."""
    from workbench.ddtree.ar import ar_generate
    from workbench.ddtree.config import SamplingParams
    b, w, _ = bundle("tiny")
    n = len(b.golden) if GPU else 3
    prompt = np.asarray(b.prompt if GPU else b.prompt[:3], np.int64)
    sp = SamplingParams(temperature=1.0, seed=seed)
    got = engine_ar_generate(engine("tiny"), prompt, n, sampling=sp)
    want = ar_generate(b.config, w, prompt, n, sp)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    assert not np.array_equal(got.tokens, reference_greedy("tiny", n, len(prompt)).tokens)  # sampler live


@E2E
@pytest.mark.parametrize("kernel", [False, True])
def test_engine_ar_w16a16_matches_reference(kernel):
    """tiny with its dense projections and attention core W16A16 (bf16 operands, bf16 latent cache), the
    projections on the BLAS path or on the W16A16 kernel (``kernel``), against the reference's W16A16.
    Both sum in float32 in their own order, and an activation next to a bf16 rounding boundary then
    rounds differently in the two; through the bf16 cache such a flip stays in every later step.
    Measured on the CPU over 5 random prompts x 10 steps of tiny and tiny2: logits up to 8.7e-2 apart,
    the same tokens everywhere. So: tokens equal up to the first step whose reference top-2 margin is
    under 2 x W16A16_ATOL, logits within W16A16_ATOL."""
    from workbench.reference.generate import greedy_generate, top2_margin
    b, w, _ = w16a16_model("tiny")
    n = len(b.golden) if GPU else SIM_TOKENS // 2
    eng = w16a16_engine("tiny", kernel)
    assert {lay.wo.path for lay in eng.model.layers} == {ops.W16A16 if kernel else ops.BLAS_PATH}
    assert all((lay.attn.uk is not None) == kernel for lay in eng.model.layers)   # absorptions on the kernel
    assert all(ops.folds_norm(lay.a1, 1) == kernel for lay in eng.model.layers)   # decode's attn_norm in a1
    res = engine_ar_generate(eng, b.prompt, n, return_logits=True)
    ref = greedy_generate(b.config, w, np.asarray(b.prompt, np.int64), n)
    sure = sure_steps([top2_margin(lg) for lg in ref.logits], W16A16_ATOL, n)   # and its logits compare
    np.testing.assert_array_equal(res.tokens[:sure], ref.tokens[:sure])
    err = np.abs(res.logits[:sure + 1] - ref.logits[:sure + 1]).max(axis=1)
    assert err.max() <= W16A16_ATOL, f"logit error per step {err}"
