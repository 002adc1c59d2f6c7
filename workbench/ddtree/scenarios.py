"""The reference side of the engine's checks at scale: a prompt prefill + N greedy decode steps, and one
DDTree verify of a given tree, both through ``model.forward`` (no second forward); and the same for one
layer alone (``layer_reference``): a P-row prefix, a decode step and a verify of a random tree after it,
on inputs every implementation of the layer takes from ``layer_inputs``.

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
from ..reference.layers import rmsnorm, sigmoid, weight
from ..reference.mla import mla_absorbed
from ..reference.model import LatentCache, forward
from ..reference.moe import dense_mlp, moe
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


# ---- one layer --------------------------------------------------------------------------------------
def ancestor_inputs(parents: Any, start: int) -> tuple[np.ndarray, np.ndarray]:
    """(ancestor-or-self mask bool [N, N], positions start + depth [N]) of a tree given by parents [N]."""
    tree = tree_from_parents(parents, np.arange(1, len(parents)))
    vis = np.eye(len(parents), dtype=bool)
    for i in range(1, len(parents)):
        vis[i] |= vis[tree.parents[i]]
    return vis, start + np.concatenate([[0], tree.depths]).astype(np.int64)


def layer_inputs(cfg: ModelConfig, seed: int, layer: int, prefix: int, tree_nodes: int):
    """x of the prefix [P, D] and the two steps after it (name, x [T, D], vis [T, T] bool, positions [T]):
    a decode step and a verify of a random ``tree_nodes``-node tree + root."""
    rng = np.random.default_rng(seed + 1000 * layer)
    x_all = rng.standard_normal((prefix + 2 + tree_nodes, cfg.hidden_size)).astype(np.float32)
    parents, _ = random_tree(cfg, tree_nodes, seed=seed + 7)
    vis_t, pos_t = ancestor_inputs(parents, prefix)
    return x_all[:prefix], [
        ("decode", x_all[prefix:prefix + 1], np.ones((1, 1), bool), np.array([prefix])),
        (f"verify {tree_nodes}-node tree + root", x_all[prefix + 1:], vis_t, pos_t),
    ]


def layer_step(cfg: ModelConfig, weights: Any, layer: int, x: np.ndarray, pos: np.ndarray, cache: LatentCache,
               vis: np.ndarray | None):
    """The reference block in pieces: (output [S, D], FFN input [S, D], routes [S, K] or None); the S
    latent rows go into ``cache`` at ``pos``."""
    p = f"layers.{layer}."
    h = x + mla_absorbed(cfg, weights, layer, rmsnorm(x, weight(weights, p + "attn_norm"), cfg.rms_norm_eps),
                         pos, cache, vis)
    xn = rmsnorm(h, weight(weights, p + "ffn_norm"), cfg.rms_norm_eps)
    if not cfg.is_moe_layer(layer):
        return h + dense_mlp(cfg, weights, layer, xn), xn, None
    routes: dict[int, np.ndarray] = {}
    y = h + moe(cfg, weights, layer, xn, routes)
    return y, xn, routes[layer]


def layer_reference(cfg: ModelConfig, seed: int, layer: int, experts: str = "int4", dense: str = "fp32",
                    prefix: int = 16, tree_nodes: int = 16, weights: Any = None) -> dict[str, Any]:
    """The reference layer on ``layer_inputs``: the seeded model's (W4A16 experts; ``dense`` "bf16":
    W16A16 dense projections; ``experts`` "bf16": the bf16 layout's experts, W16A16 with bf16 outputs;
    "fp32": the INT4 values dequantized), or ``weights``, a weights mapping of the layer's own.
    Returns the prefix's latent rows and per step the output y, latent rows, routes [T, K] and selection
    scores [T, E] (MoE layer): a picklable dict, so it can run in another process."""
    from ..seeded import SeededWeights

    ref = weights if weights is not None else (                 # given weights, or the seeded model
        SeededWeights(cfg, seed, {"int4": "experts", "bf16": "bf16"}.get(str(experts), "fp32")))
    marked = hasattr(ref.get(f"layers.{layer}.attn.wo"), "round_input")   # W16A16 marks already on
    if (dense == "bf16" or experts == "bf16") and not marked:
        from ..quant.w16a16 import w16a16
        ref = w16a16(cfg, ref, dense=dense == "bf16", experts=experts == "bf16")
    x_pre, cases = layer_inputs(cfg, seed, layer, prefix, tree_nodes)
    cache = LatentCache.empty(cfg, prefix + tree_nodes + 1)
    causal = np.tril(np.ones((prefix, prefix), bool))
    layer_step(cfg, ref, layer, x_pre, np.arange(prefix), cache, causal)
    cache.length = prefix
    out: dict[str, Any] = {"prefix_rows": cache.layers[layer][:prefix].copy(), "steps": []}
    for _, x, vis, pos in cases:
        y, xn, routes = layer_step(cfg, ref, layer, x, pos, cache, vis)
        step = {"y": y, "rows": cache.layers[layer][prefix:prefix + x.shape[0]].copy(), "routes": routes}
        if routes is not None:
            step["scores"] = selection_scores(ref, layer, xn)
        out["steps"].append(step)
    return out


def moe_reference(cfg: ModelConfig, seed: int, layer: int, x: np.ndarray) -> dict[str, Any]:
    """The seeded model's MoE block of ``layer`` (W4A16 experts, the rest as stored) on rows x [T, D]:
    its output y [T, D], routes [T, K] and selection scores [T, E] (the block check's reference side)."""
    from ..seeded import SeededWeights
    w = SeededWeights(cfg, seed, "experts")
    x = np.asarray(x, np.float32)
    routes: dict[int, np.ndarray] = {}
    y = moe(cfg, w, layer, x, routes)
    return {"y": y, "routes": routes[layer], "scores": selection_scores(w, layer, x)}


def selection_scores(weights: Any, layer: int, xn: np.ndarray) -> np.ndarray:
    """The router's selection scores [T, E] of FFN inputs xn [T, D]: sigmoid(gate xn) + bias."""
    p = f"layers.{layer}.ffn."
    return sigmoid(xn @ np.asarray(weight(weights, p + "gate"), np.float32).T) + np.asarray(
        weight(weights, p + "gate_bias"))
