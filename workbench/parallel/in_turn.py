"""One MoE layer's expert-parallel split with every rank on this one device, one rank after another.

Legend: as ``ep_moe``: P ranks, E routed experts, El = E / P per rank, K experts per token,
Kl = min(K, El) slots a row carries, T rows of the step, R_q rows rank q receives, D width.

``EPMoE`` runs on P processes joined by a process group. This runs here, without one, what each of
them would run in its local phase: the T rows are routed once, ``dispatch_plan`` (every row owned by
one rank) says which rows each rank receives with which local slots, rank q's fused_moe runs on its
El experts (``MoEWeights.routed``: views of the whole layer's stack, no copy) over its R_q rows, and
``combine`` adds the partial sums back in rank order, as the owners do. Nothing crosses a link, so it
checks the split at full size on one GPU and times each rank's share of the experts; what the
dispatch and combine cost between GPUs it cannot say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernels_numba import ops

from ..config import ConfigError
from ..errors import InputError
from .ep_moe import dispatch_plan, kview, live_slots
from .experts import ExpertSplit


@dataclass(frozen=True)
class Share:
    """What rank ``rank`` receives: ``rows`` [R] (indices into the step's T rows), their f16 inputs
    ``x16`` [R, D] and local slots ``ids`` / ``wts`` [R, m] (``live_slots``: m <= Kl); ``out`` [R, D]
    float32 holds its partial sums after ``run``. ``experts``: its El experts."""
    rank: int
    rows: Any
    x16: Any
    ids: Any
    wts: Any
    experts: ops.MoEWeights
    out: Any
    workspace: Any

    @property
    def distinct(self) -> int:
        """Distinct local experts this share runs (masked slots carry the id El)."""
        import torch
        live = self.ids[self.ids < self.experts.n_routed]
        return int(torch.unique(live).numel())


def shares(x, ids, wts, experts: ops.MoEWeights, split: ExpertSplit) -> list[Share]:
    """Every rank's share of a step: x [T, D] float32, its routing ``ids`` int32 / ``wts`` float32
    [T, K] (global expert ids), ``experts`` the layer's E routed experts (torch tensors on one device)."""
    import torch
    if experts.n_routed != split.n_experts or experts.n_shared:
        raise ConfigError(f"{experts.n_routed} routed + {experts.n_shared} shared experts, but the split is "
                          f"of {split.n_experts} routed experts")
    t, d = x.shape
    if x.dtype != torch.float32 or d != experts.w13.k or ids.shape != wts.shape or ids.shape[0] != t:
        raise InputError(f"x must be float32 [T, {experts.w13.k}] with ids / wts [T, K], got {x.dtype} "
                         f"{tuple(x.shape)}, {tuple(ids.shape)}, {tuple(wts.shape)}")
    plan = dispatch_plan(ids, wts, split)
    x16 = x.half()
    out = []
    for q in range(split.world):
        sel = plan.dest == q
        rows = plan.row[sel]
        w = experts.routed(split.experts(q))
        lid, lw = live_slots(plan.ids[sel], plan.wts[sel], split.per_rank)
        r = len(rows)
        out.append(Share(q, rows, x16[rows].contiguous(), lid, lw, w,
                         torch.empty(r, d, dtype=torch.float32, device=x.device),
                         ops.moe_workspace(r, lid.shape[1], w) if r else None))
    return out


def run(share: Share, stream=0) -> None:
    """Rank ``share.rank``'s local phase: fused_moe on its experts over the rows it receives."""
    if len(share.rows):
        ops.experts_fused(kview(share.x16), kview(share.ids), kview(share.wts), share.experts,
                          kview(share.out), share.workspace, stream)


def combine(parts: list[Share], t: int):
    """y [T, D] float32: the shares' partial sums added to their rows, rank after rank."""
    import torch
    d = parts[0].out.shape[1]
    y = torch.zeros(t, d, dtype=torch.float32, device=parts[0].out.device)
    for s in parts:                              # a row appears once per share: no two adds race
        y.index_add_(0, s.rows, s.out)
    return y
