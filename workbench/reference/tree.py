"""A draft tree as data, and its compilation into one verify forward's inputs (the reference verify and
the engine read the same arrays; ``workbench.ddtree.tree`` builds trees).

Legend: N nodes in the tree, node 0 is the root; parents[i] < i.
"""

from __future__ import annotations

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
