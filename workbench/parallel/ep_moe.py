"""The expert-parallel MoE block: one K2 MoE layer over P ranks of torch.distributed (all-to-all).

Legend: P ranks, r this rank, E routed experts, El = E / P per rank, K experts per token, Kl = min(K, El)
slots a row carries to one rank, T rows of the step (1 for decode, N + 1 for a tree verify), To = the
rows rank r owns (t % P == r, ``ExpertSplit.owned_rows``), S rows it sends, R rows it receives, D width.

Attention stays replicated: every rank holds all residual rows h [T, D] and the block's input
x = ffn_norm(h) [T, D], and leaves every rank with the same h += moe(x), so the next replicated
attention can run. Within the block the rows are owned (data-parallel style); per step:

1. router   each owner routes its To rows with the ops router kernel (``ops.moe``'s own, noaux_tc):
            ids, weights [To, K]. The routing travels with the rows, so ranks need not agree on it.
2. dispatch a row goes once to every rank holding at least one of its K experts (deduplicated per
            destination, as DeepEP does), with Kl slots: the experts on that rank first, as local ids
            (global - r El), the rest masked (id El, weight 0; fused_moe drops ids outside [0, El)).
            The row counts go first (all_to_all_single of P int64), then one all_to_all_single of
            rows [S, 2D + 8Kl] bytes: f16(x) (what fused_moe reads), int32 ids, float32 weights.
3. local    each rank runs ``ops.experts_fused`` (fused_moe) on its El experts over the R rows it got,
            their slots cut to the most any row has here (``live_slots``): the weighted sum of the
            row's local experts, float32 [R, D].
4. combine  those partial sums go back to the owners (all_to_all_single, the reverse splits), which
            add them in rank order (a fixed order: no atomics).
5. shared   the owner adds the shared expert of its rows (``ops.swiglu``; replicated weights).
6. gather   one all_gather of the owners' rows, each padded to ceil(T / P), restores y [T, D] on every
            rank; h += y.

The kernels read torch tensors through ``kview`` (numpy views under the simulator, numba device arrays
on a GPU, launched on torch's current stream, so NCCL and the kernels stay ordered). A ``PhaseTimer``
passed to ``__call__`` is marked after each phase; nothing else depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from kernels_numba import ops
from kernels_numba.device import SIMULATED, default_stream

from ..config import ConfigError, check_int
from ..errors import InputError
from .experts import ExpertSplit


def kview(t):
    """A contiguous torch tensor as the kernels take it (shares memory)."""
    if SIMULATED:
        return t.numpy()
    from numba import cuda
    return cuda.as_cuda_array(t, sync=False)


def _shape(a) -> tuple:
    return tuple(np.asarray(a).shape) if SIMULATED else tuple(a.shape)


@dataclass(frozen=True)
class EPWeights:
    """One MoE layer as rank ``rank`` of ``split`` holds it: the router (replicated), its El experts
    (``prepare_moe`` of experts ``split.experts(rank)``, no shared expert inside) and the shared expert."""
    split: ExpertSplit
    rank: int
    router: ops.Router
    local: ops.MoEWeights
    shared: ops.SwiGLU | None
    dim: int

    @property
    def slots(self) -> int:
        return min(self.router.top_k, self.split.per_rank)


def ep_weights(split: ExpertSplit, rank: int, router: ops.Router, local: ops.MoEWeights,
               shared: ops.SwiGLU | None = None) -> EPWeights:
    """Checked ``EPWeights`` (ConfigError where the parts do not fit the split or each other)."""
    split.check_rank(rank)
    if not isinstance(local, ops.MoEWeights):
        raise ConfigError("local experts must be a MoEWeights (prepare_moe of this rank's experts)")
    if local.n_routed != split.per_rank or local.n_shared:
        raise ConfigError(f"rank {rank} holds {local.n_routed} routed + {local.n_shared} shared experts; "
                          f"the split gives it {split.per_rank} routed and no shared")
    d = local.w13.k
    e = _shape(router.gate_t)[1]
    if e != split.n_experts or _shape(router.gate_t)[0] != d:
        raise ConfigError(f"router gate {_shape(router.gate_t)} does not match D={d}, E={split.n_experts}")
    if shared is not None and shared.dim != d:
        raise ConfigError(f"shared expert of width {shared.dim}, experts of width {d}")
    return EPWeights(split, rank, router, local, shared, d)


@dataclass(frozen=True)
class Plan:
    """Where an owner's rows go: row ``row[j]`` to rank ``dest[j]`` (sorted by rank, then row) with
    slots ``ids[j]`` / ``wts[j]`` [S, Kl]; ``counts`` [P] rows per rank."""
    dest: Any
    row: Any
    ids: Any
    wts: Any
    counts: Any


def dispatch_plan(ids, wts, split: ExpertSplit) -> Plan:
    """The dispatch of rows routed to global experts ``ids`` [To, K] with weights ``wts`` [To, K]."""
    import torch
    el, p, k = split.per_rank, split.world, ids.shape[1]
    kl = min(k, el)
    dest = ids.long() // el                                                      # [To, K] rank of each slot
    hit = torch.zeros(ids.shape[0], p, dtype=torch.bool, device=ids.device)
    hit.scatter_(1, dest, True)                                                  # [To, P]
    q, o = hit.t().nonzero(as_tuple=True)                                        # [S] by rank, then row
    mine = dest[o] == q[:, None]                                                 # [S, K]
    first = torch.argsort((~mine).to(torch.int8), dim=1, stable=True)[:, :kl]    # local slots first
    lid = torch.where(mine, ids[o].long() - q[:, None] * el, el).gather(1, first).to(torch.int32)
    lw = torch.where(mine, wts[o], torch.zeros_like(wts[o])).gather(1, first)
    return Plan(q, o, lid.contiguous(), lw.contiguous(), hit.sum(0))


def live_slots(ids, wts, el: int):
    """Received slots ``ids`` / ``wts`` [R, Kl] cut to the most local experts any of the R rows has on
    this rank: local slots come first, so every column past that is masked in every row, and fused_moe
    runs each masked pair at a whole expert's cost (it reads expert 0 and drops the result)."""
    m = int((ids < el).sum(1).max()) if len(ids) else 0
    return ids[:, :m].contiguous(), wts[:, :m].contiguous()


class EPMoE:
    """The host wrapper: ``block(h, x)`` does h [T, D] += moe(x [T, D]) on this rank (module docstring);
    float32 torch tensors on ``device``, 1 <= T <= max_rows, every rank calling with the same T."""

    def __init__(self, w: EPWeights, max_rows: int, device: str = "cpu", group=None) -> None:
        import torch
        import torch.distributed as dist
        if not dist.is_initialized():
            raise ConfigError("EPMoE needs an initialised torch.distributed process group")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if world != w.split.world or rank != w.rank:
            raise ConfigError(f"weights for rank {w.rank} of {w.split.world}, but this is rank {rank} of "
                              f"{world}")
        check_int("max_rows", max_rows, 1)
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:      # tensors report cuda:N, never plain cuda
            dev = torch.device("cuda", torch.cuda.current_device())
        self.w, self.max_rows, self.device, self.group = w, max_rows, dev, group
        to, d, k = w.split.rows_per_rank(max_rows), w.dim, w.router.top_k
        self.xo = torch.zeros(to, d, dtype=torch.float32, device=self.device)    # [To, D] owned rows of x
        self.ids = torch.zeros(to, k, dtype=torch.int32, device=self.device)    # [To, K] their routing
        self.wts = torch.zeros(to, k, dtype=torch.float32, device=self.device)
        self.meta = torch.zeros(8, dtype=torch.int32, device=self.device)       # meta[1] = live rows
        self.scratch = ops.Scratch(to, [w.shared] if w.shared is not None else [], [], routers=(w.router,))
        self._ws: dict[int, Any] = {}
        self.last: SimpleNamespace | None = None

    def workspace(self, n: int, m: int):
        """fused_moe's workspace for n received rows of m live slots (made on first use, then reused)."""
        if (n, m) not in self._ws:
            self._ws[n, m] = ops.moe_workspace(n, m, self.w.local)
        return self._ws[n, m]

    def _check(self, h, x) -> int:
        import torch
        for name, a in (("h", h), ("x", x)):
            if not isinstance(a, torch.Tensor) or a.dtype != torch.float32 or a.ndim != 2 \
                    or a.shape[1] != self.w.dim or not a.is_contiguous() or a.device != self.device:
                raise InputError(f"{name} must be a contiguous float32 [T, {self.w.dim}] tensor on "
                                 f"{self.device}, got {getattr(a, 'dtype', type(a).__name__)} "
                                 f"{tuple(getattr(a, 'shape', ()))} on {getattr(a, 'device', '?')}")
        t = h.shape[0]
        if x.shape[0] != t or not 1 <= t <= self.max_rows:
            raise InputError(f"h and x must have the same 1..{self.max_rows} rows, got {t} and {x.shape[0]}")
        return t

    def __call__(self, h, x, timer=None) -> None:
        import torch
        import torch.distributed as dist
        t = self._check(h, x)
        w, sp, g = self.w, self.w.split, self.group
        p, r, d, kl = sp.world, w.rank, w.dim, w.slots
        s = default_stream()
        mark = timer.mark if timer is not None else (lambda _name: None)
        to = len(sp.owned_rows(t, r))
        xo, ids, wts = self.xo[:to], self.ids[:to], self.wts[:to]
        if to:
            xo.copy_(x[r::p])
            self.meta[1] = to
            ops.route(kview(ids), kview(wts), kview(xo), w.router, self.scratch, kview(self.meta), to, s)
        mark("router")

        plan = dispatch_plan(ids, wts, sp)
        rows = torch.cat([xo[plan.row].half().view(torch.uint8), plan.ids.view(torch.uint8),
                          plan.wts.view(torch.uint8)], dim=1)                   # [S, 2D + 8Kl]
        counts = torch.empty_like(plan.counts)
        dist.all_to_all_single(counts, plan.counts, group=g)
        sent, got = plan.counts.tolist(), counts.tolist()
        n = sum(got)
        recv = torch.empty(n, rows.shape[1], dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(recv, rows, got, sent, group=g)
        mark("dispatch")

        yr = torch.empty(n, d, dtype=torch.float32, device=self.device)           # [R, D] local partial sums
        lid = recv[:, 2 * d:2 * d + 4 * kl].contiguous().view(torch.int32)       # [R, Kl]
        if n:
            x16 = recv[:, :2 * d].contiguous().view(torch.float16)
            lid, lw = live_slots(lid, recv[:, 2 * d + 4 * kl:].contiguous().view(torch.float32), sp.per_rank)
            ops.experts_fused(kview(x16), kview(lid), kview(lw), w.local, kview(yr),
                              self.workspace(n, lid.shape[1]), s)
        mark("local_moe")

        back = torch.empty(len(plan.row), d, dtype=torch.float32, device=self.device)
        dist.all_to_all_single(back, yr, sent, got, group=g)
        part = torch.zeros(to, p, d, dtype=torch.float32, device=self.device)   # [To, P, D]
        part[plan.row, plan.dest] = back
        yo = part.sum(dim=1).contiguous()                                        # [To, D], ranks in order
        mark("combine")

        if to and w.shared is not None:
            ops.swiglu(kview(yo), kview(xo), w.shared, self.scratch, kview(self.meta), to, s)
        mark("shared")

        tp = sp.rows_per_rank(t)
        pad = torch.zeros(tp, d, dtype=torch.float32, device=self.device)
        pad[:to] = yo
        full = torch.empty(p * tp, d, dtype=torch.float32, device=self.device)
        _all_gather(full, pad, g)
        h += full.view(p, tp, d).transpose(0, 1).reshape(p * tp, d)[:t]          # row t = (t // P, t % P)
        mark("gather")
        self.last = SimpleNamespace(rows=t, sent=sent, got=got, slots=kl, row_bytes=rows.shape[1],
                                    local_ids=lid)


def _all_gather(out, inp, group) -> None:
    import torch.distributed as dist
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)
