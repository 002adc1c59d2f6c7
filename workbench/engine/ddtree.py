"""DDTree speculative decoding on the engine (mirrors ``workbench.ddtree.speculative.ddtree_generate``).

Per round: draft logits -> per-position top-k on the device -> best-first heap on the host over the
copied [L, K] table (kernels_numba.tree.build_tree_host, a few microseconds) -> one upload of the
control block (tree + previous accepted path) -> the captured verify step (KV compaction of the
previous round, tree compile, forward over root + nodes with the ancestor-only mask) -> copy back the
target's token per node -> walk. Greedy (T = 0): the argmax per node, computed on the device.
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

import time
from types import SimpleNamespace
from typing import Any

import numpy as np

from kernels_numba.tree import build_tree_host, topk_logprobs, walk_host

from ..ddtree.config import GREEDY, SamplingParams
from ..ddtree.dflash import DFlashDrafter
from ..ddtree.drafter import make_drafter
from ..ddtree.inputs import check_budget, check_run
from ..ddtree.oracle import OracleDrafter, oracle_logits
from ..ddtree.sampling import make_rng, sample_tokens
from ..ddtree.speculative import RoundStats, SpecResult
from ..errors import InputError
from .devarray import head_rows, host_buffer, sim_speed, to_device, zeros
from .dflash import DeviceDFlash, device_dflash_supported
from .runtime import Engine


def engine_ddtree_generate(engine: Engine, weights: dict[str, Any], prompt: Any, n_tokens: int,
                           drafter: Any = "dflash", budget: int = 16, sampling: SamplingParams = GREEDY, *,
                           drafter_config: Any = None, oracle_p: float = 1.0, oracle_seed: int = 0,
                           continuation: Any = None, timing: dict | None = None,
                           device_drafter: bool = True) -> SpecResult:
    """Generate ``n_tokens`` with DDTree on ``engine`` (greedy at T = 0, lossless sampling at T > 0);
    same arguments and result as the reference ``ddtree_generate`` (``weights`` feed the drafter).
    timing: if a dict, receives ``decode_s`` (wall time of all rounds after the prefill) and its
    parts ``draft_s`` (drafter, top-k, copy back), ``build_s`` (host heap builds), ``verify_s``
    (control upload, verify graph, copy back); the rest is the walk and bookkeeping.
    device_drafter: run a dflash drafter with dense projections on the device (default) rather than
    on the host."""
    cfg = engine.cfg
    toks, n_tokens = check_run(cfg, prompt, n_tokens, sampling)
    budget = check_budget(budget)
    draft = make_drafter(drafter, cfg, weights, toks, n_tokens, np.float32,
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
    dev = None
    on_device = isinstance(draft, DFlashDrafter) and device_dflash_supported(draft.weights, draft.dcfg)
    if device_drafter and on_device:
        dev = DeviceDFlash(engine, draft.weights, draft.dcfg)
        tap_idx = []                                          # nothing tapped is copied to the host
    feats_h = host_buffer(engine.buf.feats.shape, np.float32) if tap_idx else None
    if dev is not None:
        table = dev.logits                                    # [L, V]
    elif isinstance(draft, OracleDrafter):                     # logits of every position, row = position
        table = to_device(oracle_logits(draft.sequence, cfg.vocab_size, -1, engine.buf.max_len + n_pos + 1,
                                         draft.p, draft.seed))
    else:
        table = zeros((n_pos, cfg.vocab_size), np.float32)
    ctl[...] = 0
    acc = np.zeros(n_pos + 2, np.int32)
    with sim_speed():
        step = engine.verify_step(budget)
        engine.prefill(toks)
        rng = make_rng(sampling)
        if sampling.greedy:
            first = int(engine.fetch(engine.buf.amax)[p - 1])
        else:
            first = int(sample_tokens(engine.fetch(engine.buf.logits)[p - 1:p], sampling, rng)[0])
        feats = engine.fetch(engine.buf.feats) if tap_idx else None
        state = SimpleNamespace(start=p, bonus=first, tokens=[first],
                                new_features=_features(feats, tap_idx, np.arange(p)))
        rounds: list[RoundStats] = []
        new_rows = np.arange(p, dtype=np.int32)              # tap-buffer rows the drafter has not seen
        prev_acc = np.zeros(0, np.int32)
        prev_start = 0
        clock = {"draft_s": 0.0, "build_s": 0.0, "verify_s": 0.0}    # host wall time per phase
        t0 = time.perf_counter()
        while len(state.tokens) < n_tokens:
            ta = time.perf_counter()
            if dev is not None:
                dev.propose(state.bonus, state.start, new_rows, new_rows.size)
                row0 = 0
            elif isinstance(draft, OracleDrafter):
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
            if sampling.greedy:
                post = engine.fetch_into(engine.buf.amax, post_h)[:n + 1]
            else:                                            # [N+1] draws in node order
                post = sample_tokens(engine.fetch(head_rows(engine.buf.logits, n + 1)), sampling, rng)
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
            new_rows = path.astype(np.int32)
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
