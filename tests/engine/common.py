"""Shared setup of the engine tests: golden bundles, one engine per bundle, tier-dependent sizes.

Two tiers run the same tests: CI (numba's CUDA simulator, with the faster block executor
``kernels_numba.sim``; a simulated decode step costs tenths of a second, more where the tensor-core
kernels run (int4_tiny), so short prompts and few rounds) and the GPU tier (KDTREE_GPU=1 on the H200:
every golden token). Both run every bundle, drafter and budget.
"""

from __future__ import annotations

import contextlib
import functools
import os

import numpy as np
import pytest

from workbench.ddtree.config import DrafterConfig
from workbench.quant.policy import quantize_weights
from workbench.reference.generate import greedy_generate
from workbench.refs import golden_bundle

GPU = os.environ.get("KDTREE_GPU") == "1"
BUNDLES = ("tiny", "tiny2", "int4_tiny", "int4_tiny2")
MAX_BUDGET = 64
# logits tolerance (max |engine - reference| over the vocabulary, every step): FP32 bundles differ
# only by summation order (measured ~2e-5); W4A16 bundles also round activations to float16, where an
# ulp of difference upstream can flip one rounding (measured ~5e-3).
ATOL = {"tiny": 1e-3, "tiny2": 1e-3, "int4_tiny": 3e-2, "int4_tiny2": 3e-2}


@functools.cache
def bundle(name: str):
    b = golden_bundle(name)
    return b, b.weights(), DrafterConfig.from_dict(b.meta["drafter"])


@functools.cache
def engine(name: str):
    """One engine per bundle, sized for the whole golden run and budgets up to MAX_BUDGET."""
    from workbench.engine.runtime import Engine
    b, w, dcfg = bundle(name)
    p = len(b.prompt)
    return Engine(b.config, w, max_len=p + len(b.golden) + MAX_BUDGET + 3, max_rows=max(p, MAX_BUDGET + 1),
                  taps=dcfg.target_layer_ids)


@contextlib.contextmanager
def blas_on(min_elements: int | None = None):
    """The BLAS path on while engines are built (also on the CPU); ``min_elements`` overrides its size
    rule."""
    from kernels_numba import ops
    saved = ops.BLAS, ops.BLAS_MIN_ELEMENTS
    ops.BLAS = True
    if min_elements is not None:
        ops.BLAS_MIN_ELEMENTS = min_elements
    try:
        yield
    finally:
        ops.BLAS, ops.BLAS_MIN_ELEMENTS = saved


@functools.cache
def blas_engine(name: str):
    """``engine(name)`` with every FP32 op on the BLAS path (torch over the buffers: cuBLAS on the GPU,
    torch's CPU BLAS under the simulator), which by default only K2-size weights take."""
    with blas_on(min_elements=0):
        return engine.__wrapped__(name)


def sure_steps(margins, atol: float, n: int) -> int:
    """The steps before the first one whose reference top-2 margin is at most 2 x atol (n if none): an
    implementation within atol of the reference owes the same tokens there."""
    close = np.flatnonzero(np.asarray(margins)[:n] <= 2 * atol)
    return int(close[0]) if close.size else n


@functools.cache
def w16a16_model(name: str):
    """(bundle, weights): the bundle's dense projections rounded to bf16 and marked W16A16
    (workbench.quant.w16a16), the rest as stored."""
    from numformats.bf16 import bf16
    from workbench.quant.w16a16 import w16a16, w16a16_names
    b, w, _ = bundle(name)
    wb = dict(w)
    wb.update({n: bf16(w[n]) for n in w16a16_names(b.config, w)})
    return b, w16a16(b.config, wb), wb


@functools.cache
def w16a16_engine(name: str, kernel: bool = False, budget: int = 0):
    """An engine on ``w16a16_model(name)``: its projections on the BLAS path, or on the W16A16 kernel
    (``kernel``; the attention core stays on the BLAS path); the rest where ops puts it. ``budget``: room
    for DDTree verifies of that many nodes (``engine.ar.engine_for``), else the golden run's AR."""
    from kernels_numba import ops
    from workbench.engine.ar import engine_for
    from workbench.engine.runtime import Engine
    b, w, _ = w16a16_model(name)
    saved, ops.W16_KERNEL = ops.W16_KERNEL, kernel
    try:
        with blas_on():
            if budget:
                return engine_for(b.config, w, len(b.prompt), len(b.golden), budget)
            return Engine(b.config, w, max_len=len(b.prompt) + len(b.golden) + 3, max_rows=len(b.prompt))
    finally:
        ops.W16_KERNEL = saved


@functools.cache
def reference_greedy(name: str, n: int, prompt_len: int | None = None):
    """The reference's greedy run from the bundle prompt (or its first prompt_len tokens)."""
    b, w, _ = bundle(name)
    return greedy_generate(b.config, w, np.asarray(b.prompt[:prompt_len], np.int64), n)


# tokens the policy-'experts' tests check per model: the reference's greedy margin at tiny's step 13 is
# 0.003, within the W4A16 noise, so tiny stops before it
EXPERTS_TOKENS = {"tiny": 12, "tiny2": 32 if GPU else 12}


@functools.cache
def experts_model(name: str):
    """(bundle, weights, drafter config) of an FP32 bundle quantized with policy 'experts' at G = 32: routed
    experts INT4, attention, router, shared expert, dense MLP and head FP32 (Kimi-K2's layout)."""
    b, w, dcfg = bundle(name)
    q, _ = quantize_weights(b.config, w, policy="experts", group_size=32)
    return b, q, dcfg


@functools.cache
def experts_engine(name: str):
    from workbench.engine.runtime import Engine
    b, w, dcfg = experts_model(name)
    p = len(b.prompt)
    return Engine(b.config, w, max_len=p + 32 + 16 + 3, max_rows=max(p, 17), taps=dcfg.target_layer_ids)

# The simulated end-to-end engine runs (1-40 s each on 2 cores): `-m "not slow"` skips them for a
# quick local pass; `make test` and the GPU tier run them all.
E2E = pytest.mark.slow
