"""DDTree speculative decoding on the engine (mirrors ``workbench.ddtree.speculative.ddtree_generate``).

The loop reads as the reference's: draft -> build_tree -> verify -> walk -> commit, each a method of
the per-generation state (``engine.rounds.EngineSpecState``). Per round: draft logits -> per-position
top-k on the device -> best-first heap on the host over the copied [L, K] table
(engine.tree_host.build_tree_host, a few microseconds), cut to the budget's choice -> one upload of
the control block (tree + previous accepted path) -> the verify step captured for the smallest size
>= N (KV compaction of the previous round, tree compile, forward over root + nodes with the
ancestor-only mask) -> copy back the target's token per node -> walk -> commit. Greedy (T = 0):
the argmax per node, computed on the device.
Sampled (T > 0): the verify logits of the N + 1 rows are copied back and the host draws one token
per node with the reference's ``sample_tokens`` and the run's one Generator (seeded by
``sampling.seed``; first the prompt's last row, then N + 1 uniforms per round in node order), so the
engine follows the reference's random stream draw for draw and yields the same tokens (barring a
uniform within the ~1e-5 logit difference of a CDF boundary).

Drafters are the reference's (``workbench.ddtree.drafter.make_drafter``): the oracle's logits depend
only on (seed, position), so the engine tabulates them once per generation on the device and the
top-k kernel reads rows start+1 .. start+L in place. The dflash drafter runs on the device
(``engine.dflash.DeviceDFlash``: its context cache lives there, it reads the tapped target features
the verify step leaves in the engine's tap buffer, and the top-k kernel reads its [L, V] logits in
place); drafters with INT4-packed projections, or ``device_drafter=False``, run on the host
(numpy reference) from the tapped features copied back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kernels_numba import ops

from ..ddtree.budget import TreeBudget, tree_budget
from ..ddtree.config import GREEDY, SamplingParams
from ..ddtree.drafter import make_drafter
from ..ddtree.inputs import check_run
from ..ddtree.speculative import SpecResult
from ..errors import InputError
from .rounds import PHASES, EngineSpecState, run_rounds
from .runtime import Engine


def engine_ddtree_generate(engine: Engine, weights: dict[str, Any], prompt: Any, n_tokens: int,
                           drafter: Any = "dflash", budget: int | TreeBudget = 16,
                           sampling: SamplingParams = GREEDY, *, drafter_config: Any = None,
                           oracle_p: float = 1.0, oracle_seed: int = 0, continuation: Any = None,
                           timing: dict | None = None, device_drafter: bool = True,
                           progress: Callable[[int, int, str], None] | None = None) -> SpecResult:
    """Generate ``n_tokens`` with DDTree on ``engine`` (greedy at T = 0, lossless sampling at T > 0);
    same arguments and result as the reference ``ddtree_generate`` (``weights`` feed the drafter).
    timing: if a dict, receives ``decode_s`` (wall time of all rounds after the prefill) and its
    parts ``draft_s`` (drafter, top-k, copy back), ``build_s`` (host heap build and the budget's
    choice), ``verify_s`` (control upload, verify graph, copy back); the rest is the walk and
    bookkeeping. device_drafter: run a dflash drafter with dense projections on the device (default)
    rather than on the host. progress: ``progress(tokens done, n_tokens, "round r")`` after each round."""
    toks, n_tokens = check_run(engine.cfg, prompt, n_tokens, sampling)
    budget = tree_budget(budget)
    draft = make_drafter(drafter, engine.cfg, weights, toks, n_tokens, np.float32,
                         drafter_config=drafter_config,
                         oracle_p=oracle_p, oracle_seed=oracle_seed, continuation=continuation)
    missing = [k for k in draft.capture if k not in engine.taps]
    if missing:
        raise InputError(f"the engine does not tap layers {missing} that the drafter reads")
    b = budget.max_nodes
    if len(toks) + n_tokens + b + 1 > engine.buf.max_len or b + 1 > engine.buf.max_rows:
        raise InputError("the engine is too small for this request (see engine.ar.engine_for)")
    clock = dict.fromkeys(PHASES, 0.0) if timing is not None else None      # host wall time per step
    with ops.sim_speed():
        state = EngineSpecState(engine, draft, budget, sampling, toks, device_drafter, clock)
        decode_s = run_rounds(state, n_tokens, progress)
        if timing is not None:
            timing.update(clock, decode_s=decode_s)
    return SpecResult(tokens=np.asarray(state.tokens[:n_tokens], dtype=np.int64), rounds=state.rounds)
