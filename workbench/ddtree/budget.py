"""How many draft nodes a round verifies: a fixed budget, or the cost-aware prefix of the heap's pop order.

Legend: B max nodes per tree (root not counted), N nodes a round verifies (1 <= N <= B), p_i = q(u_i)
the draft probability of the path of the i-th popped node (non-increasing in i).

The heap pops nodes in non-increasing p_i and every parent before its children, so the first N pops
are themselves a tree, the best one of N nodes. Under the factorised draft distribution a round that
verifies them commits on average E(N) = 1 + p_1 + ... + p_N tokens, bonus included (docs/ddtree.md,
"A cost-aware budget"). With a measured cost curve the round keeps the N that maximises
E(N) / (round_us + verify_us(N + 1)), N taken from a fixed set of sizes (the engine captures one verify
graph per size). The choice only cuts the tree: every committed token is still the target's own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .tree import Tree

AUTO = "auto"
TIE = 1e-9      # rates this close are equal: engine and reference pick alike despite ~1e-12 log-prob noise


@dataclass(frozen=True)
class CostCurve:
    """The measured cost of a round on the target at hand, in microseconds.

    rows: verify rows (root + nodes), strictly increasing, >= 1; verify_us: the verify step's time at
    each (linear in between, flat beyond the ends); round_us: the rest of a round, taken as independent
    of N (drafter, top-k, tree build at the max budget, walk and commit).
    """
    rows: tuple[int, ...]
    verify_us: tuple[float, ...]
    round_us: float = 0.0

    def __post_init__(self) -> None:
        rows, us = self.rows, self.verify_us
        if not isinstance(rows, tuple) or not isinstance(us, tuple) or not rows or len(rows) != len(us):
            raise InputError(f"cost curve wants equally long non-empty rows and verify_us, got {rows!r}, "
                             f"{us!r}")
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in rows) or \
                any(b <= a for a, b in zip(rows, rows[1:], strict=False)):
            raise InputError(f"cost curve rows must be strictly increasing ints >= 1, got {list(rows)}")
        for name, vals in (("verify_us", us), ("round_us", (self.round_us,))):
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0
                   for v in vals):
                raise InputError(f"cost curve {name} must be finite numbers >= 0, got {vals!r}")
        if us[0] + self.round_us <= 0:
            raise InputError("cost curve: a round must cost more than 0 us")

    @property
    def max_budget(self) -> int:          # the largest tree it has measured (no extrapolation upwards)
        return self.rows[-1] - 1

    def verify(self, rows: Any) -> np.ndarray:
        """Interpolated verify time (us) at ``rows`` (array of root + nodes counts)."""
        return np.interp(np.asarray(rows, dtype=np.float64), self.rows, self.verify_us)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "verify_us": list(self.verify_us), "round_us": self.round_us}

    @classmethod
    def from_dict(cls, d: Any) -> CostCurve:
        if not isinstance(d, dict) or not {"rows", "verify_us"} <= d.keys() or \
                not d.keys() <= {"rows", "verify_us", "round_us"}:
            raise InputError("a cost curve is a JSON object with rows, verify_us (lists) and round_us")
        if not isinstance(d["rows"], list) or not isinstance(d["verify_us"], list):
            raise InputError("cost curve rows and verify_us must be lists")
        return cls(rows=tuple(d["rows"]), verify_us=tuple(d["verify_us"]), round_us=d.get("round_us", 0.0))


def load_cost_curve(spec: str | Path) -> CostCurve:
    """A cost curve from a JSON file: a curve object (``CostCurve.to_dict``), or ``RESULTS.json:MODEL``,
    the curve a ``bench pair --cost-aware`` result set measured for MODEL (its ``cost_curves``)."""
    path, model = Path(spec), None
    if not path.exists() and ":" in str(spec):
        head, model = str(spec).rsplit(":", 1)
        path = Path(head)
    try:
        d = json.loads(path.read_text())
    except OSError as e:
        raise InputError(f"cannot read cost curve {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"cost curve {path} is not JSON: {e}") from None
    if isinstance(d, dict) and "cost_curves" in d:
        curves = d["cost_curves"]
        if model not in curves:
            raise InputError(f"{path} holds cost curves for {', '.join(curves)}: give {path}:MODEL")
        d = curves[model]
    elif model is not None:
        raise InputError(f"{path} holds one cost curve, not one per model")
    return CostCurve.from_dict(d)


def expected_tokens(scores: np.ndarray) -> np.ndarray:
    """E(N) for N = 0 .. len(scores): 1 + the summed draft path probabilities of the first N pops.

    scores: [N] log q(path) of the nodes in pop order (``Tree.scores``). Returns [N + 1] float64.
    """
    p = np.exp(np.asarray(scores, dtype=np.float64))                         # [N]
    return 1.0 + np.concatenate([[0.0], np.cumsum(p)])                       # [N+1]


@dataclass(frozen=True)
class TreeBudget:
    """max_nodes: B >= 1, the heap's budget. cost: None, every round verifies the whole tree; a CostCurve,
    every round verifies the prefix of the pop order that ``choose`` picks among ``sizes``."""
    max_nodes: int
    cost: CostCurve | None = None

    def __post_init__(self) -> None:
        b = self.max_nodes
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1:
            raise InputError(f"budget must be an int >= 1, got {b!r}")
        if self.cost is not None and b > self.cost.max_budget:
            raise InputError(f"budget {b} exceeds the cost curve's largest measured tree "
                             f"({self.cost.max_budget} nodes)")

    @property
    def sizes(self) -> tuple[int, ...]:
        """The node counts a round may verify: (B,) for a fixed budget; powers of two below B, then B."""
        if self.cost is None:
            return (int(self.max_nodes),)
        return tuple(1 << i for i in range(int(self.max_nodes).bit_length()) if 1 << i < self.max_nodes) \
            + (int(self.max_nodes),)

    def choose(self, scores: np.ndarray) -> int:
        """N for a built tree whose pop-order scores are ``scores`` [n]: n for a fixed budget; else the
        candidate (a size below n, or n) with the most expected tokens per microsecond, ties to the larger."""
        n = len(scores)
        if self.cost is None or n == 0:
            return n
        cand = np.asarray([s for s in self.sizes if s < n] + [n])            # [C]
        rate = expected_tokens(scores)[cand] / (self.cost.round_us + self.cost.verify(cand + 1))
        return int(cand[np.flatnonzero(rate >= rate.max() * (1 - TIE))[-1]])

    @cached_property
    def host_cost(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float]:
        """``choose``'s inputs as the engine's compiled heap takes them (``engine.tree_host``): the
        candidate sizes (empty for a fixed budget), the curve's rows and verify_us, round_us and TIE."""
        if self.cost is None:
            return np.zeros(0, np.int64), np.zeros(1), np.zeros(1), 0.0, TIE
        c = self.cost
        return (np.asarray(self.sizes, np.int64), np.asarray(c.rows, np.float64),
                np.asarray(c.verify_us, np.float64), float(c.round_us), TIE)

    def cut(self, tree: Tree) -> Tree:
        """The tree this round verifies: the first ``choose(tree.scores)`` pops of ``tree``."""
        return tree.prefix(self.choose(tree.scores))


def tree_budget(budget: Any, cost_curve: Any = None) -> TreeBudget:
    """The one place a request's budget is read: an int B (fixed), ``"auto"`` with ``cost_curve`` (a
    CostCurve or a ``load_cost_curve`` spec; B = the curve's largest measured tree), or a TreeBudget."""
    if isinstance(budget, TreeBudget):
        if cost_curve is not None:
            raise InputError("give the cost curve inside the TreeBudget, not beside it")
        return budget
    if isinstance(budget, str) and budget == AUTO:
        if cost_curve is None:
            raise InputError("budget auto needs a cost curve (--cost-curve FILE)")
        curve = cost_curve if isinstance(cost_curve, CostCurve) else load_cost_curve(cost_curve)
        if curve.max_budget < 1:
            raise InputError("the cost curve measures no tree: its rows stop at 1 (the root alone)")
        return TreeBudget(curve.max_budget, curve)
    if cost_curve is not None:
        raise InputError(f"a cost curve goes with budget auto, got budget {budget!r}")
    return TreeBudget(budget)
