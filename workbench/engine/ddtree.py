"""DDTree speculative decoding on the engine (mirrors ``workbench.ddtree.speculative.ddtree_generate``).

Per round: draft logits -> per-position top-k on the device -> best-first heap on the host over the
copied [L, K] table (kernels_numba.tree.build_tree_host, a few microseconds) -> one upload of the
control block (tree + previous accepted path) -> the captured verify step (KV compaction of the
previous round, tree compile, forward over root + nodes with the ancestor-only mask) -> copy back the
target's argmax per node -> walk. Greedy only (temperature 0).

Drafters are the reference's (``workbench.ddtree.drafter.make_drafter``): the oracle's logits depend
only on (seed, position), so the engine tabulates them once per generation on the device and the
top-k kernel reads rows start+1 .. start+L in place; the dflash drafter runs on the host (numpy)
from the tapped target features the verify step leaves on the device.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from kernels_numba.tree import build_tree_host, topk_logprobs, walk_host

from ..ddtree.config import GREEDY, SamplingParams
from ..ddtree.drafter import make_drafter
from ..ddtree.inputs import check_budget, check_run
from ..ddtree.oracle import OracleDrafter, oracle_logits
from ..ddtree.speculative import RoundStats, SpecResult
from ..errors import InputError
from .devarray import host_buffer, sim_speed, to_device, zeros
from .runtime import Engine


def engine_ddtree_generate(engine: Engine, weights: dict[str, Any], prompt: Any, n_tokens: int,
                           drafter: Any = "dflash", budget: int = 16, sampling: SamplingParams = GREEDY, *,
                           drafter_config: Any = None, oracle_p: float = 1.0, oracle_seed: int = 0,
                           continuation: Any = None, timing: dict | None = None) -> SpecResult:
    """Generate ``n_tokens`` with greedy DDTree on ``engine``; same arguments and result as the
    reference ``ddtree_generate`` (``weights`` feed the host-side drafter). timing: if a dict,
    receives ``decode_s`` (wall time of all rounds after the prefill) and its parts ``draft_s``
    (drafter, top-k, copy back), ``build_s`` (host heap builds), ``verify_s`` (control upload,
    verify graph, copy back); the rest is the walk and bookkeeping."""
    cfg = engine.cfg
    toks, n_tokens = check_run(cfg, prompt, n_tokens, sampling)
    budget = check_budget(budget)
    if not sampling.greedy:
        raise InputError("the numba engine decodes greedily only (temperature 0); use --backend reference")
    draft = make_drafter(drafter, cfg, weights, toks, n_tokens, budget, np.float32,
                         drafter_config=drafter_config,
                         oracle_p=oracle_p, oracle_seed=oracle_seed, continuation=continuation)
    missing = [k for k in draft.capture if k not in engine.taps]
    if missing:
        raise InputError(f"the engine does not tap layers {missing} that the drafter reads")
    p = len(toks)
    n_pos = draft.block_size - 1                             # L
    if p + n_tokens + budget + 1 > engine.buf.max_len or budget + 1 > engine.buf.max_rows:
        raise InputError("the engine is too small for this request (see engine.ar.engine_for)")
    k = min(budget, cfg.vocab_size)
    s = engine.stream
    tap_idx = [engine.taps.index(t) for t in draft.capture]
    lpk = zeros((2, n_pos, k), np.float64)                   # per-generation device arrays
    lpk_h = host_buffer((2, n_pos, k), np.float64)           # and pinned host staging
    ctl = host_buffer(engine.buf.ctl.shape, np.int32)
    post_h = host_buffer(engine.buf.max_rows, np.int32)
    ids_h = np.zeros((n_pos, k), np.int32)
    feats_h = host_buffer(engine.buf.feats.shape, np.float32) if tap_idx else None
    if isinstance(draft, OracleDrafter):                     # logits of every position, row = position
        table = to_device(oracle_logits(draft.sequence, cfg.vocab_size, -1, engine.buf.max_len + n_pos + 1,
                                         draft.p, draft.seed))
    else:
        table = zeros((n_pos, cfg.vocab_size), np.float32)
    ctl[...] = 0
    acc = np.zeros(n_pos + 2, np.int32)
    with sim_speed():
        step = engine.verify_step(budget)
        engine.prefill(toks)
        first = int(engine.fetch(engine.buf.amax)[p - 1])
        feats = engine.fetch(engine.buf.feats) if tap_idx else None
        state = SimpleNamespace(start=p, bonus=first, tokens=[first],
                                new_features=_features(feats, tap_idx, np.arange(p)))
        rounds: list[RoundStats] = []
        prev_acc = np.zeros(0, np.int32)
        prev_start = 0
        clock = {"draft_s": 0.0, "build_s": 0.0, "verify_s": 0.0}    # host wall time per phase
        t0 = time.perf_counter()
        while len(state.tokens) < n_tokens:
            ta = time.perf_counter()
            if isinstance(draft, OracleDrafter):
                row0 = state.start + 1
            else:
                engine.put(table, np.asarray(draft.propose(state), np.float32))     # [L, V]
                row0 = 0
            topk_logprobs(lpk, table, row0, k, n_pos, s)
            engine.fetch_into(lpk, lpk_h)
            tb = time.perf_counter()
            np.copyto(ids_h, lpk_h[1], casting="unsafe")      # token ids (exact in float64)
            n = build_tree_host(lpk_h[0], ids_h, budget, n_pos, ctl)
            tc = time.perf_counter()
            ctl[0, 0] = state.bonus
            ctl[3, :prev_acc.size] = prev_acc
            ctl[4, :4] = (state.start, prev_acc.size, prev_start, n + 1)
            engine.put(engine.buf.ctl, ctl)
            step.run(s)
            post = engine.fetch_into(engine.buf.amax, post_h)[:n + 1]
            td = time.perf_counter()
            clock["draft_s"] += tb - ta                      # drafter + top-k + copy back
            clock["build_s"] += tc - tb                      # host heap build
            clock["verify_s"] += td - tc                     # control upload + verify graph + copy back
            count, bonus = walk_host(ctl, n, post, acc)
            path = acc[:count].copy()
            if tap_idx:
                feats = engine.fetch_into(engine.buf.feats, feats_h)
            state.tokens.extend(int(ctl[0, i]) for i in path[1:])
            state.tokens.append(int(bonus))
            rounds.append(RoundStats(tree_size=int(n), accepted_len=int(count),
                                     depth=int(ctl[1, 1:n + 1].max()) if n else 0))
            state.new_features = _features(feats, tap_idx, path)
            prev_acc, prev_start = path, state.start
            state.start += int(count)
            state.bonus = int(bonus)
        if timing is not None:
            timing["decode_s"] = time.perf_counter() - t0
            timing.update(clock)
    return SpecResult(tokens=np.asarray(state.tokens[:n_tokens], dtype=np.int64), rounds=rounds)


def _features(feats: np.ndarray | None, tap_idx: list[int], rows: np.ndarray) -> np.ndarray:
    """[len(rows), F*D] tapped features in the drafter's layer order (empty when nothing is tapped)."""
    if not tap_idx:
        return np.zeros((0, 0))
    return np.concatenate([feats[i][rows] for i in tap_idx], axis=-1)
