"""The plain DFlash chain on the engine (mirrors ``workbench.ddtree.chain.chain_generate``): DDTree's
round steps (``engine.rounds.EngineSpecState``) with the heap replaced by the chain of the L top-1
draft tokens, so every verify runs L + 1 rows.

Legend: L drafted positions, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import Mirror, zeros

from ..ddtree.budget import TreeBudget
from ..ddtree.config import GREEDY, SamplingParams
from ..ddtree.drafter import make_drafter
from ..ddtree.inputs import check_run
from ..ddtree.speculative import SpecResult
from ..errors import InputError
from .rounds import PHASES, EngineSpecState, run_rounds, timed
from .runtime import Engine


class ChainState(EngineSpecState):
    """``EngineSpecState`` at budget L whose tree is the chain: top-1 only from the device, one path."""

    def __init__(self, engine: Engine, drafter: Any, sampling: SamplingParams, prompt: np.ndarray,
                 device_drafter: bool, clock: dict | None = None) -> None:
        super().__init__(engine, drafter, TreeBudget(drafter.block_size - 1), sampling, prompt,
                         device_drafter, clock)
        self.k = 1                                                        # the argmax per position
        self.lpk = Mirror(zeros((2, self.n_pos, 1), np.float64))          # [2, L, 1] top-1 log-prob, id

    @timed("build_s")
    def build_tree(self) -> int:
        """The chain into ctl rows 0-2: node d (1..L) holds position d's top-1 token under node d - 1."""
        n, ctl = self.n_pos, self.ctl
        ctl[0, 1:n + 1] = self.lpk.host[1, :, 0]                          # token ids (exact in float64)
        ctl[1, :n + 1] = np.arange(n + 1)
        ctl[2, :n + 1] = np.arange(-1, n)
        return n


def engine_chain_generate(engine: Engine, weights: dict[str, Any], prompt: Any, n_tokens: int,
                          drafter: Any = "dflash", sampling: SamplingParams = GREEDY, *,
                          drafter_config: Any = None, oracle_p: float = 1.0, oracle_seed: int = 0,
                          continuation: Any = None, timing: dict | None = None,
                          device_drafter: bool = True,
                          progress: Callable[[int, int, str], None] | None = None) -> SpecResult:
    """Generate ``n_tokens`` with the DFlash chain on ``engine``; arguments and result as the reference
    ``chain_generate`` (``weights`` feed the drafter), ``timing`` and ``device_drafter`` as in
    ``engine_ddtree_generate`` (``timing`` receives ``decode_s``). The engine must hold L + 1 rows.
    progress: ``progress(tokens done, n_tokens, "round r")`` after each round."""
    toks, n_tokens = check_run(engine.cfg, prompt, n_tokens, sampling)
    draft = make_drafter(drafter, engine.cfg, weights, toks, n_tokens, np.float32,
                         drafter_config=drafter_config, oracle_p=oracle_p, oracle_seed=oracle_seed,
                         continuation=continuation)
    missing = [k for k in draft.capture if k not in engine.taps]
    if missing:
        raise InputError(f"the engine does not tap layers {missing} that the drafter reads")
    n_pos = draft.block_size - 1
    if len(toks) + n_tokens + n_pos + 1 > engine.buf.max_len or n_pos + 1 > engine.buf.max_rows:
        raise InputError("the engine is too small for this request (see engine.ar.engine_for)")
    clock = dict.fromkeys(PHASES, 0.0) if timing is not None else None      # host wall time per step
    with ops.sim_speed():
        state = ChainState(engine, draft, sampling, toks, device_drafter, clock)
        decode_s = run_rounds(state, n_tokens, progress)
        if timing is not None:
            timing.update(clock, decode_s=decode_s)
    return SpecResult(tokens=np.asarray(state.tokens[:n_tokens], dtype=np.int64), rounds=state.rounds)
