"""Autoregressive generation on the engine (mirrors ``workbench.reference.generate.greedy_generate`` at
T = 0 and ``workbench.ddtree.ar.ar_generate`` at T > 0).

One eager prefill of the prompt, then the captured decode step replayed once per token. Greedy: the
argmax is fed back on the device (tokens_numba.advance_kernel), so the loop issues no host copies
until the end, unless per-step logits are requested (tests compare them with the reference).
Sampled (T > 0): after each step the host copies the one logits row back, draws the token with the
reference's own ``sample_tokens`` and the run's one Generator (same seed, same one-uniform-per-token
order, so the same tokens as ``ar_generate`` unless a uniform lands within the ~1e-5 logit
difference of a CDF boundary), and writes it over the argmax the device fed back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import head_rows, host_buffer

from ..ddtree.config import GREEDY, SamplingParams
from ..ddtree.inputs import check_run
from ..ddtree.sampling import make_rng, sample_tokens
from ..errors import InputError
from .runtime import Engine


@dataclass
class EngineARResult:
    tokens: np.ndarray                 # [n] int64
    logits: np.ndarray | None          # [n, V] float32 when requested


def engine_for(cfg, weights: dict[str, Any], prompt_len: int, n_tokens: int, budget: int = 0,
               taps: tuple[int, ...] = (), use_graphs: bool | None = None) -> Engine:
    """An engine sized for one request (prompt + n_tokens, and DDTree verify rows up to ``budget``)."""
    extra = budget + 2 if budget else 1
    return Engine(cfg, weights, max_len=prompt_len + n_tokens + extra + 1,
                  max_rows=max(prompt_len, budget + 1), taps=taps, use_graphs=use_graphs)


def engine_ar_generate(engine: Engine, prompt: Any, n_tokens: int, return_logits: bool = False,
                       timing: dict | None = None, sampling: SamplingParams = GREEDY, *,
                       progress: Callable[[int, int, str], None] | None = None) -> EngineARResult:
    """Generate ``n_tokens`` after prefilling ``prompt``: greedily (argmax, ties to the lowest id) at
    ``sampling.temperature`` 0, else one draw per token from softmax(logits / T) on the host with the
    Generator seeded by ``sampling.seed`` (the reference ``ar_generate``'s stream and order).

    timing: if a dict, receives ``decode_s``, the synchronised wall time of the n_tokens - 1 decode
    steps after the prefill (the benchmark's tokens/s). progress: called as
    ``progress(tokens done, n_tokens, "token")`` after each token.
    """
    cfg = engine.cfg
    toks, n_tokens = check_run(cfg, prompt, n_tokens, sampling)
    p = len(toks)
    if p + n_tokens > engine.buf.max_len:
        raise InputError(f"prompt + tokens = {p + n_tokens} exceeds the engine's cache of "
                         f"{engine.buf.max_len} rows")
    with ops.sim_speed():
        step = engine.decode_step()                          # captured before the prefill overwrites state
        engine.prefill(toks)
        logits = [] if return_logits else None
        if return_logits:
            logits.append(engine.fetch(engine.buf.logits)[p - 1].copy())
        sampled = not sampling.greedy
        if sampled:
            rng = make_rng(sampling)
            row_h = host_buffer((1, cfg.vocab_size), np.float32)
            row_d = head_rows(engine.buf.logits, 1)                  # [1, V] view of row 0
            last = engine.fetch(engine.buf.logits)[p - 1:p]         # [1, V]
            first = int(sample_tokens(last, sampling, rng)[0])
            drawn = [first]
        else:
            first = int(engine.fetch(engine.buf.amax)[p - 1])
        out = np.zeros(engine.buf.max_len, np.int32)
        out[0] = first
        engine.put(engine.buf.out, out)
        ids = np.zeros(engine.buf.max_rows, np.int32)
        ids[0] = first
        engine.put(engine.buf.ids, ids)
        engine.put(engine.buf.depth, np.zeros(engine.buf.max_rows, np.int32))
        engine.set_meta(p, 1, 1)
        engine.sync()
        t0 = time.perf_counter()
        for i in range(n_tokens - 1):
            step.run(engine.stream)
            if progress is not None:                             # a host call only: no sync
                progress(i + 2, n_tokens, "token")
            if return_logits:
                logits.append(engine.fetch(engine.buf.logits)[0].copy())
            if sampled:                                          # replace the fed-back argmax
                tok = int(sample_tokens(engine.fetch_into(row_d, row_h), sampling, rng)[0])
                drawn.append(tok)
                ids[0] = tok
                engine.put(engine.buf.ids, ids)
        if sampled:
            engine.sync()
            tokens = np.asarray(drawn, np.int64)
        else:
            tokens = engine.fetch(engine.buf.out)[:n_tokens].astype(np.int64)
        if timing is not None:
            timing["decode_s"] = time.perf_counter() - t0
    return EngineARResult(tokens=tokens, logits=np.stack(logits) if return_logits else None)
