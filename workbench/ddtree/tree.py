"""The DDTree draft tree: best-first heap over per-position draft marginals, and its compilation into
one verify forward's inputs.

Legend: L drafted positions (block_size - 1), V vocabulary, B node budget (root not counted),
K = min(B, V) candidates per position, N nodes in the tree (N <= B), node 0 is the root.

A tree is a prefix-closed set of token sequences rooted at the bonus token; a node at depth d
(1..L) holds a candidate for the token d positions after the root. Its score is log q(u) = the sum
of the draft log-probabilities along its path (docs/ddtree.md); the heap pops nodes in
non-increasing score, so every parent gets its index before its children (parents[i] < i).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from ..errors import InputError


@dataclass(frozen=True)
class Tree:
    """A draft tree of N nodes plus the root (index 0; its token is the bonus, known to the caller).

    tokens:  [N] int64, token of node i+1
    depths:  [N] int64, depth of node i+1 in 1..L (root depth 0)
    parents: [N+1] int64, parents[0] = -1, parents[i] < i
    scores:  [N] float64, log q(path) of node i+1, non-increasing
    child_maps: N+1 dicts token -> child index (the walk's lookup)
    """
    tokens: np.ndarray
    depths: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    child_maps: tuple[dict[int, int], ...]

    @property
    def n_nodes(self) -> int:                 # N, root not counted
        return int(self.tokens.shape[0])

    @property
    def depth(self) -> int:                   # deepest node's depth (0 for a root-only tree)
        return int(self.depths.max()) if self.n_nodes else 0

    def prefix(self, n: int) -> Tree:
        """The first n nodes in pop order: a tree again, since parents[i] < i (the best tree of n nodes)."""
        if n == self.n_nodes:
            return self
        if not 0 <= n <= self.n_nodes:
            raise InputError(f"a prefix of a {self.n_nodes}-node tree has 0..{self.n_nodes} nodes, got {n}")
        maps = tuple({t: c for t, c in m.items() if c <= n} for m in self.child_maps[:n + 1])
        return Tree(tokens=self.tokens[:n], depths=self.depths[:n], parents=self.parents[:n + 1],
                    scores=self.scores[:n], child_maps=maps)


def top_k_log_probs(draft_logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k tokens per position and their log-softmax values, in float64.

    draft_logits: [L, V] any float dtype. Returns (log_probs [L, K] float64 non-increasing along K,
    ids [L, K] int64). Ties are broken towards the lower token id (a stable sort on -logit).
    """
    x = np.asarray(draft_logits, dtype=np.float64)                         # [L, V]
    m = x.max(axis=-1, keepdims=True)                                      # [L, 1]
    lse = m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))            # [L, 1]
    ids = np.argsort(-x, axis=-1, kind="stable")[:, :k]                    # [L, K]
    return np.take_along_axis(x, ids, axis=-1) - lse, ids.astype(np.int64)


def build_tree(draft_logits: np.ndarray, budget: int) -> Tree:
    """Best-first DDTree heap (the DDTree paper's Algorithm 1, docs/ddtree.md) over draft marginals [L, V].

    budget: B >= 0 nodes besides the root; B = 0 gives the root-only tree. K = min(B, V).
    The heap key is (-score, rank path): equal scores pop in lexicographic order of the per-depth
    ranks, so the result is a deterministic function of the logits.
    """
    logits = np.asarray(draft_logits)
    if logits.ndim != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise InputError(f"draft logits must be a non-empty [L, V] matrix, got shape {logits.shape}")
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise InputError(f"tree budget must be an int >= 0, got {budget!r}")
    n_pos, vocab = logits.shape
    k = min(int(budget), vocab)
    tokens: list[int] = []
    depths: list[int] = []
    scores: list[float] = []
    parents = [-1]
    child_maps: list[dict[int, int]] = [{}]
    if k == 0:
        return _freeze(tokens, depths, parents, scores, child_maps)
    lp, ids = top_k_log_probs(logits, k)                                   # [L, K], [L, K]
    # entry: (-score, ranks, parent index, depth d (1-based), rank r at depth d)
    heap = [(-lp[0, 0], (0,), 0, 1, 0)]
    while heap and len(tokens) < budget:
        neg, ranks, par, d, r = heapq.heappop(heap)
        tok = int(ids[d - 1, r])
        idx = len(tokens) + 1
        tokens.append(tok)
        depths.append(d)
        scores.append(-neg)
        parents.append(par)
        child_maps.append({})
        child_maps[par][tok] = idx
        if r + 1 < k:                          # next-best sibling: swap the last rank r -> r+1
            sib = neg + lp[d - 1, r] - lp[d - 1, r + 1]
            heapq.heappush(heap, (sib, ranks[:-1] + (r + 1,), par, d, r + 1))
        if d < n_pos:                          # best child one level deeper
            heapq.heappush(heap, (neg - lp[d, 0], ranks + (0,), idx, d + 1, 0))
    return _freeze(tokens, depths, parents, scores, child_maps)


def _freeze(tokens, depths, parents, scores, child_maps) -> Tree:
    return Tree(tokens=np.asarray(tokens, dtype=np.int64), depths=np.asarray(depths, dtype=np.int64),
                parents=np.asarray(parents, dtype=np.int64), scores=np.asarray(scores, dtype=np.float64),
                child_maps=tuple(child_maps))


def visibility_from_parents(parents: np.ndarray) -> np.ndarray:
    """Ancestor-or-self matrix [N+1, N+1] bool from parents [N+1] (parents[0] = -1, parents[i] < i).

    Row i = row parents[i] plus the diagonal (the parent-row-plus-self trick); row 0 = [T, F, ...].
    """
    par = np.asarray(parents, dtype=np.int64)
    n1 = par.shape[0]
    if n1 < 1 or par[0] != -1 or np.any(par[1:] < 0) or np.any(par[1:] >= np.arange(1, n1)):
        raise InputError("parents must start with -1 and satisfy 0 <= parents[i] < i")
    vis = np.zeros((n1, n1), dtype=bool)                                   # [N+1, N+1]
    for i in range(n1):
        if i:
            vis[i] = vis[par[i]]
        vis[i, i] = True
    return vis


def compile_tree(tree: Tree, root_token: int, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The verify forward's inputs for ``tree`` rooted at ``root_token`` placed at position ``start``.

    Returns input_ids [N+1] int64 = [root, tokens...], positions [N+1] int64 = start + depth
    (siblings share a position) and visibility [N+1, N+1] bool, ancestor-or-self.
    """
    input_ids = np.concatenate([[int(root_token)], tree.tokens]).astype(np.int64)     # [N+1]
    positions = int(start) + np.concatenate([[0], tree.depths]).astype(np.int64)      # [N+1]
    return input_ids, positions, visibility_from_parents(tree.parents)
