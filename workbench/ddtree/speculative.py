"""The DDTree speculative loop over the numpy reference (docs/ddtree.md, "One round").

Legend: P prompt length, V vocabulary, N tree nodes (root not counted), F*D drafter features per
token (F tapped target layers of width D), L drafted positions.

Each round reads as one sentence: the drafter proposes per-position logits from the bonus token,
the heap builds a tree (a cost-aware budget keeps a prefix of its pop order, docs/ddtree.md), ONE
target forward verifies root + nodes with positions start + depth and the ancestor-only mask on top
of the latent cache, the target's token at every node (argmax at T = 0, an independent sample at
T > 0) drives the walk, and the commit compacts the accepted rows of the latent cache and hands the
accepted nodes' tapped hidden states to the drafter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import ModelConfig
from ..reference.model import LatentCache, forward
from .budget import TreeBudget, tree_budget
from .config import GREEDY, SamplingParams
from .drafter import Drafter, make_drafter
from .inputs import check_budget, check_run
from .sampling import make_rng, sample_tokens
from .tree import Tree, build_tree, compile_tree
from .walk import walk


@dataclass(frozen=True)
class RoundStats:
    """One round. accepted_len counts the walk's tokens before the last round is cut to n_tokens."""
    tree_size: int          # N, nodes besides the root
    accepted_len: int       # tokens committed: accepted nodes incl. the root (= accepted drafts + bonus)
    depth: int              # the deepest node's depth (0 for a root-only tree)


@dataclass(frozen=True)
class RoundTrace:
    """One round as the loop ran it (what ``ddtree_generate``'s ``on_round`` receives)."""
    tree: Tree                # the verified tree (for a cost-aware budget, the chosen prefix)
    root: int                 # the bonus token the tree grew from
    accepted: list[int]       # accepted node indices, root (0) first
    bonus: int                # the target's token after the accepted path
    posterior: np.ndarray     # [N+1] the target's token at every node


@dataclass
class SpecResult:
    tokens: np.ndarray                      # [n] int64 generated ids
    rounds: list[RoundStats]

    @property
    def mean_accepted(self) -> float:       # tau: mean tokens per round including the bonus
        return float(np.mean([r.accepted_len for r in self.rounds])) if self.rounds else float("nan")


@dataclass
class SpecState:
    """Everything a round reads and writes.

    cache: the target's latent cache, holding exactly the committed tokens (length == start).
    start: absolute position of the bonus token (not yet in the cache).
    bonus: the last generated token, root of the next tree.
    new_features: [n, F*D] tapped target features of the tokens at positions start-n .. start-1 that
      the drafter has not seen yet (the prompt after prefill, then each round's accepted nodes).
    tokens: generated ids so far (the bonus included).
    """
    cache: LatentCache
    start: int
    bonus: int
    new_features: np.ndarray
    tokens: list[int] = field(default_factory=list)
    rounds: list[RoundStats] = field(default_factory=list)


def features(hidden: dict[int, np.ndarray], layer_ids: tuple[int, ...], rows: Any = slice(None)) -> Any:
    """Tapped features [S, F*D]: captured layer outputs at ``rows``, concatenated in ``layer_ids`` order."""
    if not layer_ids:
        return np.zeros((0, 0))
    return np.concatenate([hidden[k][rows] for k in layer_ids], axis=-1)        # [S, F*D]


def prefill(cfg: ModelConfig, weights: dict[str, Any], prompt: np.ndarray, max_len: int, drafter: Drafter,
            sampling: SamplingParams, rng: np.random.Generator, dtype: Any) -> SpecState:
    """Prefill the prompt, capturing the drafter's layers; the prompt's next token is the first bonus."""
    cache = LatentCache.empty(cfg, max_len, dtype)
    out = forward(cfg, weights, prompt, cache, capture=drafter.capture, dtype=dtype)
    first = int(sample_tokens(out.logits[-1:], sampling, rng)[0])
    return SpecState(cache=cache, start=len(prompt), bonus=first,
                     new_features=features(out.hidden, drafter.capture), tokens=[first])


def verify(cfg: ModelConfig, weights: dict[str, Any], state: SpecState, tree: Tree, capture: tuple[int, ...],
           dtype: Any) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """ONE target forward over [root + nodes]: logits [N+1, V] and tapped hidden states; cache += N+1 rows."""
    input_ids, positions, visibility = compile_tree(tree, state.bonus, state.start)
    out = forward(cfg, weights, input_ids, state.cache, positions=positions, visibility=visibility,
                  capture=capture, dtype=dtype)
    return out.logits, out.hidden


def commit(state: SpecState, tree: Tree, accepted: list[int], bonus: int, hidden: dict[int, np.ndarray],
           capture: tuple[int, ...]) -> None:
    """Keep the accepted rows of the latent cache, queue their features for the drafter, move to the bonus."""
    state.cache.gather_commit(state.start, accepted)
    state.new_features = features(hidden, capture, np.asarray(accepted))       # [len(acc), F*D]
    state.tokens.extend(int(tree.tokens[i - 1]) for i in accepted[1:])
    state.tokens.append(bonus)
    state.start += len(accepted)
    state.bonus = bonus
    state.rounds.append(RoundStats(tree_size=tree.n_nodes, accepted_len=len(accepted), depth=tree.depth))


def ddtree_generate(cfg: ModelConfig, weights: dict[str, Any], prompt: Any, n_tokens: int,
                    drafter: str | Drafter = "dflash", budget: int | TreeBudget = 16,
                    sampling: SamplingParams = GREEDY, dtype: Any = np.float32, *,
                    drafter_config: Any = None, oracle_p: float = 1.0, oracle_seed: int = 0,
                    continuation: Any = None,
                    on_round: Callable[[RoundTrace], None] | None = None) -> SpecResult:
    """Generate n_tokens with DDTree speculative decoding on the numpy reference.

    drafter: "dflash" (needs ``drafter.*`` weights; ``drafter_config`` a DrafterConfig, default
      ``default_drafter_config(cfg)``), "oracle" (true continuation = ``continuation`` [n_tokens + L]
      generated ids, or computed greedily up front; ``oracle_p``, ``oracle_seed``), or a ready Drafter.
    budget: B >= 1 tree nodes per round besides the root, or a TreeBudget (``workbench.ddtree.budget``:
      cost-aware, each round verifies the best prefix of the pop order). sampling: T = 0 greedy
      (token-for-token equal to greedy AR), T > 0 lossless sampling with one seeded Generator.
      dtype: float32 or float64. on_round: called with each round's RoundTrace before its commit.
    """
    toks, n_tokens = check_run(cfg, prompt, n_tokens, sampling)
    budget = tree_budget(budget)
    check_budget(budget.max_nodes, cfg)
    draft = make_drafter(drafter, cfg, weights, toks, n_tokens, dtype, drafter_config=drafter_config,
                         oracle_p=oracle_p, oracle_seed=oracle_seed, continuation=continuation)
    rng = make_rng(sampling)
    max_len = len(toks) + n_tokens + budget.max_nodes + 1
    state = prefill(cfg, weights, toks, max_len, draft, sampling, rng, dtype)
    while len(state.tokens) < n_tokens:
        draft_logits = draft.propose(state)                                     # [L, V]
        tree = budget.cut(build_tree(draft_logits, budget.max_nodes))           # a prefix of the pop order
        logits, hidden = verify(cfg, weights, state, tree, draft.capture, dtype)  # [N+1, V]
        posterior = sample_tokens(logits, sampling, rng)                        # [N+1]
        accepted, bonus = walk(tree, posterior)
        if on_round is not None:
            on_round(RoundTrace(tree, state.bonus, accepted, bonus, posterior))
        commit(state, tree, accepted, bonus, hidden, draft.capture)
    return SpecResult(tokens=np.asarray(state.tokens[:n_tokens], dtype=np.int64), rounds=state.rounds)
