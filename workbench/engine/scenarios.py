"""The engine's side of the reference scenarios (``workbench.reference.scenarios``): a prefill and N
greedy decode steps with every step's logits, and ONE verify of a given tree after a prefill with every
node's logits and the latent rows it appended. The K2-size checks compare these with
``decode_reference`` / ``tree_verify_reference`` on the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import head_rows

from ..errors import InputError
from ..reference.scenarios import tree_from_parents
from .ar import engine_ar_generate
from .buffers import latents_f32
from .runtime import Engine


@dataclass
class EngineVerify:
    logits: np.ndarray          # [N + 1, V] every node's logits under the ancestor mask
    latents: np.ndarray         # [L, N + 1, C + R] the latent rows the verify appended, per layer


def engine_decode(engine: Engine, prompt: Any, n_decode: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [n + 1], logits [n + 1, V]): the prefill's greedy token and n greedy decode steps, as
    ``decode_reference`` lays them out."""
    res = engine_ar_generate(engine, prompt, int(n_decode) + 1, return_logits=True)
    return res.tokens, res.logits


def engine_tree_verify(engine: Engine, prompt: Any, parents: Any, tokens: Any,
                       root: int | None = None) -> EngineVerify:
    """Prefill ``prompt`` (P tokens), then the engine's verify step over [root, nodes] at positions
    P + depth under the ancestor-or-self mask (root: the prefill's greedy token by default)."""
    cfg = engine.cfg
    tree = tree_from_parents(parents, tokens)
    n = tree.n_nodes
    toks = np.asarray(prompt, np.int64)
    p = toks.size
    if n + 1 > engine.buf.max_rows or p + n + 1 > engine.buf.max_len:
        raise InputError(f"a {n}-node tree after {p} prompt tokens exceeds the engine's sizes")
    if n and (tree.tokens.min() < 0 or tree.tokens.max() >= cfg.vocab_size):
        raise InputError(f"tree tokens must lie in [0, {cfg.vocab_size})")
    with ops.sim_speed():
        step = engine.verify_step(n)                         # captured before the prefill overwrites state
        engine.prefill(toks)
        if root is None:
            root = int(engine.fetch(engine.buf.amax)[p - 1])
        ctl = np.zeros(engine.buf.ctl.shape, np.int32)       # kernels_numba.tree's control block
        ctl[0, :n + 1] = np.concatenate([[root], tree.tokens])
        ctl[1, :n + 1] = np.concatenate([[0], tree.depths])
        ctl[2, :n + 1] = tree.parents
        ctl[4, :4] = (p, 0, 0, n + 1)                       # start, no previous round to compact, rows
        engine.put(engine.buf.ctl, ctl)
        step.run(engine.stream)
        logits = engine.fetch(head_rows(engine.buf.logits, n + 1))
        cache = engine.fetch(engine.buf.cache)               # [L, S, C+R]
    return EngineVerify(logits=np.array(logits), latents=latents_f32(cache[:, p:p + n + 1]))
