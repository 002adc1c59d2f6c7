"""The DDTree walk: follow the target's own token choices down the draft tree (docs/ddtree.md).

Legend: N nodes besides the root (index 0).
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError
from .tree import Tree


def walk(tree: Tree, posterior_tokens: np.ndarray) -> tuple[list[int], int]:
    """Accepted node indices (starting with the root 0) and the bonus token.

    posterior_tokens: [N+1] ints, the target's token at every node (argmax at T = 0, an independent
    sample from softmax(logits / T) at T > 0): node i's token is what the target emits right after
    the path root..i. From the root, step to the child whose token equals the current node's
    posterior token; stop at the first node without such a child. The bonus is that node's
    posterior token, so every committed token is the target's own choice given its prefix.
    """
    post = np.asarray(posterior_tokens)
    if post.shape != (tree.n_nodes + 1,):
        raise InputError(f"posterior tokens must have shape ({tree.n_nodes + 1},), got {post.shape}")
    accepted = [0]
    cur = 0
    nxt = int(post[0])
    while nxt in tree.child_maps[cur]:
        cur = tree.child_maps[cur][nxt]
        accepted.append(cur)
        nxt = int(post[cur])
    return accepted, nxt
