"""How a MoE layer's experts and a step's tokens split over P ranks.

Legend: E routed experts, P ranks (world size), El = E / P experts per rank, T rows of a step.
Rank r holds the contiguous experts [r El, (r + 1) El) and owns the rows t with t % P == r (the
rows whose MoE output it assembles, as data-parallel attention ranks own their requests).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ConfigError, check_int


@dataclass(frozen=True)
class ExpertSplit:
    """E experts over P ranks, El = E / P each (ConfigError unless 1 <= P <= E and P divides E)."""
    n_experts: int
    world: int

    def __post_init__(self) -> None:
        check_int("n_experts", self.n_experts, 1)
        check_int("world size", self.world, 1)
        if self.world > self.n_experts:
            raise ConfigError(f"world size {self.world} exceeds the {self.n_experts} experts")
        if self.n_experts % self.world:
            raise ConfigError(f"{self.n_experts} experts do not split evenly over {self.world} ranks")

    @property
    def per_rank(self) -> int:
        return self.n_experts // self.world

    def check_rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world:
            raise ConfigError(f"rank {rank!r} outside 0..{self.world - 1}")
        return rank

    def experts(self, rank: int) -> range:
        """The global ids of rank ``rank``'s experts (local id = global id - start)."""
        r = self.check_rank(rank)
        return range(r * self.per_rank, (r + 1) * self.per_rank)

    def owned_rows(self, rows: int, rank: int) -> range:
        """The rows of a ``rows``-row step that rank ``rank`` owns: rank, rank + P, ..."""
        return range(self.check_rank(rank), rows, self.world)

    def rows_per_rank(self, rows: int) -> int:
        """The most rows any rank owns: ceil(T / P) (the all-gather's padded block)."""
        return -(-rows // self.world)
