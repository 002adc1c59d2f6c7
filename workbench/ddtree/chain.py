"""The plain DFlash chain on the numpy reference: each round verifies the drafter's L argmax tokens as
one path (docs/ddtree.md, "The DFlash chain"), the baseline a draft tree is measured against.

Legend: L drafted positions (block_size - 1), V vocabulary.

It is DDTree's loop with the tree replaced by a chain: the same prefill, verify, walk and commit, so the
chain is exactly as lossless (greedy equals greedy AR; at T > 0 the target's independent draw at every
node decides, as in DFlash's own sampler with greedy drafts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..config import ModelConfig
from .config import GREEDY, SamplingParams
from .drafter import Drafter, make_drafter
from .inputs import check_run
from .sampling import make_rng, sample_tokens
from .speculative import SpecResult, commit, prefill, verify
from .tree import Tree, top_k_log_probs
from .walk import walk


def chain_tree(draft_logits: np.ndarray) -> Tree:
    """The plain DFlash chain as a tree: the argmax token at every drafted position, one path of depth L."""
    lp, ids = top_k_log_probs(draft_logits, 1)                                  # [L, 1]
    n = ids.shape[0]
    return Tree(tokens=ids[:, 0].copy(), depths=np.arange(1, n + 1, dtype=np.int64),
                parents=np.arange(-1, n, dtype=np.int64), scores=np.cumsum(lp[:, 0]),
                child_maps=tuple({int(ids[i, 0]): i + 1} for i in range(n)) + ({},))


def chain_generate(cfg: ModelConfig, weights: dict[str, Any], prompt: Any, n_tokens: int,
                   drafter: str | Drafter = "dflash", sampling: SamplingParams = GREEDY,
                   dtype: Any = np.float32, *, drafter_config: Any = None, oracle_p: float = 1.0,
                   oracle_seed: int = 0, continuation: Any = None,
                   progress: Callable[[int, int, str], None] | None = None) -> SpecResult:
    """Generate n_tokens with the DFlash chain (``ddtree_generate``'s arguments without a budget: every
    round verifies L + 1 tokens); rounds record tree_size L and depth L. progress: called as
    ``progress(tokens done, n_tokens, "round r")`` after each round."""
    toks, n_tokens = check_run(cfg, prompt, n_tokens, sampling)
    draft = make_drafter(drafter, cfg, weights, toks, n_tokens, dtype, drafter_config=drafter_config,
                         oracle_p=oracle_p, oracle_seed=oracle_seed, continuation=continuation)
    rng = make_rng(sampling)
    state = prefill(cfg, weights, toks, len(toks) + n_tokens + draft.block_size, draft, sampling, rng, dtype)
    while len(state.tokens) < n_tokens:
        tree = chain_tree(draft.propose(state))                                 # L nodes, one path
        logits, hidden = verify(cfg, weights, state, tree, draft.capture, dtype)  # [L+1, V]
        accepted, bonus = walk(tree, sample_tokens(logits, sampling, rng))
        commit(state, tree, accepted, bonus, hidden, draft.capture)
        if progress is not None:
            progress(min(len(state.tokens), n_tokens), n_tokens, f"round {len(state.rounds)}")
    return SpecResult(tokens=np.asarray(state.tokens[:n_tokens], dtype=np.int64), rounds=state.rounds)
