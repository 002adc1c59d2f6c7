"""One generation run for the AR-vs-DDTree notebook, on either backend, with its wall time.

backend "reference" is the numpy spec (workbench.ddtree); "numba" is the engine (workbench.engine)
on the GPU, or in numba's CUDA simulator when the notebook's device is 'cpu'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..ddtree import DrafterConfig, ar_generate, ddtree_generate
from ..ddtree.speculative import RoundStats
from ..errors import InputError

BACKENDS = ("reference", "numba")


@dataclass
class CaseResult:
    tokens: np.ndarray                       # [n] int64
    seconds: float                           # wall time of the whole call (engine set-up included)
    rounds: list[RoundStats] = field(default_factory=list)   # empty for AR


def run_case(backend: str, mode: str, cfg: ModelConfig, weights: dict[str, Any], prompt: Any, n_tokens: int,
             drafter: str = "dflash", budget: int = 16, drafter_config: DrafterConfig | None = None,
             oracle_p: float = 0.8, oracle_seed: int = 0) -> CaseResult:
    """Greedy AR (mode 'ar') or greedy DDTree (mode 'ddtree') of n_tokens after prompt."""
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if mode not in ("ar", "ddtree"):
        raise InputError(f"mode must be 'ar' or 'ddtree', got {mode!r}")
    kw = {"drafter_config": drafter_config, "oracle_p": oracle_p, "oracle_seed": oracle_seed}
    t0 = time.perf_counter()
    if backend == "reference":
        if mode == "ar":
            return CaseResult(ar_generate(cfg, weights, prompt, n_tokens).tokens, time.perf_counter() - t0)
        r = ddtree_generate(cfg, weights, prompt, n_tokens, drafter=drafter, budget=budget, **kw)
        return CaseResult(r.tokens, time.perf_counter() - t0, r.rounds)
    from ..engine.ar import engine_ar_generate, engine_for
    from ..engine.ddtree import engine_ddtree_generate

    if mode == "ar":
        eng = engine_for(cfg, weights, len(prompt), n_tokens)
        return CaseResult(engine_ar_generate(eng, prompt, n_tokens).tokens, time.perf_counter() - t0)
    taps = (drafter_config.target_layer_ids if drafter_config is not None else ())
    eng = engine_for(cfg, weights, len(prompt), n_tokens, budget=budget, taps=tuple(taps))
    r = engine_ddtree_generate(eng, weights, prompt, n_tokens, drafter=drafter, budget=budget, **kw)
    return CaseResult(r.tokens, time.perf_counter() - t0, r.rounds)
