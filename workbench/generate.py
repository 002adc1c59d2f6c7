"""The one generation entry point: AR, DDTree or DFlash-chain decoding on the numpy reference or on the
engine.

The command line (``generate``), the notebooks and the benchmarks call ``generate``; the backend x mode
dispatch lives only here. backend "reference" is the spec (``workbench.ddtree.ar_generate`` /
``ddtree_generate`` / ``chain.chain_generate``); "numba" is the engine (``workbench.engine``) on the
GPU, or in numba's CUDA simulator without one. The engine is built for the request
(``engine.ar.engine_for``) unless one is passed in (a benchmark reuses its engine and its captured
steps across calls).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .config import ModelConfig
from .ddtree.config import GREEDY, SamplingParams
from .ddtree.speculative import RoundStats
from .errors import InputError

BACKENDS = ("reference", "numba")
MODES = ("ar", "ddtree", "chain")


@dataclass
class Generation:
    tokens: np.ndarray                                      # [n] int64 generated ids
    seconds: float                                          # wall time of the call (engine set-up included)
    rounds: list[RoundStats] = field(default_factory=list)  # DDTree / chain rounds; empty for AR

    @property
    def mean_accepted(self) -> float:                       # tau: tokens per round, bonus included (AR: 1)
        return float(np.mean([r.accepted_len for r in self.rounds])) if self.rounds else 1.0


def generate(cfg: ModelConfig, weights: dict[str, Any], prompt: Any, n_tokens: int, *,
             backend: str = "reference", mode: str = "ar", drafter: Any = "dflash", budget: Any = 16,
             cost_curve: Any = None, sampling: SamplingParams = GREEDY, drafter_config: Any = None,
             oracle_p: float = 1.0, oracle_seed: int = 0, continuation: Any = None, engine: Any = None,
             timing: dict | None = None,
             progress: Callable[[int, int, str], None] | None = None) -> Generation:
    """Generate ``n_tokens`` after ``prompt``: greedy at ``sampling.temperature`` 0, else sampled with the
    run's one Generator (both backends draw the same tokens for the same seed).

    mode "ddtree": ``drafter`` ("dflash", "oracle" or a Drafter), ``budget`` nodes per tree (an int
    B >= 1), or "auto" with ``cost_curve`` (a ``workbench.ddtree.budget.CostCurve`` or a JSON file:
    each round verifies the prefix of the tree with the most expected tokens per microsecond), or a
    TreeBudget; the budget is read and checked here, once (``tree_budget``). The
    drafter options of ``workbench.ddtree.drafter.make_drafter``; mode "chain": the same drafter verified
    as the chain of its L argmax tokens (no budget). backend "numba": ``engine`` (a
    ``workbench.engine.runtime.Engine`` big enough for the request) or None; ``timing`` receives the
    engine's decode-phase wall times (``engine_ar_generate`` / ``engine_ddtree_generate``). progress:
    called as ``progress(tokens done, n_tokens, what)`` after each token (AR) or round (DDTree, chain).
    """
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "ddtree":
        from .ddtree.budget import tree_budget
        from .ddtree.inputs import check_budget
        budget = tree_budget(budget, cost_curve)
        check_budget(budget.max_nodes, cfg)
    t0 = time.perf_counter()
    kw = dict(drafter_config=drafter_config, oracle_p=oracle_p, oracle_seed=oracle_seed,
              continuation=continuation)
    if backend == "reference":
        if mode == "ar":
            from .ddtree.ar import ar_generate
            return Generation(ar_generate(cfg, weights, prompt, n_tokens, sampling, progress=progress).tokens,
                              time.perf_counter() - t0)
        if mode == "chain":
            from .ddtree.chain import chain_generate
            r = chain_generate(cfg, weights, prompt, n_tokens, drafter, sampling, **kw, progress=progress)
            return Generation(r.tokens, time.perf_counter() - t0, r.rounds)
        from .ddtree.speculative import ddtree_generate
        r = ddtree_generate(cfg, weights, prompt, n_tokens, drafter, budget, sampling, **kw,
                            on_round=_rounds(progress, n_tokens))
        return Generation(r.tokens, time.perf_counter() - t0, r.rounds)
    from .ddtree.inputs import check_run
    from .engine.ar import engine_ar_generate, engine_for
    toks, n_tokens = check_run(cfg, prompt, n_tokens, sampling)
    if mode == "ar":
        eng = engine or engine_for(cfg, weights, len(toks), n_tokens)
        r = engine_ar_generate(eng, toks, n_tokens, sampling=sampling, timing=timing, progress=progress)
        return Generation(r.tokens, time.perf_counter() - t0)
    from .ddtree.drafter import make_drafter
    from .engine.ddtree import engine_ddtree_generate
    draft = make_drafter(drafter, cfg, weights, toks, n_tokens, np.float32, **kw)
    if mode == "chain":
        from .engine.chain import engine_chain_generate
        n_pos = draft.block_size - 1
        eng = engine or engine_for(cfg, weights, len(toks), n_tokens, n_pos, taps=tuple(draft.capture))
        r = engine_chain_generate(eng, weights, toks, n_tokens, draft, sampling, timing=timing,
                                  progress=progress)
        return Generation(r.tokens, time.perf_counter() - t0, r.rounds)
    eng = engine or engine_for(cfg, weights, len(toks), n_tokens, budget.max_nodes,
                               taps=tuple(draft.capture))
    r = engine_ddtree_generate(eng, weights, toks, n_tokens, draft, budget, sampling, timing=timing,
                               progress=progress)
    return Generation(r.tokens, time.perf_counter() - t0, r.rounds)


def _rounds(progress: Callable[[int, int, str], None] | None, n_tokens: int) -> Callable | None:
    """``ddtree_generate``'s on_round as a progress callback: tokens done (accepted path and bonus)."""
    if progress is None:
        return None
    done = [0, 0]                                           # tokens, rounds

    def on_round(trace) -> None:
        done[0] += len(trace.accepted)
        done[1] += 1
        progress(min(done[0], n_tokens), n_tokens, f"round {done[1]}")
    return on_round
