"""The reference side of the engine's checks at scale: a prompt prefill + N greedy decode steps, and one
DDTree verify of a given tree, both through ``model.forward`` (no second forward).

Legend: P prompt length, N tree nodes besides the root, V vocab, L layers, C+R latent row width,
K experts per token.

With ``workbench.seeded.SeededWeights`` the weights are generated on access, so a K2-size model
costs only what the forward touches: the routed experts of the tokens run, never all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..errors import InputError
from ..reference.generate import check_prompt, greedy_generate, top2_margin
from ..reference.model import LatentCache, forward
from .tree import Tree, compile_tree


@dataclass
class DecodeReference:
    prompt: np.ndarray        # [P]
    tokens: np.ndarray        # [n + 1]: the prefill's greedy token, then one per decode step
    logits: np.ndarray        # [n + 1, V] the logits each token was chosen from
    margins: np.ndarray       # [n + 1] top-1 minus top-2 logit
    cache: LatentCache        # P + n rows: the prompt and every fed-back token


def decode_reference(cfg: ModelConfig, weights: Any, prompt: Any, n_decode: int,
                     dtype: Any = np.float32) -> DecodeReference:
    """Prefill ``prompt`` in one forward, then ``n_decode`` single-token greedy steps."""
    toks = check_prompt(cfg, prompt)
    if isinstance(n_decode, bool) or not isinstance(n_decode, (int, np.integer)) or n_decode < 0:
        raise InputError(f"n_decode must be a non-negative int, got {n_decode!r}")
    g = greedy_generate(cfg, weights, toks, int(n_decode) + 1, dtype=dtype)
    return DecodeReference(toks, g.tokens, g.logits, g.margins, g.cache)


@dataclass
class VerifyReference:
    prompt: np.ndarray          # [P] prefilled before the verify
    prefill_logits: np.ndarray  # [V] at the last prompt position (its argmax is the default root)
    input_ids: np.ndarray       # [N + 1] root, then node tokens
    positions: np.ndarray       # [N + 1] P + depth
    parents: np.ndarray         # [N + 1], parents[0] = -1
    visibility: np.ndarray      # [N + 1, N + 1] bool ancestor-or-self mask
    logits: np.ndarray          # [N + 1, V] every node's logits under that mask
    latents: np.ndarray         # [L, N + 1, C + R] the latent cache rows the verify appended
    routes: dict[int, np.ndarray]  # MoE layer -> routed experts [N + 1, K]
    margins: np.ndarray         # [N + 1] top-1 minus top-2 of each node's logits


def tree_from_parents(parents: Any, tokens: Any) -> Tree:
    """A ``ddtree.tree.Tree`` from parents [N + 1] (parents[0] = -1, parents[i] < i) and node tokens [N].

    Siblings must carry different tokens (the walk looks children up by token).
    """
    par = np.asarray(parents)
    tok = np.asarray(tokens)
    if par.ndim != 1 or par.size < 1 or (par.size > 1 and par.dtype.kind not in "iu"):
        raise InputError("parents must be a non-empty 1-D list of ints")
    par = par.astype(np.int64)
    if tok.shape != (par.size - 1,) or (tok.size and tok.dtype.kind not in "iu"):
        raise InputError(f"tokens must be {par.size - 1} ints (one per node besides the root)")
    if par[0] != -1 or np.any(par[1:] < 0) or np.any(par[1:] >= np.arange(1, par.size)):
        raise InputError("parents must start with -1 and satisfy 0 <= parents[i] < i")
    depths = np.zeros(par.size, dtype=np.int64)
    child_maps: list[dict[int, int]] = [{} for _ in range(par.size)]
    for i in range(1, par.size):
        depths[i] = depths[par[i]] + 1
        t = int(tok[i - 1])
        if t in child_maps[par[i]]:
            raise InputError(f"nodes {child_maps[par[i]][t]} and {i} are siblings with the same token {t}")
        child_maps[par[i]][t] = i
    return Tree(tokens=tok.astype(np.int64), depths=depths[1:], parents=par,
                scores=np.zeros(par.size - 1), child_maps=tuple(child_maps))


def tree_verify_reference(cfg: ModelConfig, weights: Any, prompt: Any, parents: Any, tokens: Any,
                          root: int | None = None, dtype: Any = np.float32) -> VerifyReference:
    """Prefill ``prompt`` (P tokens), then ONE forward over [root, nodes] at positions P + depth under
    the ancestor-or-self mask, as ``ddtree.speculative.verify`` runs it. ``root`` defaults to the
    prefill's greedy token (the bonus a decode would verify from)."""
    toks = check_prompt(cfg, prompt)
    tree = tree_from_parents(parents, tokens)
    if tree.n_nodes and (tree.tokens.min() < 0 or tree.tokens.max() >= cfg.vocab_size):
        raise InputError(f"tree tokens must lie in [0, {cfg.vocab_size})")
    p = toks.size
    cache = LatentCache.empty(cfg, p + tree.n_nodes + 1, dtype)
    pre = forward(cfg, weights, toks, cache, dtype=dtype).logits[-1]                       # [V]
    if root is None:
        root = int(np.argmax(pre))
    elif isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < cfg.vocab_size:
        raise InputError(f"root must be a token id in [0, {cfg.vocab_size}), got {root!r}")
    input_ids, positions, visibility = compile_tree(tree, int(root), p)
    out = forward(cfg, weights, input_ids, cache, positions=positions, visibility=visibility, dtype=dtype)
    latents = np.stack([buf[p:p + input_ids.size] for buf in cache.layers])                # [L, N+1, C+R]
    margins = np.array([top2_margin(row) for row in out.logits])
    return VerifyReference(toks, pre, input_ids, positions, tree.parents, visibility, out.logits, latents,
                           out.routes, margins)


# ---- deterministic inputs (integer streams only, so every machine builds the same ones) ----------
def _words(seed: int, what: str, n: int) -> np.ndarray:
    from ..seeded import stream_words
    return stream_words(seed, what, 0, 4 * n).view("<u8").astype(np.uint64)


def random_prompt(cfg: ModelConfig, n: int, seed: int = 0) -> np.ndarray:
    """``n`` token ids in [0, V) from the seeded stream ``prompt``."""
    return (_words(seed, "prompt", n) % np.uint64(cfg.vocab_size)).astype(np.int64)


def random_tree(cfg: ModelConfig, n_nodes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(parents [N + 1], tokens [N]) of a random tree shaped like a DDTree's: node i hangs under
    node i - 1 half the time (chains), else under a uniform earlier node; sibling tokens differ."""
    w = _words(seed, "tree", 2 * n_nodes + 1)
    parents = [-1]
    child_tokens: list[set[int]] = [set()]
    tokens = []
    for i in range(1, n_nodes + 1):
        a, b = int(w[2 * i - 1]), int(w[2 * i])
        par = i - 1 if a & 1 else (a >> 1) % i
        t = b % cfg.vocab_size
        while t in child_tokens[par]:
            t = (t + 1) % cfg.vocab_size
        child_tokens[par].add(t)
        child_tokens.append(set())
        parents.append(par)
        tokens.append(t)
    return np.asarray(parents, dtype=np.int64), np.asarray(tokens, dtype=np.int64)


# ---- magnitudes ------------------------------------------------------------------------------
@dataclass
class ActivationStats:
    layer_rms: np.ndarray          # [L] RMS of the hidden state after each layer
    logit_std: float               # std of the last position's logits
    logit_range: float             # max - min of the last position's logits
    last_margin: float             # top-1 minus top-2 at the last position
    distinct_experts: dict[int, int]   # MoE layer -> distinct experts over all tokens
    max_expert_share: dict[int, float]  # MoE layer -> largest fraction of tokens one expert got


def activation_stats(cfg: ModelConfig, weights: Any, tokens: Any, dtype: Any = np.float32) -> ActivationStats:
    """One forward over ``tokens``: per-layer hidden RMS, logit spread and routing variety."""
    toks = check_prompt(cfg, tokens)
    out = forward(cfg, weights, toks, LatentCache.empty(cfg, toks.size, dtype),
                  capture=range(cfg.num_hidden_layers), dtype=dtype)
    rms = np.array([float(np.sqrt(np.mean(out.hidden[k].astype(np.float64) ** 2)))
                    for k in range(cfg.num_hidden_layers)])
    last = out.logits[-1].astype(np.float64)
    share = {k: float(np.bincount(r.ravel()).max() / r.shape[0]) for k, r in out.routes.items()}
    return ActivationStats(rms, float(last.std()), float(last.max() - last.min()), top2_margin(last),
                           {k: int(np.unique(r).size) for k, r in out.routes.items()}, share)
